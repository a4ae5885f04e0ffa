"""Every field of the NGAP UE-context and PDU-session answers, computed a second time from `tshark -T fields`.

It builds on the rows and context keys of tests/support/ngap_oracle.py (one row per NGAP PDU,
bundles split) and never imports diagd. The meaning of each field is the README's and the tool
descriptions':

- per UE context: `frames`, every frame carrying one of its PDUs, in capture order, once each;
  `5g_tmsi`, the 5G-TMSI last assigned to it (Registration Accept or Configuration Update
  Command); `plmn`, the MCC/MNC of the first SUCI it presented.
- per PDU session establishment (UE context, PDU session id, n-th establishment, a new one at each
  Establishment Request): `dnn` accepted (else the one requested: the UL NAS transport's), `ue_ipv4` accepted, `s_nssai`
  of the N2 setup request (SST and SD, hex octets), else the first one a 5GSM message or the UL NAS
  Transport carrying it named (requested or accepted); `n3_uplink`
  (gNB-bound tunnel the N2 setup request gives) and `n3_downlink` (the one the setup response
  gives), each an address and a TEID (a dual-stack address: its IPv4 as `address`, its IPv6 as `ipv6`),
  `n3_uplink_additional` / `n3_downlink_additional` the tunnels of AdditionalUL-NGU-UP-TNLInformation /
  additionalDLQosFlowPerTNLInformation (absent: none); `qfis` the QoS flows of the setup request; `release`,
  the frames of 5GSM release request/command/complete and the last cause with its name and
  whether it is a normal one (#36, #39).
- `status`: rejected (5GSM reject, or the request returned unforwarded), setup_failed (the N2 answer
  lists it failed), failed (no answer, and then a 5GMM STATUS of the UE — TS 24.501 8.2.29 — or a UE
  context release command/request — TS 38.413 8.3.2/8.3.3 — ended the wait), established (accept
  inside an N2 setup request answered set up), else how far it got.

Cause names come from `tshark -G values`. Where a row holds two values the field could take
(two tunnels, two TMSIs assigned in one PDU, ...), it raises OracleCannotTell instead of choosing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ngap_oracle import (
    CAUSE_GROUPS,
    NORMAL_5GSM,
    SM_FAILURES,
    SM_RELEASES,
    OracleCannotTell,
    Row,
    UeKey,
    cause_name,
    disk_cached,
    message_name,
    owned_rows,
    value_names,
)

TMSI_ASSIGNERS = {0x42, 0x54}  # Registration Accept, Configuration Update Command
SM_REQUEST, SM_ACCEPT, SM_REJECT = 0xC1, 0xC2, 0xC3
SM_RELEASE_FRAMES = {0xD1: "request_frame", 0xD3: "command_frame", 0xD4: "complete_frame"}
DL_NAS_TRANSPORT = 0x68
N2_SETUP = {29, 14}  # PDUSessionResourceSetup, InitialContextSetup
UE_CONTEXT_RELEASES = {41, 42}  # UEContextRelease (command), UEContextReleaseRequest: initiating messages
MM_STATUS = 0x64
REGISTRATION_REQUEST = 0x41
# 0x42 REGISTRATION ACCEPT (once delivered and, with a new 5G-GUTI, acknowledged), 0x43 REGISTRATION COMPLETE,
# 0x44 REGISTRATION REJECT, 0x58 AUTHENTICATION REJECT.
REGISTRATION_ENDS = {0x42: "accepted", 0x43: "accepted", 0x44: "rejected", 0x58: "rejected"}
DEREGISTRATION_STARTS = {0x45, 0x47}  # UE / network originating deregistration request
SETUP_OK_LISTS = ("ngap.PDUSessionResourceSetupListSURes", "ngap.PDUSessionResourceSetupListCxtRes")


@dataclass
class Session:
    first_frame: int
    dnn: str | None = None
    ue_ipv4: str | None = None
    s_nssai: dict[str, str | None] | None = None
    n3_uplink: dict[str, str | None] | None = None
    n3_downlink: dict[str, str | None] | None = None
    n3_uplink_additional: list[dict[str, str | None]] | None = None
    n3_downlink_additional: list[dict[str, str | None]] | None = None
    qfis: list[int] = field(default_factory=list)
    release: dict[str, Any] | None = None
    establishment_request_frame: int | None = None
    establishment_accept_frame: int | None = None
    accept_in_n2_setup: bool = False
    establishment_reject_frame: int | None = None
    returned_by_amf_frame: int | None = None
    setup_request_frame: int | None = None
    setup_response_frame: int | None = None
    setup_result: str | None = None  # setup, failed
    failures: list[tuple[int, str, int | None, str | None]] = field(default_factory=list)  # frame, kind, code, cause
    ended_unanswered: bool = False  # a 5GMM STATUS or a UE context release ended the wait for an answer
    # its accept, sent in a DownlinkNASTransport, came back in a NAS NON DELIVERY INDICATION (TS 38.413 8.6.4)
    not_delivered: bool = False
    setup_in_ics: bool = False  # its N2 setup request was an InitialContextSetupRequest
    carrier_failed: bool = False  # ... answered by an InitialContextSetupFailure (TS 38.413 8.3.1.3): nothing set up

    @property
    def status(self) -> str:
        """docs/5g.md's outcome: established, rejected, setup_failed, or how far it got."""
        if self.establishment_reject_frame is not None or self.returned_by_amf_frame is not None:
            return "rejected"
        if self.establishment_request_frame is None and self.establishment_accept_frame is None \
                and self.setup_request_frame is not None:
            # An N2 setup with no establishment in the capture: the user plane of a session established before is
            # set up again (TS 24.501 5.6.1.4, the Service Request path): a re-activation, not an establishment.
            if self.setup_result == "setup":
                return "reactivated"
            return "reactivation_failed" if self.setup_result == "failed" or self.carrier_failed else \
                "reactivation_no_response"
        if self.setup_result == "failed":
            return "setup_failed"
        if self.ended_unanswered or self.not_delivered or (self.carrier_failed and
                                                            self.establishment_accept_frame is not None):
            return "failed"
        if self.establishment_accept_frame is not None:
            if not self.accept_in_n2_setup:
                return "accepted_without_n2_setup"
            return "established" if self.setup_result == "setup" else "no_setup_response"
        if self.establishment_request_frame is not None:
            return "no_answer"
        return "unknown"


