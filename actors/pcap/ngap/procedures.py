"""5G procedures per UE context, with timings: each instance's first and last frame, start, duration,
outcome and cause, and latency statistics per procedure type for the whole capture.

Which messages start and end a procedure is data (`PROCEDURES`), not code: message names are
TS 24.501 (5GMM/5GSM, clause 8) and TS 38.413 (NGAP class-1 procedures, clause 8) names. Every N2 step
that can decide an outcome is a procedure of its own (Initial Context Setup, PDU Session Resource
Setup / Modify / Release, handovers, path switch, UE context release, NG Reset), and a NAS accept is
judged by its N2 carrier: inside an InitialContextSetupRequest it reached the UE only if the response
came (docs/5g-verdicts.md, "What the N2 procedures decide").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from diagd.actors.pcap.ngap.associations import Analysis, Association, Context
from diagd.actors.pcap.ngap.core_links import Establishment, attach, core_messages
from diagd.actors.pcap.ngap.pdus import NasMessage, NgapPdu, SessionItem, STmsi
from diagd.actors.pcap.ngap.rules import RULES, Rule, ending

# Message keys: "5GMM 0x41" (NAS message type), "NGAP 41/0" (procedure code / 0 initiating,
# 1 successful, 2 unsuccessful outcome). "5GMM 0x68 returned": a DL NAS transport carrying a
# 5GMM cause hands back a 5GSM message the AMF could not forward (TS 24.501 5.4.5.2.5).
RETURNED = "5GMM 0x68 returned"
PDU_TYPE_INDEX = {"initiatingMessage": 0, "successfulOutcome": 1, "unsuccessfulOutcome": 2}
N2_SETUP_REQUESTS = {"NGAP 29/0": "pdu-setup-response", "NGAP 14/0": "pdu-initial-context-setup"}
CONTEXT_RELEASES = {"NGAP 41/0", "NGAP 42/0"}
ICS_REQUEST, ICS_RESPONSE, ICS_FAILURE = "NGAP 14/0", "NGAP 14/1", "NGAP 14/2"
ERROR_INDICATION, NON_DELIVERY, DOWNLINK_NAS = "NGAP 9/0", "NGAP 19/0", "NGAP 4/0"
REGISTRATION_ACCEPT, SERVICE_ACCEPT = "5GMM 0x42", "5GMM 0x4e"


@dataclass(frozen=True)
class Procedure:
    name: str
    start: frozenset[str]  # the same start key again opens a new instance; another one continues it
    per_session: bool = False  # 5GSM: one instance per PDU session id


def _p(name: str, start: str, per_session: bool = False) -> Procedure:
    return Procedure(name, frozenset(k.strip() for k in start.split(",")), per_session)


# What starts each procedure; what ends it, and by which clause, is rules.TABLE.
PROCEDURES: tuple[Procedure, ...] = (
    _p("Registration", "5GMM 0x41"),  # TS 24.501 5.5.1
    _p("Authentication", "5GMM 0x56"),  # 5.4.1.3
    _p("Security Mode", "5GMM 0x5d"),  # 5.4.2
    _p("Service Request", "5GMM 0x4c"),  # 5.6.1
    _p("Deregistration", "5GMM 0x45, 5GMM 0x47"),  # 5.5.2.2 (UE) / 5.5.2.3 (network)
    _p("PDU Session Establishment", "5GSM 0xc1", per_session=True),  # 6.4.1, then TS 38.413 8.2.1 / 8.3.1
    _p("PDU Session Modification", "5GSM 0xc9, 5GSM 0xcb", per_session=True),  # 6.4.2 / 6.3.2
    _p("PDU Session Release", "5GSM 0xd1, 5GSM 0xd3", per_session=True),  # 6.4.3 / 6.3.3
    _p("Handover Preparation", "NGAP 12/0"),  # TS 38.413 8.4.1
    _p("Handover Resource Allocation", "NGAP 13/0"),  # 8.4.2
    _p("Path Switch", "NGAP 25/0"),  # 8.4.4
    _p("UE Context Release", "NGAP 42/0, NGAP 41/0"),  # 8.3.2 (gNB request) / 8.3.3
    _p("Initial Context Setup", "NGAP 14/0"),  # 8.3.1
    _p("PDU Session Resource Setup", "NGAP 29/0"),  # 8.2.1
    _p("PDU Session Resource Modify", "NGAP 26/0"),  # 8.2.3
    _p("PDU Session Resource Release", "NGAP 28/0"),  # 8.2.2
    # An N2 setup request item of a session with no establishment accept beside it (TS 24.501 5.6.1.4: the
    # Service Request path): started by the item, not by a message (_Tracker._reactivations).
    _p("PDU Session Re-activation", "NGAP 29/0, NGAP 14/0", per_session=True),
    _p("NG Reset", "NGAP 20/0"),  # 8.7.4: not UE-associated, one instance per association (track_association)
    _p("Paging", "NGAP 24/0"),  # 8.5.1: class 2, not UE-associated, answered by the paged UE showing up (paging.py)
)
NAMES = tuple(p.name for p in PROCEDURES)
ESTABLISHMENT, REACTIVATION, NG_RESET = "PDU Session Establishment", "PDU Session Re-activation", "NG Reset"
PAGING = "Paging"
BY_ITEM_OR_ASSOCIATION = {REACTIVATION, NG_RESET, PAGING}  # not opened by _step
# The class-1 NGAP procedures of a UE context (TS 38.413 table 8.1-1): an ERROR INDICATION from the peer ends the
# latest one in flight (8.7.5, 10); the UE context release by its own rule.
N2_CLASS1 = ("Handover Preparation", "Handover Resource Allocation", "Path Switch", "UE Context Release",
             "Initial Context Setup", "PDU Session Resource Setup", "PDU Session Resource Modify",
             "PDU Session Resource Release")
# An accept a DownlinkNASTransport carried, returned by a NAS NON DELIVERY INDICATION (TS 38.413 8.6.4): its rule.
NOT_DELIVERED = {"Registration": "registration-accept-non-delivery", "Service Request": "service-accept-non-delivery",
                 ESTABLISHMENT: "pdu-accept-non-delivery"}


@dataclass
class Instance:
    procedure: Procedure
    ue: Context | None  # None: a non-UE-associated procedure (NG Reset) of `association`
    psi: int | None
    start_key: str
    first: NgapPdu
    last: NgapPdu
    outcome: str | None = None  # None while open
    cause: dict[str, Any] | None = None
    why: str | None = None
    rule: Rule | None = None
    frames: list[int] = field(default_factory=list)
    ue_ipv4: str | None = None  # the PDU address a PDU SESSION ESTABLISHMENT ACCEPT gave
    accept: NgapPdu | None = None  # establishment: the PDU that carried the accept
    n2_rule: str | None = None  # establishment: the rule its N2 setup response will close it by
    seq: int = 0  # order of the last message, for answers that name no PDU session
    core: Establishment | None = None  # its N4 / SBI messages, when the capture has them
    # A NAS accept (registration, service, establishment) or a re-activation riding in an InitialContextSetupRequest
    # whose outcome is not known yet: delivered only by its response (TS 38.413 8.3.1.2 / 8.3.1.3).
    carrier: NgapPdu | None = None
    guti_tmsi: str | None = None  # registration: the 5G-TMSI of the new 5G-GUTI its accept assigned
    association: Association | None = None  # a non-UE-associated instance's association
    paged: STmsi | None = None  # Paging: the paged UE's 5G-S-TMSI
    answered_by: Context | None = None  # Paging: the UE context that presented it after the PAGING
    evidence: str | None = None  # ... and what it presented, where

    def describe(self) -> dict[str, Any]:
        done = self.outcome is not None and self.outcome != "incomplete"
        out: dict[str, Any] = {
            "procedure": self.procedure.name, "ue": self.ue.label if self.ue is not None else None,
            **({"association": self.association.label} if self.ue is None and self.association else {}),
            **({"pdu_session_id": self.psi} if self.procedure.per_session else {}),
            "first_frame": self.first.frame, "last_frame": self.last.frame, "start": iso(self.first.time),
            "duration_ms": duration_ms(self.first.time, self.last.time) if done else None,
            "outcome": self.outcome, "cause": self.cause, "frames": self.frames,
            "rule": self.rule.text if self.rule else None, "rule_id": self.rule.id if self.rule else None,
        }
        if self.why:
            out["why"] = self.why
        if self.ue_ipv4:
            out["ue_ipv4"] = self.ue_ipv4
        if self.core is not None:
            out["n4_sbi"] = self.core.attached
        if self.procedure.name == PAGING:
            out["paged"] = self.paged.describe() if self.paged is not None else None
            if self.answered_by is not None:
                out["answered_by"] = {"ue": self.answered_by.label, "frame": self.last.frame,
                                      "evidence": self.evidence}
        return out


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def duration_ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 3)


def message_keys(pdu: NgapPdu) -> list[tuple[str, NasMessage | None]]:
    """The procedure-relevant messages of one NGAP PDU, in order: its NGAP message, then its NAS.

    A 5GMM message inside another 5GMM message's container (the REGISTRATION REQUEST a SECURITY
    MODE COMPLETE carries back, TS 24.501 5.4.2.3) is not a new procedure step; 5GSM messages
    inside UL/DL NAS TRANSPORT are, except one the AMF hands back unforwarded (NasMessage.returned).
    """
    keys: list[tuple[str, NasMessage | None]] = []
    if pdu.procedure_code is not None and pdu.pdu_type in PDU_TYPE_INDEX:
        keys.append((f"NGAP {pdu.procedure_code}/{PDU_TYPE_INDEX[pdu.pdu_type]}", None))
    for message in pdu.nas:
        if message.layer == "5GMM" and message.outer is not None and message.outer.startswith("5GMM"):
            continue
        if message.returned:  # the request handed back is not a new one: RETURNED before it answers it
            continue
        if message.layer == "5GMM" and message.code == "0x68" and message.cause is not None:
            keys.append((RETURNED, message))
        keys.append((f"{message.layer} {message.code}", message))
    return keys


def _ngap_key(pdu: NgapPdu) -> str:
    return f"NGAP {pdu.procedure_code}/{PDU_TYPE_INDEX.get(pdu.pdu_type or '', -1)}"


def _cause(pdu: NgapPdu, message: NasMessage | None) -> dict[str, Any] | None:
    if message is not None:
        if message.cause is None:
            return None
        return {"kind": message.layer, "code": message.cause, "name": message.cause_text}
    top = [c for c in pdu.causes if c["kind"] == "NGAP" and "pdu_session_id" not in c]
    if not top:
        return None
    c = top[0]
    return {"kind": "NGAP", "group": c["group"], "code": c["code"], "name": c["cause"]}


class _Tracker:
    """Open procedure instances of one UE context, fed its PDUs in capture order."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.done: list[Instance] = []
        self.open: dict[tuple[str, int | None], Instance] = {}
        self.seq = 0
        # Answers whose request lies outside the capture (or the display filter): no instance (no start,
        # no duration), but what they say still counts for the context's state (a lone registration reject).
        self.orphans: list[tuple[str, str]] = []  # (procedure, rule id)
        # The instance each NAS-PDU (hex) of a DownlinkNASTransport carrying an accept belongs to: a NAS NON
        # DELIVERY INDICATION returning that NAS-PDU says the accept never reached the UE.
        self.downlink: dict[str, Instance] = {}

    def feed(self, pdu: NgapPdu) -> None:
        keys = message_keys(pdu)
        for key, message in keys:
            self.seq += 1
            psi = message.psi if message is not None else None
            if key == "5GMM 0x45" and message is not None and message.first("nas_5gs.mm.switch_off") == "1":
                self._start(PROCEDURES[NAMES.index("Deregistration")], key, pdu, None)
                self._end(self.open.pop(("Deregistration", None)), "deregistration-switch-off")
                continue
            if key == ERROR_INDICATION:
                self._error_indication(pdu)
                continue
            if key == NON_DELIVERY:
                self._not_delivered(pdu)
                continue
            for proc in PROCEDURES:
                if proc.name not in BY_ITEM_OR_ASSOCIATION:
                    self._step(proc, key, pdu, message, psi)
            if key in CONTEXT_RELEASES:
                self._released(pdu)
        self._reactivations(pdu, keys)
        for item in pdu.items:
            self._n2_answer(pdu, item)
        if keys and keys[0][0] in (ICS_RESPONSE, ICS_FAILURE):
            self._carried(pdu, keys[0][0] == ICS_RESPONSE)

    def _start(self, proc: Procedure, key: str, pdu: NgapPdu, psi: int | None) -> None:
        slot = (proc.name, psi if proc.per_session else None)
        current = self.open.get(slot)
        if current is not None and key != current.start_key and current.frames[-1] <= pdu.frame:
            self._touch(current, pdu)  # e.g. RELEASE REQUEST then RELEASE COMMAND: one procedure
            return
        if current is not None:
            self._end(current, "restarted", why=restarted_why(current, pdu))
        self.open[slot] = Instance(proc, self.ctx, slot[1], key, pdu, pdu, frames=[pdu.frame], seq=self.seq)

    def _step(self, proc: Procedure, key: str, pdu: NgapPdu, message: NasMessage | None, psi: int | None) -> None:
        if key in proc.start:
            self._start(proc, key, pdu, psi)
            return
        slot = (proc.name, psi if proc.per_session else None)
        current = self.open.get(slot)
        if proc.name == ESTABLISHMENT and key == "5GSM 0xc2" and current is not None:
            self._accepted(current, pdu, message, key)
            return
        if key in (REGISTRATION_ACCEPT, SERVICE_ACCEPT) and proc.name in ("Registration", "Service Request"):
            if ending(proc.name, key) is not None:
                self._nas_accept(proc, current, key, pdu, message)
            return
        rule = ending(proc.name, key)
        if rule is None:
            return
        if current is None and proc.per_session and psi is None:
            # An answer naming no PDU session (5GMM STATUS) answers the context's latest NAS exchange.
            waiting = [i for s, i in self.open.items() if s[0] == proc.name]
            current = max(waiting, key=lambda i: i.seq) if waiting else None
            slot = (proc.name, current.psi) if current is not None else slot
        if current is None:
            self.orphans.append((proc.name, rule.id))  # an answer to a request outside the capture
            return
        self._touch(current, pdu)
        del self.open[slot]
        self._end(current, rule.id, cause=_cause(pdu, message) if rule.outcome != "success" else None)

    def _accepted(self, current: Instance, pdu: NgapPdu, message: NasMessage | None, key: str) -> None:
        """An establishment accept: the session is set up only by the N2 answer to the request carrying it."""
        self._touch(current, pdu)
        current.accept = pdu
        current.ue_ipv4 = message.first("nas_5gs.sm.pdu_addr_inf_ipv4") if message is not None else None
        ngap = _ngap_key(pdu)
        current.n2_rule = N2_SETUP_REQUESTS.get(ngap)
        current.carrier = pdu if ngap == ICS_REQUEST else None
        self._sent_down(current, pdu)

    def _nas_accept(self, proc: Procedure, current: Instance | None, key: str, pdu: NgapPdu,
                    message: NasMessage | None) -> None:
        """A REGISTRATION / SERVICE ACCEPT: it ends the procedure once it reached the UE (TS 24.501 5.5.1.2.4,
        5.6.1.4). Inside an InitialContextSetupRequest it is delivered by the response, lost with the failure
        (TS 38.413 8.3.1); a new 5G-GUTI in a registration accept is acknowledged by REGISTRATION COMPLETE."""
        rule = RULES["registration-accept" if key == REGISTRATION_ACCEPT else "service-accept"]
        if current is None:
            self.orphans.append((proc.name, rule.id))  # an answer to a request outside the capture
            return
        self._touch(current, pdu)
        current.accept = pdu
        current.carrier = pdu if _ngap_key(pdu) == ICS_REQUEST else None
        if key == REGISTRATION_ACCEPT and message is not None:
            current.guti_tmsi = message.first("nas_5gs.5g_tmsi")
        self._sent_down(current, pdu)
        if current.carrier is None and current.guti_tmsi is None:
            del self.open[(proc.name, None)]
            self._end(current, rule.id)

    def _sent_down(self, current: Instance, pdu: NgapPdu) -> None:
        if _ngap_key(pdu) == DOWNLINK_NAS and pdu.nas_pdu is not None:
            self.downlink[pdu.nas_pdu] = current

    def _not_delivered(self, pdu: NgapPdu) -> None:
        """A NAS NON DELIVERY INDICATION (TS 38.413 8.6.4) returns the NAS-PDU of a DownlinkNASTransport: the accept
        it carried never reached the UE. An instance that accept had ended (as delivered, all the capture showed
        until then) is decided again; one a later message ended (a REGISTRATION COMPLETE: it was delivered) is not."""
        current = self.downlink.pop(pdu.nas_pdu, None) if pdu.nas_pdu is not None else None
        if current is None:
            return
        name = current.procedure.name
        slot = (name, current.psi if current.procedure.per_session else None)
        if self.open.get(slot) is current:
            del self.open[slot]
        elif current.rule is not None and current.rule.id in ("registration-accept", "service-accept"):
            self.done.remove(current)
        else:
            return
        self._touch(current, pdu)
        self._end(current, NOT_DELIVERED[name], cause=_cause(pdu, None))

    def _error_indication(self, pdu: NgapPdu) -> None:
        """An ERROR INDICATION with this context's ids: the peer could not process the class-1 request in flight
        (TS 38.413 8.7.5, 10), the latest one whose last message came from the other side; it fails. One from the
        same side, or with none in flight, ends nothing: it stays a failure of the context, no orphan answer."""
        waiting = [(slot, i) for slot, i in self.open.items() if slot[0] in N2_CLASS1
                   and not (pdu.src is not None and pdu.src == i.last.src)]
        if not waiting:
            return
        slot, current = max(waiting, key=lambda pair: pair[1].seq)
        self._touch(current, pdu)
        del self.open[slot]
        self._end(current, "ue-context-release-error-indication" if slot[0] == "UE Context Release" else
                  "n2-error-indication", cause=_cause(pdu, None))

    def _carried(self, pdu: NgapPdu, delivered: bool) -> None:
        """An InitialContextSetupResponse / Failure: what its request carried was delivered / was not."""
        for slot, current in list(self.open.items()):
            if current.carrier is None or current.carrier.frame > pdu.frame:
                continue
            current.carrier = None
            self._touch(current, pdu)
            name = current.procedure.name
            cause = None if delivered else _cause(pdu, None)
            if name == "Registration" and (not delivered or current.guti_tmsi is None):
                del self.open[slot]
                self._end(current, "registration-accept" if delivered else "registration-accept-undelivered",
                          cause=cause)
            elif name == "Service Request":
                del self.open[slot]
                self._end(current, "service-accept" if delivered else "service-accept-undelivered", cause=cause)
            elif not delivered and name in (ESTABLISHMENT, REACTIVATION):
                del self.open[slot]  # not listed as failed (that item ended it already): lost with its carrier
                self._end(current, "pdu-accept-undelivered" if name == ESTABLISHMENT else "reactivation-failed",
                          cause=cause)

    def _reactivations(self, pdu: NgapPdu, keys: list[tuple[str, NasMessage | None]]) -> None:
        """Each N2 setup request item of a session whose establishment accept is not beside it: the user plane of a
        session established before is set up again (TS 24.501 5.6.1.4, TS 38.413 8.2.1 / 8.3.1)."""
        if not keys or keys[0][0] not in N2_SETUP_REQUESTS:
            return
        accepted = {m.psi for _, m in keys if m is not None and m.layer == "5GSM" and m.code == "0xc2"}
        proc = PROCEDURES[NAMES.index(REACTIVATION)]
        for item in pdu.items:
            if item.role == "setup-request" and item.psi not in accepted:
                self._start(proc, keys[0][0], pdu, item.psi)
                self.open[(REACTIVATION, item.psi)].carrier = pdu if keys[0][0] == ICS_REQUEST else None

    def _n2_answer(self, pdu: NgapPdu, item: SessionItem) -> None:
        if item.role not in ("setup-ok", "setup-failed"):
            return
        current = self.open.get((ESTABLISHMENT, item.psi))
        ok, slot = item.role == "setup-ok", (ESTABLISHMENT, item.psi)
        if current is None or current.n2_rule is None:
            current, slot = self.open.get((REACTIVATION, item.psi)), (REACTIVATION, item.psi)
            if current is None:
                return  # answers a request outside the capture
            rule_id = "reactivation-setup" if ok else "reactivation-failed"
        else:
            rule_id = current.n2_rule if ok else "pdu-setup-failed"
        self._touch(current, pdu)
        current.carrier = None
        del self.open[slot]
        if ok:
            self._end(current, rule_id)
            return
        cause = item.cause or {}
        self._end(current, rule_id, cause={"kind": "NGAP", "group": cause.get("group"), "code": cause.get("code"),
                                           "name": cause.get("cause")})

    def _released(self, pdu: NgapPdu) -> None:
        """A UE context release ends every establishment still waiting: it failed, it is not pending."""
        for slot, current in list(self.open.items()):
            if slot[0] != ESTABLISHMENT or current.frames[-1] > pdu.frame:
                continue
            self._touch(current, pdu)
            del self.open[slot]
            self._end(current, "pdu-context-released", cause=_cause(pdu, None))

    def _touch(self, instance: Instance, pdu: NgapPdu) -> None:
        instance.last = pdu
        instance.seq = self.seq
        if instance.frames[-1] != pdu.frame:
            instance.frames.append(pdu.frame)

    def _end(self, instance: Instance, rule_id: str, *, cause: dict[str, Any] | None = None,
             why: str | None = None) -> None:
        rule = RULES[rule_id]
        instance.outcome, instance.rule, instance.cause, instance.why = rule.outcome, rule, cause, why
        self.done.append(instance)

    def finish(self, analysis: Analysis) -> list[Instance]:
        for instance in self.open.values():
            name = instance.procedure.name
            if name == "Registration" and instance.accept is not None and instance.carrier is None:
                why = (f"accepted in frame {instance.accept.frame} with a new 5G-GUTI (5G-TMSI {instance.guti_tmsi}), "
                       f"then no REGISTRATION COMPLETE: {self._silence(instance)}")
                self._end(instance, "registration-complete-missing", why=why)
                continue
            if name == ESTABLISHMENT and instance.accept is not None and instance.n2_rule is None:
                why = (f"accepted in frame {instance.accept.frame} by a NAS transport; no N2 PDU session resource "
                       "setup carried the accept")
                self._end(instance, "pdu-accept-without-n2", why=why)
                continue
            why = self._silence(instance)
            if instance.accept is not None and name in ("Registration", "Service Request"):
                why = f"accepted in frame {instance.accept.frame}, then no InitialContextSetup response: " + why
            elif instance.accept is not None:
                why = f"accepted in frame {instance.accept.frame}, then no N2 setup response: " + why
            self._end(instance, "unanswered", why=why)
        self.open.clear()
        return sorted(self.done, key=lambda i: (i.first.frame, NAMES.index(i.procedure.name)))

    def _silence(self, instance: Instance) -> str:
        """Why no answer came: what followed the instance's last message in its context and association."""
        last_in_assoc, last_in_ctx = self.ctx.assoc.pdus[-1], self.ctx.pdus[-1]
        if last_in_ctx.frame > instance.last.frame:
            return (f"no answer: the UE context carried NGAP until frame {last_in_ctx.frame} "
                    f"({duration_ms(instance.last.time, last_in_ctx.time)} ms later)")
        if self.ctx.closed:
            return f"no answer before the UE context ended ({self.ctx.closed})"
        if last_in_assoc.frame > instance.last.frame:
            return (f"no answer: this UE context fell silent while its association carried NGAP until frame "
                    f"{last_in_assoc.frame}")
        return "the capture ends before any answer"


