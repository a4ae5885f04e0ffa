"""A second, independent answer to ngap_ue_sessions(view="procedures"), from `tshark -T fields` rows.

It reads the one-PDU-per-row field rows of tests/support/ngap_oracle.py (not sharkd's trees) and
follows the rules docs/5g.md states, written out again here by message-type numbers:

- NAS: only a row's first 5GMM message type is its own (a further one after a SECURITY MODE
  COMPLETE is the REGISTRATION REQUEST in its container); its 5GSM type rides in a NAS transport,
  except one a DL NAS TRANSPORT with a 5GMM cause hands back (the UE's own, not a new message).
- A start message opens an instance per (UE context, procedure[, PDU session id]); the same
  start message again abandons the open one as incomplete, another start message of the same
  procedure continues it. An answer closes it; 5GMM STATUS (no PDU session id) closes the context's
  establishment whose message came last. What is still open at the end is incomplete.
- Verdicts by the spec: a switch-off DEREGISTRATION REQUEST ends itself (no accept); AUTHENTICATION
  REJECT also rejects the registration; an establishment accepted inside an N2 setup request ends
  with that request's response (set up: success, failed list: failure) or fails with a UE context
  release; one accepted by a NAS transport alone stays incomplete (no N2 setup carried it).
- An accept reaches the UE only if its carrier did: a REGISTRATION / SERVICE / PDU SESSION ESTABLISHMENT
  ACCEPT inside an InitialContextSetupRequest (TS 38.413 8.3.1) is delivered by the InitialContextSetupResponse
  and lost with the InitialContextSetupFailure (8.3.1.3: failure). A REGISTRATION ACCEPT giving a new 5G-GUTI
  (a 5G-TMSI in it) is done only when the UE's REGISTRATION COMPLETE acknowledges it (TS 24.501 5.5.1.2.4);
  none in the capture: incomplete.
- NGAP class-1 procedures of a UE context (TS 38.413 8.2.1-8.2.3, 8.3.1, 8.3.3, 8.4.*) end with their
  successful / unsuccessful outcome, or fail with an ERROR INDICATION of the context from the peer of the
  latest one in flight (8.7.5, 10: the peer could not process it; a UE context release by its own rule).
- An accept a DownlinkNASTransport carried did not reach the UE when a NAS NON DELIVERY INDICATION returns the
  same NAS-PDU octets (8.6.4): the registration / service request / establishment fails, even one the accept had
  ended. A PAGING (8.5.1, class 2, not UE-associated) is answered by the first later row presenting its
  5G-S-TMSI (AMF Set ID, AMF Pointer, 5G-TMSI) as a paged UE does (TS 24.501 5.6.2.2.1): a SERVICE REQUEST or
  REGISTRATION REQUEST whose mobile identity holds it, an InitialUEMessage's 5G-S-TMSI IE; else no response.
- The same request again after an accept names the accept and what did not follow it (a REGISTRATION
  COMPLETE for a new 5G-GUTI, the N2 response delivering it). NG Reset (8.7.4) is not UE-associated: one
  instance per association, keyed (association, None, None, 0). An N2 PDU session resource setup request item
  of a session whose establishment accept is not in that PDU re-activates the user plane of a session
  established before (TS 24.501 5.6.1.4): its own instance, set up or failed by the response's lists (or lost
  with an InitialContextSetupFailure).
- Each instance names the rule row (docs/5g.md) that decided it, from the message and condition
  seen here; a failure's cause carries the name `tshark -G values` gives its code and, for NGAP,
  the cause field's group; an establishment its accept's PDU address; an incomplete instance the
  frames its reason must name (the restart, the accept, the UE context's last frame).
- Durations are last minus first frame time in ms (rounded to µs), for closed instances only;
  percentiles are nearest rank.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tests.support.ngap_oracle import (
    CAUSE_GROUPS,
    CLASS1,
    OracleCannotTell,
    Row,
    UeKey,
    cause_name,
    contexts,
    disk_cached,
    owned_rows,
)

# event -> [(procedure, role, rule id)]; events: ("mm", type), ("sm", type), ("ngap", code, pdu type), ("returned",).
# Rule ids are the rows docs/5g.md names (one per way a procedure ends, each with its clause).
TABLE: dict[tuple[int | str, ...], list[tuple[str, str, str]]] = {}


def _add(name: str, role: str, rule: str, *events: tuple[int | str, ...]) -> None:
    for event in events:
        TABLE.setdefault(event, []).append((name, role, rule))


_add("Registration", "start", "", ("mm", 0x41))
_add("Registration", "nas-accept", "registration-accept", ("mm", 0x42))  # once delivered (and acknowledged)
_add("Registration", "success", "registration-complete", ("mm", 0x43))
_add("Registration", "reject", "registration-reject", ("mm", 0x44))
_add("Registration", "reject", "registration-auth-reject", ("mm", 0x58))  # TS 24.501 5.4.1.3.5: auth reject ends it
_add("Authentication", "start", "", ("mm", 0x56))
_add("Authentication", "success", "authentication-response", ("mm", 0x57))
_add("Authentication", "reject", "authentication-reject", ("mm", 0x58))
_add("Authentication", "failure", "authentication-failure", ("mm", 0x59))
_add("Security Mode", "start", "", ("mm", 0x5D))
_add("Security Mode", "success", "security-mode-complete", ("mm", 0x5E))
_add("Security Mode", "failure", "security-mode-reject", ("mm", 0x5F))
_add("Service Request", "start", "", ("mm", 0x4C))
_add("Service Request", "nas-accept", "service-accept", ("mm", 0x4E))  # once delivered
_add("Service Request", "reject", "service-reject", ("mm", 0x4D))
_add("Deregistration", "start", "", ("mm", 0x45), ("mm", 0x47))
_add("Deregistration", "success", "deregistration-accept", ("mm", 0x46), ("mm", 0x48))
_add("PDU Session Establishment", "start", "", ("sm", 0xC1))
# Its accept rides in the N2 setup request; the N2 setup response ends it (TS 38.413 8.2.1.2 / 8.3.1.2).
_add("PDU Session Establishment", "accepted", "", ("sm", 0xC2))
_add("PDU Session Establishment", "reject", "pdu-reject", ("sm", 0xC3))
_add("PDU Session Establishment", "reject", "pdu-returned", ("returned",))
_add("PDU Session Establishment", "failure", "pdu-5gmm-status", ("mm", 0x64))
_add("PDU Session Modification", "start", "", ("sm", 0xC9), ("sm", 0xCB))
_add("PDU Session Modification", "success", "modification-complete", ("sm", 0xCC))
_add("PDU Session Modification", "reject", "modification-reject", ("sm", 0xCA))
_add("PDU Session Modification", "failure", "modification-command-reject", ("sm", 0xCD))
_add("PDU Session Release", "start", "", ("sm", 0xD1), ("sm", 0xD3))
_add("PDU Session Release", "success", "release-complete", ("sm", 0xD4))
_add("PDU Session Release", "reject", "release-reject", ("sm", 0xD2))
for _code, _name, _ok, _failed in ((12, "Handover Preparation", "handover-command", "handover-preparation-failure"),
                                   (13, "Handover Resource Allocation", "handover-request-ack", "handover-failure"),
                                   (25, "Path Switch", "path-switch-ack", "path-switch-failure")):
    _add(_name, "start", "", ("ngap", _code, 0))
    _add(_name, "success", _ok, ("ngap", _code, 1))
    _add(_name, "failure", _failed, ("ngap", _code, 2))
_add("UE Context Release", "start", "", ("ngap", 42, 0), ("ngap", 41, 0))
_add("UE Context Release", "success", "ue-context-release-complete", ("ngap", 41, 1))
_add("Initial Context Setup", "start", "", ("ngap", 14, 0))
_add("Initial Context Setup", "success", "initial-context-setup-response", ("ngap", 14, 1))
_add("Initial Context Setup", "failure", "initial-context-setup-failure", ("ngap", 14, 2))
for _code, _name, _ok in ((29, "PDU Session Resource Setup", "pdu-resource-setup-response"),
                          (26, "PDU Session Resource Modify", "pdu-resource-modify-response"),
                          (28, "PDU Session Resource Release", "pdu-resource-release-response")):
    _add(_name, "start", "", ("ngap", _code, 0))
    _add(_name, "success", _ok, ("ngap", _code, 1))
# Started per N2 setup request item (not by the message itself): handled by _reactivations.
_add("PDU Session Re-activation", "start", "", ("ngap", 29, 0), ("ngap", 14, 0))
_add("NG Reset", "start", "", ("ngap", 20, 0))
_add("NG Reset", "success", "ng-reset-acknowledge", ("ngap", 20, 1))
_add("Paging", "start", "", ("ngap", 24, 0))  # class 2: answered by the paged UE showing up (_pagings)
REACTIVATION, NG_RESET, PAGING = "PDU Session Re-activation", "NG Reset", "Paging"
# TS 38.413 table 8.1-1: the class-1 procedures of a UE context (started by an NGAP initiating message of CLASS1).
N2_CLASS1 = {name for event, roles in TABLE.items() if event[0] == "ngap" and event[2] == 0 and event[1] in CLASS1
             for name, role, _ in roles if role == "start"} - {REACTIVATION, NG_RESET}
# An accept sent in a DownlinkNASTransport and returned by a NAS NON DELIVERY INDICATION (TS 38.413 8.6.4).
NOT_DELIVERED = {"Registration": "registration-accept-non-delivery", "Service Request": "service-accept-non-delivery",
                 "PDU Session Establishment": "pdu-accept-non-delivery"}
# The N2 request that carried an establishment's accept names the rule its response sets the session up by.
N2_SETUP_RULES = {29: "pdu-setup-response", 14: "pdu-initial-context-setup"}
PER_SESSION = {"PDU Session Establishment", "PDU Session Modification", "PDU Session Release", REACTIVATION}

Found = tuple[UeKey, str, int | None, int, int, float | None, str, str | None, int | None]
Event = tuple[int | str, ...]


class Cause(NamedTuple):
    """A closing message's cause: its layer, code, the name `tshark -G values` gives it and its NGAP group."""

    kind: str
    code: int | None
    name: str | None
    group: str | None  # NGAP: radioNetwork, transport, nas, protocol or misc (the cause field's name); NAS: None