@dataclass
class Fields:
    ues: dict[UeKey, dict[str, Any]]
    sessions: dict[tuple[UeKey, int, int], Session]  # (UE, PDU session id, n-th establishment)


def single(row: Row, name: str) -> str | None:
    """The one distinct value of a field in this PDU, None if absent; two different ones: cannot tell."""
    got = sorted(set(row.values.get(name, [])))
    if len(got) > 1:
        raise OracleCannotTell(f"frame {row.frame}: {name} has several values {got}")
    return got[0] if got else None


IE_UL_TUNNEL, IE_ADDITIONAL_UL_TUNNELS = 139, 126  # TS 38.413 9.3.4.1: UL-NGU-UP-TNLInformation, AdditionalUL-...
# IEs of a setup request transfer that hold tunnels this oracle does not place (redundant, forwarding ...)
OTHER_TUNNEL_IES = {128, 152, 153, 154, 155, 164, 172, 183, 184, 185, 186, 192, 195}


def address(bits: str) -> dict[str, str]:
    """A TransportLayerAddress's raw octets (hex) as the summaries show it: 4 octets IPv4, 16 IPv6, 20 IPv4 then
    IPv6 (TS 38.414 5.1: dual stack, the IPv4 address first)."""
    raw = bytes.fromhex(bits.replace(":", ""))
    if len(raw) == 4:
        return {"address": str(ipaddress.IPv4Address(raw))}
    if len(raw) == 16:
        return {"address": str(ipaddress.IPv6Address(raw))}
    if len(raw) == 20:
        return {"address": str(ipaddress.IPv4Address(raw[:4])), "ipv6": str(ipaddress.IPv6Address(raw[4:]))}
    raise OracleCannotTell(f"a transport layer address of {len(raw) * 8} bits: {bits}")


