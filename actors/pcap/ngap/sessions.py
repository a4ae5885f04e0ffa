"""The two summaries: per UE context (`ue_sessions`) and per PDU session establishment (`pdu_sessions`)."""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap.answer_types import PduSessionsAnswer, UeSessionsAnswer
from diagd.actors.pcap.ngap.associations import Analysis, Association, Context, step
from diagd.actors.pcap.ngap.codes import (
    NAS_DL_TRANSPORT,
    NAS_ESTABLISHMENT_ACCEPT,
    NAS_ESTABLISHMENT_REJECT,
    NAS_ESTABLISHMENT_REQUEST,
    NAS_FAILURE_MESSAGES,
    NAS_REGISTRATION_ACCEPT,
    NAS_REGISTRATION_REJECT,
    NAS_REGISTRATION_REQUEST,
    NAS_RELEASES,
    NAS_TMSI_ASSIGNERS,
    NORMAL_5GSM_RELEASE_CAUSES,
    PROC_INITIAL_CONTEXT_SETUP,
    PROC_PDU_SESSION_SETUP,
)
from diagd.actors.pcap.ngap.failures import pdu_failures
from diagd.actors.pcap.ngap.model import Model
from diagd.actors.pcap.ngap.paging import answered
from diagd.actors.pcap.ngap.pdus import (
    ADDITIONAL_DL_TUNNEL,
    ADDITIONAL_UL_TUNNEL,
    DL_TUNNEL,
    UL_TUNNEL,
    NasMessage,
    NgapPdu,
    SessionItem,
)
from diagd.actors.pcap.ngap.procedures import Instance
from diagd.actors.pcap.ngap.rules import RULES

# What ends a registration (rules.TABLE: accept, reject, authentication reject).
REGISTRATION_ENDS = {NAS_REGISTRATION_ACCEPT, NAS_REGISTRATION_REJECT, "0x58"}