class Detail(NamedTuple):
    """One instance as Found writes it, plus what Found leaves out."""

    found: Found
    cause: Cause | None
    rule_id: str
    ue_ipv4: str | None  # the PDU address of the establishment's accept
    # What an incomplete instance's `why` says, in order: it starts with the first part and ends with the last,
    # unless that ends with "(" (a figure the oracle does not give follows: the ms since the last message).
    why_says: tuple[str, ...]
    by: UeKey | None = None  # a PAGING: the UE context that answered it


@dataclass
class Open:
    start: Event
    first: Row
    last: Row
    frames: list[int] = field(default_factory=list)
    accept: int | None = None  # establishment: the frame of its accept
    n2_rule: str | None = None  # establishment: the rule the response to the N2 request carrying it decides by
    ue_ipv4: str | None = None
    carrier: int | None = None  # the InitialContextSetupRequest frame whose outcome delivers its accept
    guti_tmsi: int | None = None  # registration: the 5G-TMSI of the new 5G-GUTI its accept gave


def non_ue_key(assoc: tuple[str, str, int]) -> UeKey:
    """How an instance of no UE context (NG Reset) is keyed: its association, no ids."""
    return (*assoc, None, None, 0)


def sender(row: Row) -> str:
    return f"{row.values.get('ip.src', ['?'])[0]}:{row.values.get('sctp.srcport', ['?'])[0]}"