def tunnels(row: Row, request: bool) -> tuple[dict[str, str | None], list[dict[str, str | None]]]:
    """(the main tunnel, the additional ones) of one N2 setup request or response row.

    Each GTPTunnel is one transportLayerAddress followed by its gTP-TEID, so the n-th address goes with the
    n-th TEID; in PDU order, a request transfer's IEs come in ngap.id order (UL-NGU-UP-TNLInformation holds one
    tunnel, AdditionalUL-NGU-UP-TNLInformation as many as its list counts), a response transfer holds
    dLQosFlowPerTNLInformation's tunnel, then those additionalDLQosFlowPerTNLInformation counts."""
    bits, teids = row.values.get("ngap.transportLayerAddress", []), row.values.get("ngap.gTP_TEID", [])
    if len(bits) != len(teids):
        raise OracleCannotTell(f"frame {row.frame}: {len(bits)} addresses, {len(teids)} TEIDs")
    found = [{**address(b), "teid": t} for b, t in zip(bits, teids, strict=True)]
    if request:
        ies = [i for i in row.ints("ngap.id") if i in (IE_UL_TUNNEL, IE_ADDITIONAL_UL_TUNNELS, *OTHER_TUNNEL_IES)]
        lists = iter(row.ints("ngap.UPTransportLayerInformationList"))
        held = [(i, 1 if i == IE_UL_TUNNEL else next(lists, -1)) for i in ies]
        if any(i in OTHER_TUNNEL_IES for i in ies) or sum(n for _, n in held) != len(found):
            raise OracleCannotTell(f"frame {row.frame}: tunnels in IEs {ies}")
        where = [i for i, n in held for _ in range(n)]
        main = [t for t, i in zip(found, where, strict=True) if i == IE_UL_TUNNEL]
        extra = [t for t, i in zip(found, where, strict=True) if i == IE_ADDITIONAL_UL_TUNNELS]
    else:
        count = sum(row.ints("ngap.additionalDLQosFlowPerTNLInformation"))
        if found and len(found) != 1 + count:
            raise OracleCannotTell(f"frame {row.frame}: {len(found)} tunnels, 1 + {count} expected")
        main, extra = found[:1], found[1:]
    if len(main) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several main tunnels")
    return (main[0] if main else {"address": None, "teid": None}), extra


def answer(path: Path) -> Fields:
    return disk_cached(path, "fields", _answer)


def _answer(path: Path) -> Fields:
    rows, owners = owned_rows(path)
    ues: dict[UeKey, dict[str, Any]] = {}
    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        ue = ues.setdefault(owner, {"frames": [], "5g_tmsi": None, "plmn": None, "suci_msin": None,
                                    "registration": "unknown", "first_time": row.time, "nas_messages": []})
        if row.frame not in ue["frames"]:
            ue["frames"].append(row.frame)
        ue["last_time"] = row.time
        mm = row.ints("nas_5gs.mm.message_type")
        ue["nas_messages"] += [(row.frame, "5GMM", t, message_name("5GMM", t)) for t in mm]
        ue["nas_messages"] += [(row.frame, "5GSM", t, message_name("5GSM", t))
                               for t in row.ints("nas_5gs.sm.message_type")]
        ue["suci_msin"] = ue["suci_msin"] or single(row, "nas_5gs.mm.suci.msin")
        _registration_steps(ue, row, mm)
        if TMSI_ASSIGNERS & set(row.ints("nas_5gs.mm.message_type")) and (tmsi := row.one("nas_5gs.5g_tmsi")):
            ue["5g_tmsi"] = str(tmsi)
        if ue["plmn"] is None and single(row, "nas_5gs.mm.suci.msin") is not None:
            mcc, mnc = single(row, "e212.mcc"), single(row, "e212.mnc")
            if mcc is not None:
                ue["plmn"] = {"mcc": str(int(mcc)), "mnc": str(int(mnc)) if mnc is not None else None}
    for ue in ues.values():
        ue["registration"] = _registration_state(ue.pop("reg_orphan", "unknown"), ue.pop("reg_instances", []))
        ue.pop("reg_downlink", None)
        first, last = ue.pop("first_time"), ue.pop("last_time")
        ue.update(first_time=round(first, 6), last_time=round(last, 6), duration_s=round(last - first, 6))
        ue["nas_messages"].sort()
    return Fields(ues=ues, sessions=_sessions(rows, owners))


