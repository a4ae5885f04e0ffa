"""A second, independent answer to ngap_ue_sessions(view="procedures"), from `tshark -T fields` rows.

It reads the one-PDU-per-row field rows of tests/support/ngap_oracle.py (not sharkd's trees) and
follows the rules docs/5g.md states, written out again here by message-type numbers:

- NAS: only a row's first 5GMM message type is its own (a further one after a SECURITY MODE
  COMPLETE is the REGISTRATION REQUEST in its container); its 5GSM type rides in a NAS transport.
- A start message opens an instance per (UE context, procedure[, PDU session id]); the same
  start message again abandons the open one as incomplete, another start message of the same
  procedure continues it. An answer closes it; 5GMM STATUS closes the context's oldest open PDU
  session establishment. What is still open at the end is incomplete.
- Verdicts by the spec: a switch-off DEREGISTRATION REQUEST ends itself (no accept); AUTHENTICATION
  REJECT also rejects the registration; an establishment accepted inside an N2 setup request ends
  with that request's response (set up: success, failed list: failure) or fails with a UE context
  release; 5GMM STATUS ends the establishment whose message came last.
- Durations are last minus first frame time in ms (rounded to µs), for closed instances only;
  percentiles are nearest rank.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ngap_oracle import CAUSE_GROUPS, OracleCannotTell, Row, UeKey, disk_cached, owned_rows

# event -> [(procedure, role)]; events: ("mm", type), ("sm", type), ("ngap", code, pdu type), ("returned",)
TABLE: dict[tuple[int | str, ...], list[tuple[str, str]]] = {}


def _add(name: str, role: str, *events: tuple[int | str, ...]) -> None:
    for event in events:
        TABLE.setdefault(event, []).append((name, role))


_add("Registration", "start", ("mm", 0x41))
_add("Registration", "success", ("mm", 0x42))
_add("Registration", "reject", ("mm", 0x44), ("mm", 0x58))  # TS 24.501 5.4.1.3.5: auth reject ends it
_add("Authentication", "start", ("mm", 0x56))
_add("Authentication", "success", ("mm", 0x57))
_add("Authentication", "reject", ("mm", 0x58))
_add("Authentication", "failure", ("mm", 0x59))
_add("Security Mode", "start", ("mm", 0x5D))
_add("Security Mode", "success", ("mm", 0x5E))
_add("Security Mode", "failure", ("mm", 0x5F))
_add("Service Request", "start", ("mm", 0x4C))
_add("Service Request", "success", ("mm", 0x4E))
_add("Service Request", "reject", ("mm", 0x4D))
_add("Deregistration", "start", ("mm", 0x45), ("mm", 0x47))
_add("Deregistration", "success", ("mm", 0x46), ("mm", 0x48))
_add("PDU Session Establishment", "start", ("sm", 0xC1))
# Its accept rides in the N2 setup request; the N2 setup response ends it (TS 38.413 8.2.1.2 / 8.3.1.2).
_add("PDU Session Establishment", "accepted", ("sm", 0xC2))
_add("PDU Session Establishment", "reject", ("sm", 0xC3), ("returned",))
_add("PDU Session Establishment", "failure", ("mm", 0x64))
_add("PDU Session Modification", "start", ("sm", 0xC9), ("sm", 0xCB))
_add("PDU Session Modification", "success", ("sm", 0xCC))
_add("PDU Session Modification", "reject", ("sm", 0xCA))
_add("PDU Session Modification", "failure", ("sm", 0xCD))
_add("PDU Session Release", "start", ("sm", 0xD1), ("sm", 0xD3))
_add("PDU Session Release", "success", ("sm", 0xD4))
_add("PDU Session Release", "reject", ("sm", 0xD2))
for _code, _name in ((12, "Handover Preparation"), (13, "Handover Resource Allocation"), (25, "Path Switch")):
    _add(_name, "start", ("ngap", _code, 0))
    _add(_name, "success", ("ngap", _code, 1))
    _add(_name, "failure", ("ngap", _code, 2))
_add("UE Context Release", "start", ("ngap", 42, 0), ("ngap", 41, 0))
_add("UE Context Release", "success", ("ngap", 41, 1))
PER_SESSION = {"PDU Session Establishment", "PDU Session Modification", "PDU Session Release"}

Found = tuple[UeKey, str, int | None, int, int, float | None, str, str | None, int | None]


@dataclass
class Open:
    start: tuple[int | str, ...]
    first: Row
    last: Row
    frames: list[int] = field(default_factory=list)


def _events(row: Row) -> list[tuple[tuple[int | str, ...], str | None, int | None]]:
    """(event, cause kind, cause code) in the order diagd reads a PDU: NGAP, 5GMM, 5GSM."""
    mm, sm = row.ints("nas_5gs.mm.message_type"), row.ints("nas_5gs.sm.message_type")
    if len(mm) > 1 and mm[:2] != [0x5E, 0x41]:
        raise OracleCannotTell(f"frame {row.frame}: 5GMM types {mm}: which are nested is not clear from fields")
    if len(sm) > 1:
        raise OracleCannotTell(f"frame {row.frame}: several 5GSM messages")
    ngap_codes = [int(v) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
    mm_cause, sm_cause = row.one("nas_5gs.mm.5gmm_cause"), row.one("nas_5gs.sm.5gsm_cause")
    out: list[tuple[tuple[int | str, ...], str | None, int | None]] = [
        (("ngap", row.proc, row.pdu_type), "NGAP" if ngap_codes else None, ngap_codes[0] if ngap_codes else None)]
    if mm:
        if mm[0] == 0x68 and mm_cause is not None:
            out.append((("returned",), "5GMM", mm_cause))
        out.append((("mm", mm[0]), "5GMM" if mm_cause is not None else None, mm_cause))
    if sm:
        out.append((("sm", sm[0]), "5GSM" if sm_cause is not None else None, sm_cause))
    return out


def answer(path: Path) -> list[Found]:
    """Every procedure instance of the capture (kept on disk: the mutation gate asks often)."""
    return disk_cached(path, "procedures", _answer)


def _answer(path: Path) -> list[Found]:
    rows, owners = owned_rows(path)
    opened: dict[tuple[UeKey, str, int | None], Open] = {}
    found: list[Found] = []
    n2_waiting: set[tuple[UeKey, str, int | None]] = set()
    order: dict[tuple[UeKey, str, int | None], int] = {}
    tick = itertools.count()

    def ms(a: Row, b: Row) -> float:
        return round((b.time - a.time) * 1000, 3)

    def close(owner: UeKey, name: str, psi: int | None, o: Open, outcome: str, kind: str | None,
              code: int | None) -> None:
        found.append((owner, name, psi, o.first.frame, o.last.frame,
                      None if outcome == "incomplete" else ms(o.first, o.last), outcome,
                      kind if outcome in ("reject", "failure") else None,
                      code if outcome in ("reject", "failure") else None))

    for row, owner in zip(rows, owners, strict=True):
        if owner is None:
            continue
        psi = row.one("nas_5gs.pdu_session_id")
        if row.values.get("nas_5gs.mm.switch_off") == ["1"] and row.ints("nas_5gs.mm.message_type")[:1] == [0x45]:
            found.append((owner, "Deregistration", None, row.frame, row.frame, 0.0, "success", None, None))
            continue
        for event, kind, code in _events(row):
            for name, role in TABLE.get(event, []):
                slot_psi = psi if name in PER_SESSION else None
                slot = (owner, name, slot_psi)
                if role == "accepted":
                    if slot in opened:
                        opened[slot].last = row
                        order[slot] = next(tick)
                        if row.proc in (29, 14) and row.pdu_type == 0:
                            n2_waiting.add(slot)
                    continue
                if role == "start":
                    if slot in opened and opened[slot].start != event:
                        opened[slot].last = row
                        if opened[slot].frames[-1] != row.frame:
                            opened[slot].frames.append(row.frame)
                        continue
                    if slot in opened:
                        close(owner, name, slot_psi, opened.pop(slot), "incomplete", None, None)
                    opened[slot] = Open(event, row, row, [row.frame])
                    order[slot] = next(tick)
                    continue
                if slot not in opened and name in PER_SESSION and event[0] == "mm" and psi is None:
                    mine = sorted((s for s in opened if s[0] == owner and s[1] == name), key=lambda s: order[s])
                    slot = mine[-1] if mine else slot
                if slot not in opened:
                    continue
                o = opened.pop(slot)
                o.last = row
                close(owner, name, slot[2], o, role, kind, code)
        _n2_answers(row, owner, opened, n2_waiting, close)
    for (owner, name, psi), o in opened.items():
        close(owner, name, psi, o, "incomplete", None, None)
    return found


def _n2_answers(row: Row, owner: UeKey, opened: dict[tuple[UeKey, str, int | None], Open],
                n2_waiting: set[tuple[UeKey, str, int | None]], close: Callable[..., None]) -> None:
    """An N2 setup response (or a UE context release) ends the establishments waiting for it."""
    if row.proc in (29, 14) and row.pdu_type != 0:
        ok = sum(row.ints("ngap.PDUSessionResourceSetupListSURes") + row.ints("ngap.PDUSessionResourceSetupListCxtRes"))
        failed = sum(row.ints("ngap.PDUSessionResourceFailedToSetupListSURes")
                     + row.ints("ngap.PDUSessionResourceFailedToSetupListCxtRes"))
        psis = sorted(set(row.ints("ngap.pDUSessionID")))
        if len(psis) != 1 or ok + failed != 1:
            if psis and any((owner, "PDU Session Establishment", p) in n2_waiting for p in psis):
                raise OracleCannotTell(f"frame {row.frame}: several PDU sessions in one N2 setup response")
            return
        slot = (owner, "PDU Session Establishment", psis[0])
        if slot in n2_waiting and slot in opened:
            n2_waiting.discard(slot)
            o = opened.pop(slot)
            o.last = row
            codes = [int(v) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
            close(owner, slot[1], slot[2], o, "success" if ok else "failure", "NGAP", codes[0] if codes else None)
    elif row.proc in (41, 42) and row.pdu_type == 0:
        for slot in [s for s in opened if s[0] == owner and s[1] == "PDU Session Establishment"]:
            n2_waiting.discard(slot)
            o = opened.pop(slot)
            o.last = row
            codes = [int(v) for g in CAUSE_GROUPS for v in row.values.get(g, [])]
            close(owner, slot[1], slot[2], o, "failure", "NGAP" if codes else None, codes[0] if codes else None)


def nearest_rank(values: list[float], p: int) -> float:
    n = len(values)
    return sorted(values)[-(-n * p // 100) - 1]