def ngap_cause(row: Row) -> Cause | None:
    """The first NGAP cause of a row, named as tshark names it."""
    found = [(g, int(v)) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
    if not found:
        return None
    group, code = found[0]
    return Cause("NGAP", code, cause_name(group, code), group.removeprefix("ngap."))


def _events(row: Row) -> list[tuple[Event, Cause | None]]:
    """(event, cause) in the order diagd reads a PDU: NGAP, 5GMM, 5GSM."""
    mm, sm = row.ints("nas_5gs.mm.message_type"), row.ints("nas_5gs.sm.message_type")
    # A further 5GMM type is the message a container carries: the REGISTRATION REQUEST in a SECURITY MODE COMPLETE
    # (24.501 5.4.2.3), or an initial message again, whole, in its own NAS message container (4.4.6).
    if len(mm) > 1 and mm[:2] not in ([0x5E, 0x41], [0x4C, 0x4C], [0x41, 0x41]):
        raise OracleCannotTell(f"frame {row.frame}: 5GMM types {mm}: which are nested is not clear from fields")
    if len(sm) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several 5GSM messages")
    mm_cause, sm_cause = row.one("nas_5gs.mm.5gmm_cause"), row.one("nas_5gs.sm.5gsm_cause")
    mm_named = None if mm_cause is None else Cause("5GMM", mm_cause, cause_name("nas_5gs.mm.5gmm_cause", mm_cause),
                                                   None)
    out: list[tuple[Event, Cause | None]] = [(("ngap", row.proc, row.pdu_type), ngap_cause(row))]
    returned = bool(mm) and mm[0] == 0x68 and mm_named is not None
    if mm:
        if returned:
            out.append((("returned",), mm_named))
        out.append((("mm", mm[0]), mm_named))
    if sm and not returned:  # a returned message is the UE's own, handed back (TS 24.501 5.4.5.2.5): no new event
        out.append((("sm", sm[0]), None if sm_cause is None else
                    Cause("5GSM", sm_cause, cause_name("nas_5gs.sm.5gsm_cause", sm_cause), None)))
    return out


def answer(path: Path) -> list[Found]:
    """Every procedure instance of the capture."""
    return [d.found for d in details(path)]


def details(path: Path) -> list[Detail]:
    """Every procedure instance with its cause name and group, rule, UE address and reason (kept on disk:
    the mutation gate asks often)."""
    return disk_cached(path, "procedure-details", lambda p: _answer(p)[0])


def orphans(path: Path) -> list[tuple[UeKey, str, str]]:
    """(UE, procedure, rule id) of each answer whose request is not in the capture, in capture order."""
    return disk_cached(path, "procedure-orphans", lambda p: _answer(p)[1])


Slot = tuple[UeKey, str, int | None]


def _answer(path: Path) -> tuple[list[Detail], list[tuple[UeKey, str, str]]]:
    rows, owners, ended = contexts(path)
    last_of = {owner: row.frame for row, owner in zip(rows, owners, strict=True) if owner is not None}
    opened: dict[Slot, Open] = {}
    found: list[Detail] = []
    orphaned: list[tuple[UeKey, str, str]] = []
    order: dict[Slot, int] = {}
    tick = itertools.count()

    def ms(a: Row, b: Row) -> float:
        return round((b.time - a.time) * 1000, 3)

    def close(slot: Slot, o: Open, outcome: str, cause: Cause | None, rule: str, why: tuple[str, ...] = ()) -> None:
        failed = outcome in ("reject", "failure")
        found.append(Detail((slot[0], slot[1], slot[2], o.first.frame, o.last.frame,
                             None if outcome == "incomplete" else ms(o.first, o.last), outcome,
                             cause.kind if failed and cause else None, cause.code if failed and cause else None),
                            cause if failed else None, rule, o.ue_ipv4, why))

    resets: dict[tuple[str, str, int], Open] = {}
    position = {id(row): n for n, row in enumerate(rows)}
    pagings: list[Paged] = []
    downlink: dict[str, tuple[Slot, Open, int | None]] = {}  # NAS-PDU of a DL NAS transport with an accept
    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            if (row.proc, row.pdu_type) == (24, 0):
                pagings.append(Paged(row, paging_identity(row)))
            _ng_reset(row, resets, close)
            continue
        if any(p.answer is None for p in pagings):
            shown = presented(row)
            for p in pagings:
                if p.answer is None and p.identity in shown:
                    p.answer, p.by = row, owner
        psi = row.one("nas_5gs.pdu_session_id")
        if row.values.get("nas_5gs.mm.switch_off") == ["1"] and row.ints("nas_5gs.mm.message_type")[:1] == [0x45]:
            found.append(Detail((owner, "Deregistration", None, row.frame, row.frame, 0.0, "success", None, None),
                                None, "deregistration-switch-off", None, ()))
            continue
        for event, cause in _events(row):
            if event == ("ngap", 9, 0):
                _error_indication(row, owner, opened, position, close)
                continue
            for name, role, rule in TABLE.get(event, []):
                if name in (REACTIVATION, NG_RESET):
                    continue
                slot: Slot = (owner, name, psi if name in PER_SESSION else None)
                if role == "nas-accept":
                    if slot not in opened:
                        orphaned.append((owner, name, rule))
                        continue
                    o = opened[slot]
                    o.last, o.accept = row, row.frame
                    if o.frames[-1] != row.frame:
                        o.frames.append(row.frame)
                    o.carrier = row.frame if (row.proc, row.pdu_type) == (14, 0) else None
                    o.guti_tmsi = row.one("nas_5gs.5g_tmsi") if event == ("mm", 0x42) else None
                    closed = None
                    if o.carrier is None and o.guti_tmsi is None:
                        close(slot, opened.pop(slot), "success", None, rule)
                        closed = len(found) - 1
                    if (row.proc, row.pdu_type) == (4, 0) and row.values.get("ngap.NAS_PDU"):
                        downlink[row.values["ngap.NAS_PDU"][0]] = (slot, o, closed)
                    continue
                if role == "accepted":
                    if slot in opened:
                        o = opened[slot]
                        o.last, o.accept = row, row.frame
                        o.ue_ipv4 = (row.values.get("nas_5gs.sm.pdu_addr_inf_ipv4") or [None])[0]
                        o.n2_rule = N2_SETUP_RULES.get(row.proc) if row.pdu_type == 0 else None
                        o.carrier = row.frame if (row.proc, row.pdu_type) == (14, 0) else None
                        order[slot] = next(tick)
                        if (row.proc, row.pdu_type) == (4, 0) and row.values.get("ngap.NAS_PDU"):
                            downlink[row.values["ngap.NAS_PDU"][0]] = (slot, o, None)
                    continue
                if role == "start":
                    if slot in opened and opened[slot].start != event:
                        opened[slot].last = row
                        if opened[slot].frames[-1] != row.frame:
                            opened[slot].frames.append(row.frame)
                        continue
                    if slot in opened:
                        o = opened.pop(slot)
                        close(slot, o, "incomplete", None, "restarted", (restarted(name, row, o),))
                    opened[slot] = Open(event, row, row, [row.frame])
                    order[slot] = next(tick)
                    continue
                if slot not in opened and name in PER_SESSION and event[0] == "mm" and psi is None:
                    mine = sorted((s for s in opened if s[0] == owner and s[1] == name), key=lambda s: order[s])
                    slot = mine[-1] if mine else slot
                if slot not in opened:
                    orphaned.append((owner, name, rule))
                    continue
                o = opened.pop(slot)
                o.last = row
                close(slot, o, role, cause, rule)
        if (row.proc, row.pdu_type) == (19, 0) and row.values.get("ngap.NAS_PDU"):
            _not_delivered(row, downlink.pop(row.values["ngap.NAS_PDU"][0], None), opened, found, close)
        _reactivations(row, owner, opened, order, tick, close)
        _n2_answers(row, owner, opened, close)
        if row.proc == 14 and row.pdu_type in (1, 2):
            _carried(row, owner, opened, close)
    last_in_assoc = {row.assoc: row.frame for row in rows}
    for p in pagings:  # TS 38.413 8.5.1 (class 2): answered when the paged UE showed up, else no response
        slot = (non_ue_key(p.row.assoc), PAGING, None)
        if p.answer is not None:
            close(slot, Open(("ngap", 24, 0), p.row, p.answer), "success", None, "paging-answered")
            found[-1] = found[-1]._replace(by=p.by)
            continue
        says = f"no UE presented the paged 5G-S-TMSI ({words(p.identity)}) after it: "
        close(slot, Open(("ngap", 24, 0), p.row, p.row), "incomplete", None, "paging-no-response",
              (says + f"the capture's NGAP went on until frame {rows[-1].frame} (",) if rows[-1].frame > p.row.frame
              else (says + "the capture ends with the PAGING",))
    for assoc, o in resets.items():
        close((non_ue_key(assoc), NG_RESET, None), o, "incomplete", None, "unanswered", (
            f"no answer: the association carried NGAP until frame {last_in_assoc[assoc]}",)
              if last_in_assoc[assoc] > o.last.frame else ("the capture ends before any answer",))

    def _silence(owner: UeKey, o: Open) -> tuple[str, ...]:
        """Why no answer, from what came after the instance's last message: more of its UE context, the context's
        end (a reused id ended it: ngap_oracle.contexts), more of its association, or nothing (the capture ends)."""
        if last_of[owner] > o.last.frame:
            return (f"no answer: the UE context carried NGAP until frame {last_of[owner]} (",)
        if ended[owner] is not None:
            return (f"no answer before the UE context ended ({ended[owner]})",)
        if last_in_assoc[owner[:3]] > o.last.frame:
            return ("no answer: this UE context fell silent while its association carried NGAP until frame "
                    f"{last_in_assoc[owner[:3]]}",)
        return ("the capture ends before any answer",)

    for slot, o in opened.items():
        if slot[1] == "Registration" and o.accept is not None and o.carrier is None:
            close(slot, o, "incomplete", None, "registration-complete-missing", (
                f"accepted in frame {o.accept} with a new 5G-GUTI (5G-TMSI {o.guti_tmsi}), then no REGISTRATION "
                "COMPLETE: ", *_silence(slot[0], o)))
            continue
        if slot[1] == "PDU Session Establishment" and o.accept is not None and o.n2_rule is None:
            close(slot, o, "incomplete", None, "pdu-accept-without-n2",
                  (f"accepted in frame {o.accept} by a NAS transport; no N2 PDU session resource setup carried "
                   "the accept",))
            continue
        says = _silence(slot[0], o)
        if o.accept is not None:
            carrier = "InitialContextSetup" if slot[1] in ("Registration", "Service Request") else "N2 setup"
            says = (f"accepted in frame {o.accept}, then no {carrier} response: ", *says)
        close(slot, o, "incomplete", None, "unanswered", says)
    return found, orphaned


# TS 38.413 9.3.3.20 / TS 23.003 2.10.1: a 5G-S-TMSI is AMF Set ID (BIT STRING of 10), AMF Pointer (BIT STRING of 6)
# and 5G-TMSI (4 octets); tshark prints an NGAP bit string as its octets, the bits left-aligned (0040: set 1).
STmsi = tuple[int, int, int]


@dataclass
class Paged:
    """A PAGING (not UE-associated), its 5G-S-TMSI, and the first row presenting it after it, with that row's UE."""

    row: Row
    identity: STmsi
    answer: Row | None = None
    by: UeKey | None = None


def _bits(octets: str, size: int) -> int:
    return int(octets, 16) >> (len(octets) * 4 - size)


def paging_identity(row: Row) -> STmsi:
    """The one 5G-S-TMSI of a row's NGAP: a PAGING's UEPagingIdentity (IE 115), an InitialUEMessage's 5G-S-TMSI."""
    sets, pointers, tmsis = (row.values.get(f, []) for f in ("ngap.aMFSetID", "ngap.aMFPointer", "ngap.fiveG_TMSI"))
    if (len(sets), len(pointers), len(tmsis)) != (1, 1, 1):
        raise OracleCannotTell(f"frame {row.frame}: {len(tmsis)} NGAP 5G-TMSIs, not one")
    return _bits(sets[0], 10), _bits(pointers[0], 6), int(tmsis[0], 0)


def presented(row: Row) -> set[STmsi]:
    """The 5G-S-TMSIs a row presents as a paged UE answers (TS 24.501 5.6.2.2.1): the 5GS mobile identity of a
    SERVICE REQUEST or REGISTRATION REQUEST (a 5G-S-TMSI, or a 5G-GUTI that holds one), and an InitialUEMessage's
    5G-S-TMSI IE."""
    found: set[STmsi] = set()
    if (row.proc, row.pdu_type) == (15, 0) and row.values.get("ngap.fiveG_TMSI"):
        found.add(paging_identity(row))
    if {0x41, 0x4C} & set(row.ints("nas_5gs.mm.message_type")):
        sets, pointers = row.ints("nas_5gs.amf_set_id"), row.ints("nas_5gs.amf_pointer")
        tmsis = row.ints("nas_5gs.5g_tmsi")
        if not len(sets) == len(pointers) == len(tmsis):
            raise OracleCannotTell(f"frame {row.frame}: 5G-S-TMSI parts that do not pair up")
        found |= set(zip(sets, pointers, tmsis, strict=True))
    return found


def words(s: STmsi) -> str:
    return f"AMF Set ID {s[0]}, AMF Pointer {s[1]}, 5G-TMSI {s[2]}"

def restarted(name: str, row: Row, o: Open) -> str:
    """Why the same request again abandons an instance: nothing answered it yet, or its accept was sent and what had
    to follow never came: the REGISTRATION COMPLETE a new 5G-GUTI needs (TS 24.501 5.5.1.2.4), the N2 response that
    delivers the accept (TS 38.413 8.3.1) or sets the session up (8.2.1)."""
    said = f"a new {name} started in frame {row.frame}"
    if o.accept is None:
        return said + " before any answer"
    said += f", after its accept (frame {o.accept}) and before "
    if o.carrier is not None:
        return said + "the InitialContextSetup response that would deliver it"
    if o.guti_tmsi is not None:
        return said + (f"its REGISTRATION COMPLETE: the accept gave a new 5G-GUTI (5G-TMSI {o.guti_tmsi}), never "
                       "acknowledged")
    if o.n2_rule is not None:
        return said + "the N2 setup response that would set the session up"
    return said + "any N2 PDU session resource setup carrying it"


def _error_indication(row: Row, owner: UeKey, opened: dict[Slot, Open], position: dict[int, int],
                      close: Callable[..., None]) -> None:
    """An ERROR INDICATION of a UE context (TS 38.413 8.7.5, 10): the peer could not process the class-1 request in
    flight, the latest of the context whose last message the other side sent; it fails (a UE context release by its
    own rule). From the same side, or with none in flight, it ends nothing."""
    waiting = [s for s in opened if s[0] == owner and s[1] in N2_CLASS1 and sender(opened[s].last) != sender(row)]
    if not waiting:
        return
    slot = max(waiting, key=lambda s: position[id(opened[s].last)])
    o = opened.pop(slot)
    o.last = row
    close(slot, o, "failure", ngap_cause(row), "ue-context-release-error-indication" if slot[1] == "UE Context Release"
          else "n2-error-indication")


def _not_delivered(row: Row, sent: tuple[Slot, Open, int | None] | None, opened: dict[Slot, Open],
                   found: list[Detail], close: Callable[..., None]) -> None:
    """A NAS NON DELIVERY INDICATION returns a DownlinkNASTransport's NAS-PDU (TS 38.413 8.6.4, the same octets): the
    accept in it never reached the UE, whether the instance still waited or that accept had ended it (then its
    verdict is replaced). An instance something later ended (a REGISTRATION COMPLETE) keeps its verdict."""
    if sent is None:
        return
    slot, o, closed = sent
    if opened.get(slot) is o:
        opened.pop(slot)
    elif closed is None or found[closed].rule_id not in ("registration-accept", "service-accept"):
        return
    o.last = row
    close(slot, o, "failure", ngap_cause(row), NOT_DELIVERED[slot[1]])
    if closed is not None:  # decided again: the new verdict replaces the accept's
        found[closed] = found.pop()


def _ng_reset(row: Row, resets: dict[tuple[str, str, int], Open], close: Callable[..., None]) -> None:
    """NG RESET (either side) and its NG RESET ACKNOWLEDGE on one association (TS 38.413 8.7.4)."""
    slot = (non_ue_key(row.assoc), NG_RESET, None)
    if (row.proc, row.pdu_type) == (20, 0):
        if row.assoc in resets:
            close(slot, resets.pop(row.assoc), "incomplete", None, "restarted",
                  (f"a new NG Reset started in frame {row.frame} before any answer",))
        resets[row.assoc] = Open(("ngap", 20, 0), row, row, [row.frame])
    elif (row.proc, row.pdu_type) == (20, 1) and row.assoc in resets:
        o = resets.pop(row.assoc)
        o.last = row
        close(slot, o, "success", None, "ng-reset-acknowledge")


def _reactivations(row: Row, owner: UeKey, opened: dict[Slot, Open], order: dict[Slot, int],
                   tick: itertools.count[int], close: Callable[..., None]) -> None:
    """Each session an N2 setup request sets up without its establishment accept beside it: a re-activation."""
    if row.proc not in (29, 14) or row.pdu_type != 0:
        return
    accepted = row.one("nas_5gs.pdu_session_id") if 0xC2 in row.ints("nas_5gs.sm.message_type") else None
    for psi in sorted(set(row.ints("ngap.pDUSessionID")) - {accepted}):
        slot = (owner, REACTIVATION, psi)
        event = ("ngap", row.proc, 0)
        if slot in opened and opened[slot].start != event:
            opened[slot].last = row
            if opened[slot].frames[-1] != row.frame:
                opened[slot].frames.append(row.frame)
        else:
            if slot in opened:
                close(slot, opened.pop(slot), "incomplete", None, "restarted",
                      (f"a new {REACTIVATION} started in frame {row.frame} before any answer",))
            opened[slot] = Open(event, row, row, [row.frame])
        opened[slot].carrier = row.frame if row.proc == 14 else None
        order[slot] = next(tick)


def _carried(row: Row, owner: UeKey, opened: dict[Slot, Open], close: Callable[..., None]) -> None:
    """An InitialContextSetupResponse (1) / Failure (2): what its request carried reached the UE / did not."""
    delivered = row.pdu_type == 1
    for slot in [s for s in opened if s[0] == owner and opened[s].carrier is not None]:
        o = opened[slot]
        o.carrier = None
        o.last = row
        if o.frames[-1] != row.frame:
            o.frames.append(row.frame)
        cause = None if delivered else ngap_cause(row)
        if slot[1] == "Registration" and (not delivered or o.guti_tmsi is None):
            close(slot, opened.pop(slot), "success" if delivered else "failure", cause,
                  "registration-accept" if delivered else "registration-accept-undelivered")
        elif slot[1] == "Service Request":
            close(slot, opened.pop(slot), "success" if delivered else "failure", cause,
                  "service-accept" if delivered else "service-accept-undelivered")
        elif not delivered and slot[1] in ("PDU Session Establishment", REACTIVATION):
            close(slot, opened.pop(slot), "failure", cause,
                  "pdu-accept-undelivered" if slot[1] == "PDU Session Establishment" else "reactivation-failed")


def _n2_answers(row: Row, owner: UeKey, opened: dict[Slot, Open], close: Callable[..., None]) -> None:
    """An N2 setup response (or a UE context release) ends the establishments waiting for it."""
    if row.proc in (29, 14) and row.pdu_type != 0:
        ok = sum(row.ints("ngap.PDUSessionResourceSetupListSURes") + row.ints("ngap.PDUSessionResourceSetupListCxtRes"))
        failed = sum(row.ints("ngap.PDUSessionResourceFailedToSetupListSURes")
                     + row.ints("ngap.PDUSessionResourceFailedToSetupListCxtRes"))
        psis = sorted(set(row.ints("ngap.pDUSessionID")))
        waiting = [p for p in psis if (o := opened.get((owner, "PDU Session Establishment", p))) and o.n2_rule]
        if (len(psis) != 1 or ok + failed != 1) and any((owner, REACTIVATION, p) in opened for p in psis):
            raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup response")
        if len(psis) != 1 or ok + failed != 1:
            if waiting:
                raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup response")
            return
        slot = (owner, "PDU Session Establishment", psis[0])
        if waiting:
            o = opened.pop(slot)
            o.last = row
            if ok:
                close(slot, o, "success", None, o.n2_rule)
            else:
                close(slot, o, "failure", ngap_cause(row) or Cause("NGAP", None, None, None), "pdu-setup-failed")
        elif (again := (owner, REACTIVATION, psis[0])) in opened:
            o = opened.pop(again)
            o.last = row
            if ok:
                close(again, o, "success", None, "reactivation-setup")
            else:
                close(again, o, "failure", ngap_cause(row) or Cause("NGAP", None, None, None), "reactivation-failed")
    elif row.proc in (41, 42) and row.pdu_type == 0:
        for slot in [s for s in opened if s[0] == owner and s[1] == "PDU Session Establishment"]:
            o = opened.pop(slot)
            o.last = row
            close(slot, o, "failure", ngap_cause(row), "pdu-context-released")


def nearest_rank(values: list[float], p: int) -> float:
    n = len(values)
    return sorted(values)[-(-n * p // 100) - 1]


class Link(NamedTuple):
    """One N4/SBI request of a PDU session establishment, and what links it to the establishment."""

    interface: str  # N4 | SBI
    frame: int
    response_frame: int | None
    by: str  # "UE IPv4" (PFCP PDI or JSON ueIpv4Address = the accept's PDU address), "SUPI" (path or JSON), "window"


SBI_PATH = r"^/(nsmf-pdusession/v1/(sm-contexts|pdu-sessions)|namf-comm/v1/ue-contexts/[^/]+/n1-n2-messages)$"


def _lines(path: Path, *args: str) -> list[list[str]]:
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-2", *args, "-T", "fields", "-E", "occurrence=f"],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def _headers(path: Path, dec: list[str]) -> list[tuple[str, str, str, str]]:
    """(frame, tcp.stream, stream id, path) of each HTTP/2 request of SBI_PATH: the stream id of the frame's HEADERS
    (the HTTP/2 frame of type 1: a segment may carry a SETTINGS ACK on stream 0 before it)."""
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-2", *dec, "-Y", f'http2.headers.path matches "{SBI_PATH}"',
                          "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=\x1f", "-e", "frame.number", "-e",
                          "tcp.stream", "-e", "http2.streamid", "-e", "http2.type", "-e", "http2.headers.path"],
                         check=True, capture_output=True, text=True).stdout
    found = []
    for frame, stream, sids, kinds, uri in (line.split("\t") for line in out.split("\n") if line):
        found.append((frame, stream, sids.split("\x1f")[kinds.split("\x1f").index("1")], uri.split("\x1f")[0]))
    return found


def _bodies(path: Path, dec: list[str]) -> list[tuple[int, tuple[str, str] | None, list[str]]]:
    """(frame, (tcp.stream, HTTP/2 stream id) or None, every JSON path_with_value) of each frame whose JSON has a
    supi or ueIpv4Address member; the HTTP/2 key only when the frame carries one stream (besides stream 0)."""
    out = subprocess.run(["tshark", "-r", str(path), "-n", "-2", *dec, "-Y", 'json.key == "supi" || json.key == '
                          '"ueIpv4Address"', "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=\x1f",
                          "-e", "frame.number", "-e", "tcp.stream", "-e", "http2.streamid", "-e",
                          "json.path_with_value"], check=True, capture_output=True, text=True).stdout
    found: list[tuple[int, tuple[str, str] | None, list[str]]] = []
    for frame, stream, sids, members in (line.split("\t") for line in out.split("\n") if line):
        streams = set(sids.split("\x1f")) - {"", "0"}
        found.append((int(frame), (stream, streams.pop()) if len(streams) == 1 else None, members.split("\x1f")))
    return found


def member(bodies: list[list[str]], name: str) -> str | None:
    """The value of the top-level JSON member `name` in the first of these bodies that has one."""
    for members in bodies:
        for m in members:
            if m.startswith(f"/{name}:") and m[len(name) + 2:]:
                return m[len(name) + 2:]
    return None


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


def core_links(path: Path, decode_as: str | None) -> tuple[int, dict[tuple[UeKey, int, int], list[Link]]]:
    """The N4 (PFCP session establishment) and SBI (CreateSMContext, N1N2MessageTransfer, a V-SMF's
    Nsmf_PDUSession Create) requests of a capture holding one run's N2, N4 and SBI views, and the establishment
    instance (UE, PDU session id, first frame) each belongs to, strongest evidence first: the PFCP UE IP, or
    the ueIpv4Address of the JSON answering a request, equals one establishment's accept PDU address; the
    N1N2 path's SUPI, or the top-level `supi` of the request's JSON, is imsi-<MCC><MNC><MSIN> of one UE's
    null-scheme SUCI whose establishment is under way then (of the JSON's pduSessionId, when it has one);
    else the only establishment under way (first frame to last, to the last NGAP frame if unanswered).
    Returns (requests, links)."""
    return disk_cached(path, f"core-links-{decode_as}", lambda p: _core_links(p, decode_as))


def _core_links(path: Path, decode_as: str | None) -> tuple[int, dict[tuple[UeKey, int, int], list[Link]]]:
    dec = ["-d", decode_as] if decode_as else []
    # (interface, frame, time, response, UE IP, SUPI, PDU session id)
    requests: list[tuple[str, int, float, int | None, str | None, str | None, int | None]] = []
    times = {int(r[0]): float(r[1]) for r in _lines(path, *dec, "-e", "frame.number", "-e", "frame.time_epoch")}
    for r in _lines(path, "-Y", "pfcp.msg_type == 50", "-e", "frame.number", "-e", "pfcp.response_in",
                    "-e", "pfcp.ue_ip_addr_ipv4"):
        requests.append(("N4", int(r[0]), times[int(r[0])], int(r[1]) if r[1] else None, r[2] or None, None, None))
    bodies = _bodies(path, dec)
    h2 = _headers(path, dec)
    answers = _lines(path, *dec, "-Y", "http2.headers.status", "-e", "frame.number", "-e", "tcp.stream",
                     "-e", "http2.streamid")
    for frame, stream, sid, uri in ((int(r[0]), r[1], r[2], r[3]) for r in h2):
        later = [int(a[0]) for a in answers if (a[1], a[2]) == (stream, sid) and int(a[0]) > frame]
        supi = uri.split("/ue-contexts/")[1].split("/")[0] if "/ue-contexts/imsi-" in uri else None
        answer = min(later, default=None)
        sent = [m for f, key, m in bodies if key == (stream, sid) and frame <= f < (answer or 1 << 40)]
        got = [m for f, key, m in bodies if key == (stream, sid) and answer is not None and f >= answer]
        requests.append(("SBI", frame, times[frame], answer, member(got, "ueIpv4Address"),
                         supi or member(sent, "supi"), _int(member(sent, "pduSessionId"))))
    for r in _lines(path, "-Y", f'http.request.method == "POST" && !gtp && http.request.uri matches "{SBI_PATH}"',
                    "-e", "frame.number", "-e", "http.response_in", "-e", "http.request.uri"):
        supi = r[2].split("/ue-contexts/")[1].split("/")[0] if "/ue-contexts/imsi-" in r[2] else None
        sent = [m for f, _, m in bodies if f == int(r[0])]
        got = [m for f, _, m in bodies if r[1] and f == int(r[1])]
        requests.append(("SBI", int(r[0]), times[int(r[0])], int(r[1]) if r[1] else None,
                         member(got, "ueIpv4Address"), supi or member(sent, "supi"),
                         _int(member(sent, "pduSessionId"))))
    rows, owners = owned_rows(path)
    suci: dict[UeKey, str] = {}
    for row, owner in zip(rows, owners, strict=True):
        parts = [row.values.get(f, [""])[0] for f in ("e212.mcc", "e212.mnc", "nas_5gs.mm.suci.msin")]
        if owner is not None and all(parts):
            suci.setdefault(owner, "imsi-" + "".join(parts))
    end = max(row.time for row in rows)
    est = [d for d in details(path) if d.found[1] == "PDU Session Establishment"]
    window = {d.found: (times[d.found[3]], end if d.found[6] == "incomplete" else times[d.found[4]]) for d in est}
    links: dict[tuple[UeKey, int, int], list[Link]] = {(d.found[0], d.found[2] or 0, d.found[3]): [] for d in est}
    for kind, frame, time, response, ip, supi, psi in sorted(requests, key=lambda r: r[1]):
        under_way = [d for d in est if window[d.found][0] <= time <= window[d.found][1]]
        by_ip = [d for d in est if ip and d.ue_ipv4 == ip]
        by_supi = [d for d in under_way if supi and suci.get(d.found[0]) == supi
                   and (psi is None or d.found[2] is None or d.found[2] == psi)]
        for hits, by in ((by_ip, "UE IPv4"), (by_supi, "SUPI"), (under_way, "window")):
            if len(hits) == 1:
                links[(hits[0].found[0], hits[0].found[2] or 0, hits[0].found[3])].append(
                    Link(kind, frame, response, by))
                break
    return len(requests), links