def _registration_steps(ue: dict[str, Any], row: Row, mm: list[int]) -> None:
    """Registration and deregistration instances of one UE context (TS 24.501 5.5.1, 5.5.2).

    A REGISTRATION REQUEST starts one only as the PDU's outer 5GMM message (the one a SECURITY MODE
    COMPLETE carries back in its container, 5.4.2.3, is no new request); COMPLETE, REJECT or
    AUTHENTICATION REJECT (5.4.1.3.5) end the open one, or, with none open, answer a request made
    before the capture. An ACCEPT ends it only once it reached the UE: one inside an
    InitialContextSetupRequest waits for the InitialContextSetupResponse (its Failure: the accept is lost,
    TS 38.413 8.3.1.3), and one giving a new 5G-GUTI (a 5G-TMSI in it) for the UE's COMPLETE (5.5.1.2.4).
    """
    frame = row.frame
    instances = ue.setdefault("reg_instances", [])  # [first frame, kind, state, in ICS, new GUTI], in start order
    downlink = ue.setdefault("reg_downlink", {})  # DownlinkNASTransport NAS-PDU (hex) -> the registration accepted
    nas_pdu = (row.values.get("ngap.NAS_PDU") or [None])[0]
    if (row.proc, row.pdu_type) == (19, 0) and nas_pdu in downlink:
        # A NAS NON DELIVERY INDICATION returns it (TS 38.413 8.6.4): the accept never reached the UE, whether the
        # registration still waited for its COMPLETE or the accept had ended it.
        returned = downlink.pop(nas_pdu)
        if returned[2] == "awaiting" or returned[5:] == ["by its accept"]:
            returned[2] = "failed"
    open_ = [i for i in instances if i[1] == "registration" and i[2] in ("pending", "awaiting")]
    if row.proc == 14 and row.pdu_type in (1, 2):
        for i in open_:
            if i[2] == "awaiting" and i[3]:
                i[3] = False
                if row.pdu_type == 2:
                    i[2] = "failed"
                elif not i[4]:
                    i[2] = "accepted"
    for position, t in enumerate(mm):
        if t == REGISTRATION_REQUEST and position == 0:
            if open_:
                open_[-1][2] = "abandoned"  # the same request again before an answer
            instances.append(instance := [frame, "registration", "pending", False, False])
            open_ = [instance]
        elif t == 0x42 and open_ and ((row.proc, row.pdu_type) == (14, 0) or row.one("nas_5gs.5g_tmsi")):
            open_[-1][2:] = ["awaiting", (row.proc, row.pdu_type) == (14, 0), bool(row.one("nas_5gs.5g_tmsi"))]
            if (row.proc, row.pdu_type) == (4, 0) and nas_pdu:
                downlink[nas_pdu] = open_[-1]
        elif t in REGISTRATION_ENDS:
            if open_:
                ended = open_.pop()
                ended[2] = REGISTRATION_ENDS[t]
                if t == 0x42 and (row.proc, row.pdu_type) == (4, 0) and nas_pdu:
                    ended.append("by its accept")
                    downlink[nas_pdu] = ended
            else:
                ue["reg_orphan"] = REGISTRATION_ENDS[t]
        elif t in DEREGISTRATION_STARTS:
            instances.append([frame, "deregistration", "deregistered", False, False])