def restarted_why(current: Instance, pdu: NgapPdu) -> str:
    """Why an instance is abandoned by the same request again: nothing answered it yet, or its accept was sent and
    what had to follow never came (the REGISTRATION COMPLETE a new 5G-GUTI needs, the N2 response delivering it)."""
    said = f"a new {current.procedure.name} started in frame {pdu.frame}"
    if current.accept is None:
        return said + " before any answer"
    said += f", after its accept (frame {current.accept.frame}) and before "
    if current.carrier is not None:
        return said + "the InitialContextSetup response that would deliver it"
    if current.guti_tmsi is not None:
        return said + (f"its REGISTRATION COMPLETE: the accept gave a new 5G-GUTI (5G-TMSI {current.guti_tmsi}), "
                       "never acknowledged")
    if current.n2_rule is not None:
        return said + "the N2 setup response that would set the session up"
    return said + "any N2 PDU session resource setup carrying it"


def percentile(values: list[float], p: int) -> float:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered) / 100) - 1)]


def statistics(instances: list[Instance]) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name in NAMES:
        mine = [i for i in instances if i.procedure.name == name]
        if not mine:
            continue
        durations = [duration_ms(i.first.time, i.last.time) for i in mine if i.outcome != "incomplete"]
        outcomes = {o: sum(1 for i in mine if i.outcome == o) for o in ("success", "reject", "failure", "incomplete")}
        stats[name] = {"count": len(mine), **outcomes,
                       **({"p50_ms": percentile(durations, 50), "p95_ms": percentile(durations, 95),
                           "max_ms": max(durations)} if durations else
                          {"p50_ms": None, "p95_ms": None, "max_ms": None})}
    return stats