def _unanswered(pending: dict[int, list[NgapPdu]], assoc: Association
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(failures, still pending at capture end) for class-1 requests that got no outcome.

    A request is a failure only when its association carried later NGAP traffic: the capture was
    still running and the peer still talking. One at the very end may just be cut off.
    """
    failures, open_ = [], []
    last = assoc.pdus[-1]
    for requests in pending.values():
        for pdu in requests:
            entry = {"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                     "procedure": pdu.procedure}
            if last.frame > pdu.frame:
                failures.append({**entry, "why": f"no response to {pdu.procedure} request (the association "
                                 f"carried NGAP until frame {last.frame}, {round(last.time - pdu.time, 6)} s later)"})
            else:
                open_.append({**entry, "why": "capture ends before any response could be seen"})
    return failures, open_


def ue_sessions(model: Model, filtered: bool = False) -> UeSessionsAnswer:
    analysis, pdus = model.analysis, model.pdus
    ues = []
    for n, (ctx, found) in enumerate(model.by_context):
        ues.append({**_describe_context(ctx, analysis, found, model.orphans[n] if n < len(model.orphans) else []),
                    "pagings": answered(model.non_ue, ctx)})
    failed = [{"ue": u["ue"], "association": u["association"], "amf_ue_ngap_id": u["amf_ue_ngap_id"],
               "ran_ue_ngap_id": u["ran_ue_ngap_id"],
               "reasons": [{k: f.get(k) for k in ("frame", "kind", "code", "cause", "why")} for f in u["failures"]]}
              for u in ues if u["failures"]]
    associations = []
    non_ue_failures: list[dict[str, Any]] = []
    for assoc in analysis.associations:
        failures, open_ = _unanswered(assoc.pending, assoc)
        non_ue_failures.extend({"association": assoc.label, **f} for f in [*assoc.failures, *failures])
        associations.append({**assoc.describe(), "ue_contexts": sum(1 for c in analysis.contexts if c.assoc is assoc),
                             "procedures": assoc.procedures, "pending_requests": open_})
    groups: dict[int, dict[str, Any]] = {}
    for link in analysis.links:
        group = analysis.groups[link["from"].number]
        entry = groups.setdefault(group, {"group": group, "ues": [], "evidence": []})
        entry["evidence"].append({"ue": link["to"].label, "linked_to": link["from"].label,
                                  "evidence": link["evidence"], "frames": link["frames"]})
    for ctx in analysis.contexts:
        if ctx.number in analysis.groups:
            groups[analysis.groups[ctx.number]]["ues"].append(ctx.label)
    warnings = list(analysis.warnings)
    if filtered:
        warnings.append("display_filter given: contexts, links and unanswered requests are judged on the "
                        "filtered NGAP frames only")
    result: UeSessionsAnswer = {
        "ue_count": len(ues), "ues": ues, "failed_ues": failed, "associations": associations,
        "linked_ue_groups": sorted(groups.values(), key=lambda g: int(g["group"])),
        "not_linked": analysis.unlinked,
        "non_ue_failures": non_ue_failures, "ngap_pdus": len(pdus), "warnings": warnings,
    }
    if not ues:
        result["reason"] = ("no UE-associated NGAP PDU (only non-UE procedures such as NGSetup)" if pdus
                            else "no NGAP over SCTP in the capture" + (" that matches the display filter"
                                                                       if filtered else ""))
    return result


def _registration(found: list[Instance], orphans: list[tuple[str, str]]) -> str:
    """The context's registration state, from the model's Registration / Deregistration outcomes (and,
    when no Registration instance is in the capture, a registration answer whose request is not)."""
    state = "unknown"
    for procedure, rule_id in orphans:
        if procedure == "Registration":
            state = {"success": "accepted", "reject": "rejected"}.get(RULES[rule_id].outcome, state)
    for i in found:
        if i.procedure.name == "Registration":
            state = {"success": "accepted", "reject": "rejected", "failure": "failed"}.get(i.outcome or "", "pending")
        elif i.procedure.name == "Deregistration" and state != "rejected":
            state = "deregistered"
    return state


def _describe_context(ctx: Context, analysis: Analysis, found: list[Instance],
                      orphans: list[tuple[str, str]]) -> dict[str, Any]:
    failures: list[dict[str, Any]] = []
    nas_messages_: list[dict[str, Any]] = []
    suci_msin = tmsi = None
    plmn = None
    waiting_registration: NasMessage | None = None
    for pdu in ctx.pdus:
        failures.extend(pdu_failures(pdu))
        for message in pdu.nas:
            nas_messages_.append({"frame": pdu.frame, "layer": message.layer, "code": message.code,
                                  "message": message.message})
            suci_msin = suci_msin or message.first("nas_5gs.mm.suci.msin")
            if message.code in NAS_TMSI_ASSIGNERS:
                tmsi = message.first("nas_5gs.5g_tmsi") or tmsi
            if plmn is None and message.first("nas_5gs.mm.suci.msin") and message.first("e212.mcc"):
                plmn = {"mcc": message.first("e212.mcc"), "mnc": message.first("e212.mnc")}
            if message.code == NAS_REGISTRATION_REQUEST:
                waiting_registration = message
            elif message.code in REGISTRATION_ENDS:
                waiting_registration = None
    unanswered, open_ = _unanswered(ctx.pending, ctx.assoc)
    failures.extend(unanswered)
    if waiting_registration is not None and ctx.assoc.pdus[-1].frame > waiting_registration.frame:
        failures.append({"frame": waiting_registration.frame, "kind": "5GMM", "code": None, "cause": None,
                         "message": waiting_registration.message,
                         "why": "registration request never accepted or rejected (the association carried later "
                                "NGAP)"})
    failures.sort(key=lambda f: int(f["frame"]))
    first, last = ctx.pdus[0].time, ctx.pdus[-1].time
    return {
        "ue": ctx.label, "association": ctx.assoc.label, "gnb": ctx.assoc.gnb, "amf": ctx.assoc.amf,
        "ran_ue_ngap_id": ctx.ran, "amf_ue_ngap_id": ctx.amf,
        **({"amf_ue_ngap_ids": ctx.amf_ids} if len(ctx.amf_ids) > 1 else {}),
        "suci_msin": suci_msin, "5g_tmsi": tmsi, "plmn": plmn,
        "first_time": round(first, 6), "last_time": round(last, 6), "duration_s": round(last - first, 6),
        "frames": list(dict.fromkeys(p.frame for p in ctx.pdus)),
        "procedures": [step(p) for p in ctx.pdus], "nas_messages": nas_messages_,
        "failures": failures, "pending_requests": open_, "registration": _registration(found, orphans),
        "outcomes": [{"procedure": i.procedure.name, **({"pdu_session_id": i.psi} if i.procedure.per_session else {}),
                      "first_frame": i.first.frame, "outcome": i.outcome, "rule": i.rule.text if i.rule else None}
                     for i in found],
        "ended": ctx.closed, "linked_group": analysis.groups.get(ctx.number),
    }


class _Sessions:
    """PDU session establishments as the PDUs of each UE context reveal them, in capture order."""

    def __init__(self) -> None:
        self.sessions: list[dict[str, Any]] = []
        self.current: dict[tuple[int, int], dict[str, Any]] = {}
        self.counts: dict[tuple[int, int], int] = {}
        self.unmatched: list[int] = []  # setup responses answering no request seen in the capture

    def new(self, ctx: Context, psi: int, frame: int) -> dict[str, Any]:
        key = (ctx.number, psi)
        self.counts[key] = self.counts.get(key, 0) + 1
        s: dict[str, Any] = {
            "ue": ctx.label, "association": ctx.assoc.label, "ran_ue_ngap_id": ctx.ran,
            "amf_ue_ngap_id": ctx.amf, "pdu_session_id": psi, "establishment": self.counts[key],
            "first_frame": frame, "establishment_request_frame": None, "dnn": None, "s_nssai": None,
            "establishment_accept_frame": None, "accept_in_n2_setup": False, "ue_ipv4": None,
            "establishment_reject_frame": None, "setup_request_frame": None, "setup_response_frame": None,
            "setup_result": None, "n3_uplink": None, "n3_downlink": None, "qfis": [], "failures": [],
            "returned_by_amf_frame": None, "release": None, "status": "unknown",
        }
        self.sessions.append(s)
        self.current[key] = s
        return s

    def session(self, ctx: Context, psi: int, frame: int) -> dict[str, Any]:
        return self.current.get((ctx.number, psi)) or self.new(ctx, psi, frame)

    def nas(self, ctx: Context, pdu: NgapPdu, message: NasMessage, carrier: NasMessage | None = None) -> None:
        """One NAS message; `carrier` is the UL/DL NAS TRANSPORT around a 5GSM one, whose own optional
        IEs (DNN, S-NSSAI: TS 24.501 8.2.10 / 8.2.11) name the session the 5GSM message is about."""
        psi = message.psi
        if message.code == NAS_DL_TRANSPORT and message.cause is not None and psi is not None:
            s = self.session(ctx, psi, pdu.frame)
            s["returned_by_amf_frame"] = pdu.frame
            s["failures"].append({"frame": pdu.frame, "kind": "5GMM", "code": message.cause,
                                  "cause": message.cause_text, "message": message.message})
        if message.layer != "5GSM" or psi is None or message.returned:  # handed back: not a new message
            return
        if message.code == NAS_ESTABLISHMENT_REQUEST:
            s = self.new(ctx, psi, pdu.frame)
            s["establishment_request_frame"] = pdu.frame
            s["dnn"] = message.first("nas_5gs.cmn.dnn") or (carrier.first("nas_5gs.cmn.dnn") if carrier else None)
        else:
            s = self.session(ctx, psi, pdu.frame)
        if message.code == NAS_ESTABLISHMENT_ACCEPT:
            s["establishment_accept_frame"] = pdu.frame
            s["accept_in_n2_setup"] = pdu.initiating and pdu.procedure_code in N2_SETUPS
            s["ue_ipv4"] = message.first("nas_5gs.sm.pdu_addr_inf_ipv4")
            s["dnn"] = message.first("nas_5gs.cmn.dnn") or s["dnn"]  # the DNN granted, else the one requested
        elif message.code == NAS_ESTABLISHMENT_REJECT:
            s["establishment_reject_frame"] = pdu.frame
        elif message.code in NAS_RELEASES or message.code == "0xd4":
            release = s["release"] = s["release"] or {}
            release[{"0xd1": "request_frame", "0xd3": "command_frame", "0xd4": "complete_frame"}[
                message.code]] = pdu.frame
            if message.cause is not None:
                release.update(cause=message.cause, cause_text=message.cause_text,
                               normal=message.cause in NORMAL_5GSM_RELEASE_CAUSES)
        if s["s_nssai"] is None:
            s["s_nssai"] = _nas_s_nssai(message, carrier)
        if message.code in NAS_FAILURE_MESSAGES or (message.code in NAS_RELEASES and message.cause is not None
                                                    and message.cause not in NORMAL_5GSM_RELEASE_CAUSES):
            s["failures"].append({"frame": pdu.frame, "kind": "5GSM", "code": message.cause,
                                  "cause": message.cause_text, "message": message.message})

    def item(self, ctx: Context, pdu: NgapPdu, item: SessionItem) -> None:
        if item.role == "setup-request":
            s = self.session(ctx, item.psi, pdu.frame)
            if s["setup_request_frame"] is not None and s["setup_result"] is not None:
                return  # a later user-plane (re)activation of an established session, not its establishment
            s["setup_request_frame"] = pdu.frame
            s["n3_uplink"] = item.tunnel(UL_TUNNEL)
            _additional(s, "n3_uplink_additional", item.tunnels_at(ADDITIONAL_UL_TUNNEL))
            s["qfis"] = sorted({int(q) for q in item.values.get("ngap.qosFlowIdentifier", [])})
            if item.first("ngap.sST"):
                s["s_nssai"] = {"sst": item.first("ngap.sST"), "sd": item.first("ngap.sD")}
        elif item.role in ("setup-ok", "setup-failed"):
            found = self.current.get((ctx.number, item.psi))
            if found is None or found["setup_request_frame"] is None or found["setup_response_frame"] is not None:
                self.unmatched.append(pdu.frame)  # answers no request seen in the capture: it opens no session
                return
            s = found
            s["setup_response_frame"] = pdu.frame
            s["setup_result"] = "setup" if item.role == "setup-ok" else "failed"
            if item.role == "setup-ok":
                s["n3_downlink"] = item.tunnel(DL_TUNNEL)
                _additional(s, "n3_downlink_additional", item.tunnels_at(ADDITIONAL_DL_TUNNEL))
            else:
                s["failures"].append({k: v for k, v in (item.cause or {"frame": pdu.frame, "kind": "NGAP",
                                                                       "code": None, "cause": None}).items()
                                      if k != "pdu_session_id"})


def _additional(s: dict[str, Any], key: str, tunnels: list[dict[str, str | None]]) -> None:
    """A session's additional N3 tunnels (multi-connectivity: AdditionalUL-NGU-UP-TNLInformation,
    additionalDLQosFlowPerTNLInformation), under `key` only when its N2 setup listed some."""
    if tunnels:
        s[key] = tunnels
    else:
        s.pop(key, None)


def _nas_s_nssai(message: NasMessage, carrier: NasMessage | None) -> dict[str, str | None] | None:
    """The S-NSSAI a 5GSM message or its UL NAS Transport names, as NGAP prints one (SST 1 octet, SD 3, hex)."""
    for source in (message, carrier):
        if source is not None and (sst := source.first("nas_5gs.mm.sst")) is not None:
            sd = source.first("nas_5gs.mm.mm_sd")
            return {"sst": f"{int(sst, 0):02x}", "sd": f"{int(sd, 0):06x}" if sd is not None else None}
    return None


def pdu_sessions(model: Model, filtered: bool = False) -> PduSessionsAnswer:
    analysis = model.analysis
    found = _Sessions()
    for pdu in analysis.pdus:
        ctx = analysis.owner.get(id(pdu))
        if ctx is None:
            continue
        carrier = None
        for message in pdu.nas:  # outer before inner: a transport comes before the 5GSM message it carries
            if message.layer == "5GMM" and message.code in NAS_TRANSPORTS:
                carrier = message
            found.nas(ctx, pdu, message, carrier if message.layer == "5GSM" else None)
        if pdu.procedure_code not in N2_SETUPS:
            # The setup lists belong to these two procedures (TS 38.413 9.2.1.1-2, 9.2.2.1-3); in another
            # message they are IEs it does not define (not comprehended, clause 10): nothing is set up.
            continue
        for item in pdu.items:
            found.item(ctx, pdu, item)
    return _sessions_result(model, found.sessions, found.unmatched, filtered)


def _sessions_result(model: Model, sessions: list[dict[str, Any]], unmatched: list[int],
                     filtered: bool) -> PduSessionsAnswer:
    analysis, pdus = model.analysis, model.pdus
    context_failures = {c.number: [f for p in c.pdus for f in pdu_failures(p)] for c in analysis.contexts}
    by_label = {c.label: c for c in analysis.contexts}
    until: dict[int, int | None] = {}  # each entry's re-activations: up to the next entry of its session
    next_entry: dict[tuple[str, int], int] = {}
    for s in sorted(sessions, key=lambda s: -int(s["first_frame"])):
        until[id(s)] = next_entry.get((s["ue"], s["pdu_session_id"]))
        next_entry[(s["ue"], s["pdu_session_id"])] = int(s["first_frame"])
    for s in sessions:
        _verdict(s, model, by_label[s["ue"]], until[id(s)])
        if s["status"] == "no_answer":
            # No 5GSM answer; what the UE context reported next is the likely reason (e.g. a 5GMM status).
            later = [f for f in context_failures[by_label[s["ue"]].number]
                     if int(f["frame"]) > int(s["establishment_request_frame"])]
            if later:
                f = later[0]
                s["hint"] = f"the UE context reported {f.get('message') or f.get('procedure')} " \
                            f"(cause {f['code']}: {f['cause']}) in frame {f['frame']} after this request"
    sessions.sort(key=lambda s: (int(s["first_frame"]), s["ue"], int(s["pdu_session_id"])))
    established = [s for s in sessions if s["status"] == "established"]
    rejected = [s for s in sessions if s["status"] in ("rejected", "setup_failed")]
    result: PduSessionsAnswer = {
        "session_count": len(sessions), "established_count": len(established), "rejected_count": len(rejected),
        "reactivation_count": sum(len(s["reactivations"]) for s in sessions),
        "failed_count": sum(1 for s in sessions if s["status"] == "failed"),
        "sessions": sessions, "rejected": rejected,
        "incomplete": [{"ue": s["ue"], "pdu_session_id": s["pdu_session_id"], "status": s["status"]}
                       for s in sessions if s["status"] not in FINISHED],
        "warnings": list(analysis.warnings) + (
            ["display_filter given: sessions are built from the filtered NGAP frames only"] if filtered else []) + (
            [f"N2 PDU session setup responses without a request in the capture (frames {unmatched[:20]}): ignored"]
            if unmatched else []),
    }
    if not sessions:
        result["reason"] = ("no NGAP over SCTP in the capture" + (" that matches the display filter" if filtered
                                                                    else "") if not pdus else
                            "no PDU session establishment (5GSM) and no N2 PDU session resource setup in the NGAP "
                            "PDUs" + ("; NAS did not decode, see warnings" if any(p.nas_undecoded for p in pdus)
                                      else ""))
    return result


def _verdict(s: dict[str, Any], model: Model, ctx: Context, until: int | None) -> None:
    """The session's outcome, rule and status: those of its establishment instance in the model (or, for a session
    seen only re-activated, of its re-activation); `reactivations`: the model's re-activations of it before `until`."""
    request = s["establishment_request_frame"]
    instance = model.establishment(ctx, s["pdu_session_id"], request) if request is not None else None
    again = model.reactivations(ctx, s["pdu_session_id"])
    s["reactivations"] = [_reactivation(i) for i in again
                          if s["first_frame"] <= i.first.frame and (until is None or i.first.frame < until)]
    opened_by = next((i for i in again if i.first.frame == s["setup_request_frame"]), None)
    if instance is None and request is None and s["establishment_accept_frame"] is None and opened_by is not None:
        # Seen only as an N2 setup of a session established before the capture: a user-plane re-activation
        # (TS 24.501 5.6.1.4), judged by its own instance, never an establishment left incomplete.
        rule_id = opened_by.rule.id if opened_by.rule else ""
        s.update(outcome=opened_by.outcome, rule=opened_by.rule.text if opened_by.rule else None,
                 rule_id=rule_id or None, cause=opened_by.cause,
                 status=REACTIVATION_STATUS.get(rule_id, "reactivation_no_response"))
        if opened_by.why:
            s["why"] = opened_by.why
        return
    if instance is None:
        # Its request is not in the capture (it started later): no instance, so the status is read from what
        # the capture shows of the session, by the same definitions (docs/5g.md).
        s.update(outcome=None, rule=None, cause=None, status=_seen_status(s))
        return
    s.update(outcome=instance.outcome, rule=instance.rule.text if instance.rule else None,
             rule_id=instance.rule.id if instance.rule else None, cause=instance.cause)
    if instance.why:
        s["why"] = instance.why
    s["status"] = STATUS_BY_RULE.get(instance.rule.id if instance.rule else "", "unknown")
    if s["status"] == "no_answer" and s["establishment_accept_frame"] is not None:
        s["status"] = "no_setup_response"