def _registration_state(orphan: str, instances: list[list[Any]]) -> str:
    """accepted / rejected / failed (its accept lost with the InitialContextSetup) / pending (not answered, or
    not acknowledged) by the latest registration; deregistered after a deregistration unless rejected; with no
    request in the capture, what a lone answer said."""
    state = orphan
    for _, kind, outcome, *_ in sorted(instances, key=lambda i: (i[0], i[1] != "registration")):
        if kind == "registration":
            state = outcome if outcome in ("accepted", "rejected", "failed") else "pending"
        elif state != "rejected":
            state = "deregistered"
    return state


class _Book:
    """The current establishment of each (UE, PDU session id), and every establishment by its key."""

    def __init__(self) -> None:
        self.current: dict[tuple[UeKey, int], tuple[UeKey, int, int]] = {}
        self.count: dict[tuple[UeKey, int], int] = {}
        self.sessions: dict[tuple[UeKey, int, int], Session] = {}
        # Establishments still waiting for their answer, per UE, in the order they were last touched.
        self.waiting: dict[UeKey, list[Session]] = {}
        # The establishment whose accept each DownlinkNASTransport NAS-PDU (hex) carried.
        self.downlink: dict[str, Session] = {}

    def touch(self, owner: UeKey, s: Session) -> None:
        queue = self.waiting.setdefault(owner, [])
        if s in queue:
            queue.remove(s)
        queue.append(s)

    def answered(self, owner: UeKey, s: Session) -> None:
        if s in self.waiting.get(owner, []):
            self.waiting[owner].remove(s)

    def get(self, owner: UeKey, psi: int, frame: int, new: bool = False) -> Session:
        if new or (owner, psi) not in self.current:
            n = self.count[(owner, psi)] = self.count.get((owner, psi), 0) + 1
            self.current[(owner, psi)] = (owner, psi, n)
            self.sessions[(owner, psi, n)] = Session(first_frame=frame)
        return self.sessions[self.current[(owner, psi)]]

    def existing(self, owner: UeKey, psi: int) -> Session | None:
        key = self.current.get((owner, psi))
        return self.sessions[key] if key else None


def _sessions(rows: list[Row], owners: list[UeKey | None]) -> dict[tuple[UeKey, int, int], Session]:
    book = _Book()
    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        _nas(book, row, owner)
        nas_pdu = (row.values.get("ngap.NAS_PDU") or [None])[0]
        accepted = book.existing(owner, row.one("nas_5gs.pdu_session_id") or 0) if (row.proc, row.pdu_type) == (
            4, 0) and nas_pdu and SM_ACCEPT in row.ints("nas_5gs.sm.message_type") else None
        if accepted is not None and nas_pdu:
            book.downlink[nas_pdu] = accepted
        if (row.proc, row.pdu_type) == (19, 0) and nas_pdu in book.downlink:  # returned: never delivered
            book.downlink.pop(nas_pdu).not_delivered = True
        if MM_STATUS in row.ints("nas_5gs.mm.message_type") and book.waiting.get(owner):
            book.waiting[owner].pop().ended_unanswered = True  # it answers the UE's latest NAS exchange
        if row.proc in UE_CONTEXT_RELEASES and row.pdu_type == 0:
            for waiting in book.waiting.pop(owner, []):
                waiting.ended_unanswered = True
        if (row.proc, row.pdu_type) == (14, 2):
            for waiting in [x for (o, _, _), x in book.sessions.items() if o == owner and x.setup_in_ics
                            and x.setup_response_frame is None]:
                waiting.carrier_failed = True
        psis = sorted(set(row.ints("ngap.pDUSessionID")))
        if row.proc in N2_SETUP and psis:
            if len(psis) > 1:
                raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup")
            _n2(book, row, owner, psis[0])
    return book.sessions