def _suci_parts(ctx: Context) -> tuple[str, str, str] | None:
    for pdu in ctx.pdus:
        for message in pdu.nas:
            msin, mcc, mnc = (message.first(n) for n in ("nas_5gs.mm.suci.msin", "e212.mcc", "e212.mnc"))
            if msin and mcc and mnc:
                return mcc, mnc, msin
    return None


def link_core(instances: list[Instance], rows: list[dict[str, str]], capture_end: float) -> dict[str, Any]:
    establishments = [i for i in instances if i.procedure.name == "PDU Session Establishment" and i.ue is not None]
    for i in establishments:
        assert i.ue is not None
        # An unanswered request's window runs to the end of the capture: the core may still be at work.
        end = capture_end if i.outcome == "incomplete" else i.last.time
        i.core = Establishment(i.first.time, end, i.ue_ipv4, _suci_parts(i.ue), psi=i.psi)
    return attach([i.core for i in establishments if i.core is not None], core_messages(rows))


def track_all(ctx: Context, analysis: Analysis) -> tuple[list[Instance], list[tuple[str, str]]]:
    """Every procedure instance of one UE context, closed by a rule of rules.TABLE, and the
    (procedure, rule id) of answers whose request is not in the capture."""
    tracker = _Tracker(ctx)
    for pdu in ctx.pdus:
        tracker.feed(pdu)
    return tracker.finish(analysis), tracker.orphans