def _reactivation(i: Instance) -> dict[str, Any]:
    """One user-plane re-activation of a session, as the model decided it."""
    return {"setup_request_frame": i.first.frame, "last_frame": i.last.frame, "outcome": i.outcome,
            "rule": i.rule.text if i.rule else None, "rule_id": i.rule.id if i.rule else None, "cause": i.cause,
            **({"why": i.why} if i.why else {})}


def _seen_status(s: dict[str, Any]) -> str:
    """The status of a session with no establishment instance, from its own frames."""
    if s["establishment_reject_frame"] is not None or s["returned_by_amf_frame"] is not None:
        return "rejected"
    if s["setup_result"] == "failed":
        return "setup_failed"
    if s["establishment_accept_frame"] is not None:
        if not s["accept_in_n2_setup"]:
            return "accepted_without_n2_setup"
        return "established" if s["setup_result"] == "setup" else "no_setup_response"
    return "n2_setup_without_nas" if s["setup_request_frame"] is not None else "unknown"


NAS_TRANSPORTS = {"0x67", "0x68"}  # UL / DL NAS TRANSPORT
# The rest are `incomplete`. A session seen only re-activated is never an incomplete establishment.
FINISHED = {"established", "rejected", "setup_failed", "failed", "reactivated", "reactivation_failed"}
REACTIVATION_STATUS = {"reactivation-setup": "reactivated", "reactivation-failed": "reactivation_failed"}
N2_SETUPS = (PROC_PDU_SESSION_SETUP, PROC_INITIAL_CONTEXT_SETUP)
# Each establishment rule (rules.TABLE) as this summary's status word.
STATUS_BY_RULE = {
    "pdu-setup-response": "established", "pdu-initial-context-setup": "established",
    "pdu-reject": "rejected", "pdu-returned": "rejected", "pdu-setup-failed": "setup_failed",
    "pdu-5gmm-status": "failed", "pdu-context-released": "failed", "pdu-accept-undelivered": "failed",
    "pdu-accept-non-delivery": "failed", "pdu-accept-without-n2": "accepted_without_n2_setup",
    "restarted": "no_answer", "unanswered": "no_answer",
}