def _nas(book: _Book, row: Row, owner: UeKey) -> None:
    sm = row.ints("nas_5gs.sm.message_type")
    psi = row.one("nas_5gs.pdu_session_id")
    mm_cause = row.one("nas_5gs.mm.5gmm_cause")
    returned = DL_NAS_TRANSPORT in row.ints("nas_5gs.mm.message_type") and mm_cause is not None
    if returned and psi is not None:
        s = book.get(owner, psi, row.frame)  # a 5GSM message returned unforwarded by the AMF
        s.returned_by_amf_frame = row.frame
        book.answered(owner, s)
        s.failures.append((row.frame, "5GMM", mm_cause, cause_name("nas_5gs.mm.5gmm_cause", mm_cause)))
    # The 5GSM message a DL NAS TRANSPORT with a 5GMM cause carries is the UE's own, handed back unforwarded
    # (TS 24.501 5.4.5.2.5): no new message of the session.
    if not sm or psi is None or returned:
        return
    if len(sm) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several 5GSM messages in one PDU")
    s = book.get(owner, psi, row.frame, new=sm[0] == SM_REQUEST)
    cause = row.one("nas_5gs.sm.5gsm_cause")
    if sm[0] == SM_REQUEST:
        s.establishment_request_frame, s.dnn = row.frame, single(row, "nas_5gs.cmn.dnn")
        book.touch(owner, s)
    elif sm[0] == SM_ACCEPT:
        if s.establishment_request_frame is not None and not s.ended_unanswered:
            book.touch(owner, s)
        s.establishment_accept_frame = row.frame
        s.accept_in_n2_setup = row.proc in N2_SETUP and row.pdu_type == 0
        s.ue_ipv4 = single(row, "nas_5gs.sm.pdu_addr_inf_ipv4")
        s.dnn = single(row, "nas_5gs.cmn.dnn") or s.dnn
    elif sm[0] == SM_REJECT:
        s.establishment_reject_frame = row.frame
        book.answered(owner, s)
    elif sm[0] in SM_RELEASE_FRAMES:
        release = s.release = s.release or {}
        release[SM_RELEASE_FRAMES[sm[0]]] = row.frame
        if cause is not None:
            release.update(cause=cause, cause_text=value_names("nas_5gs.sm.5gsm_cause").get(cause),
                           normal=cause in NORMAL_5GSM)
    sst, sd = single(row, "nas_5gs.mm.sst"), single(row, "nas_5gs.mm.mm_sd")
    if sst is not None and s.s_nssai is None:
        s.s_nssai = {"sst": f"{int(sst, 0):02x}", "sd": f"{int(sd, 0):06x}" if sd is not None else None}
    if sm[0] in SM_FAILURES or (sm[0] in SM_RELEASES and cause is not None and cause not in NORMAL_5GSM):
        s.failures.append((row.frame, "5GSM", cause, cause_name("nas_5gs.sm.5gsm_cause", cause)))


def _n2(book: _Book, row: Row, owner: UeKey, psi: int) -> None:
    if row.pdu_type == 0:
        s = book.get(owner, psi, row.frame)
        if s.setup_request_frame is not None and s.setup_result is not None:
            return  # a later user-plane activation of an established session
        s.setup_request_frame = row.frame
        s.setup_in_ics = row.proc == 14
        s.n3_uplink, extra = tunnels(row, request=True)
        s.n3_uplink_additional = extra or None
        s.qfis = sorted(set(row.ints("ngap.qosFlowIdentifier")))
        if single(row, "ngap.sST") is not None:
            s.s_nssai = {"sst": single(row, "ngap.sST"), "sd": single(row, "ngap.sD")}
        return
    found = book.existing(owner, psi)
    if found is None or found.setup_request_frame is None or found.setup_response_frame is not None:
        return  # answers no request seen in the capture
    found.setup_response_frame = row.frame
    book.answered(owner, found)
    if any(row.ints(name) for name in SETUP_OK_LISTS):
        found.setup_result = "setup"
        found.n3_downlink, extra = tunnels(row, request=False)
        found.n3_downlink_additional = extra or None
    else:
        found.setup_result = "failed"
        codes = [(g, int(v)) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
        group, code = codes[0] if len(codes) == 1 else ("", None)
        found.failures.append((row.frame, "NGAP", code, cause_name(group, code)))