def track_association(assoc: Association, pdus: list[NgapPdu]) -> list[Instance]:
    """The NG Reset instances of one association (TS 38.413 8.7.4: not UE-associated, either side starts it),
    fed its PDUs that belong to no UE context: NG RESET ACKNOWLEDGE ends the open one."""
    proc = PROCEDURES[NAMES.index(NG_RESET)]
    done: list[Instance] = []
    current: Instance | None = None
    for pdu in pdus:
        key = _ngap_key(pdu)
        if key in proc.start:
            if current is not None:
                current.outcome, current.rule = "incomplete", RULES["restarted"]
                current.why = f"a new {NG_RESET} started in frame {pdu.frame} before any answer"
                done.append(current)
            current = Instance(proc, None, None, key, pdu, pdu, frames=[pdu.frame], association=assoc)
        elif (rule := ending(NG_RESET, key)) is not None and current is not None:
            current.last = pdu
            if current.frames[-1] != pdu.frame:
                current.frames.append(pdu.frame)
            current.outcome, current.rule = rule.outcome, rule
            done.append(current)
            current = None
    if current is not None:
        last = assoc.pdus[-1]
        current.outcome, current.rule = "incomplete", RULES["unanswered"]
        current.why = (f"no answer: the association carried NGAP until frame {last.frame}" if last.frame >
                       current.last.frame else "the capture ends before any answer")
        done.append(current)
    return done
