"""5G procedures per UE context, with timings: each instance's first and last frame, start, duration,
outcome and cause, and latency statistics per procedure type for the whole capture.

Which messages start and end a procedure is data (`PROCEDURES`), not code: message names are
TS 24.501 (5GMM/5GSM, clause 8) and TS 38.413 (NGAP class-1 procedures, clause 8) names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from diagd.actors.pcap.ngap.associations import Analysis, Context, analyse
from diagd.actors.pcap.ngap.core_links import Establishment, attach, core_messages
from diagd.actors.pcap.ngap.pdus import NasMessage, NgapPdu

# Message keys: "5GMM 0x41" (NAS message type), "NGAP 41/0" (procedure code / 0 initiating,
# 1 successful, 2 unsuccessful outcome). "5GMM 0x68 returned": a DL NAS transport carrying a
# 5GMM cause hands back a 5GSM message the AMF could not forward (TS 24.501 5.4.5.3.3).
RETURNED = "5GMM 0x68 returned"
PDU_TYPE_INDEX = {"initiatingMessage": 0, "successfulOutcome": 1, "unsuccessfulOutcome": 2}


@dataclass(frozen=True)
class Procedure:
    name: str
    start: frozenset[str]  # the same start key again opens a new instance; another one continues it
    success: frozenset[str]
    reject: frozenset[str] = frozenset()  # the network said no
    failure: frozenset[str] = frozenset()  # the UE said no, an unsuccessful outcome, a 5GMM STATUS
    per_session: bool = False  # 5GSM: one instance per PDU session id


def _p(name: str, start: str, success: str, reject: str = "", failure: str = "", per_session: bool = False
       ) -> Procedure:
    def keys(text: str) -> frozenset[str]:
        return frozenset(k.strip() for k in text.split(",") if k.strip())
    return Procedure(name, keys(start), keys(success), keys(reject), keys(failure), per_session)


PROCEDURES: tuple[Procedure, ...] = (
    # TS 24.501 5.5.1: REGISTRATION REQUEST -> REGISTRATION ACCEPT / REGISTRATION REJECT
    _p("Registration", "5GMM 0x41", "5GMM 0x42", reject="5GMM 0x44"),
    # 5.4.1.3: AUTHENTICATION REQUEST -> AUTHENTICATION RESPONSE / AUTHENTICATION FAILURE (UE);
    # AUTHENTICATION REJECT (network)
    _p("Authentication", "5GMM 0x56", "5GMM 0x57", reject="5GMM 0x58", failure="5GMM 0x59"),
    # 5.4.2: SECURITY MODE COMMAND -> SECURITY MODE COMPLETE / SECURITY MODE REJECT
    _p("Security Mode", "5GMM 0x5d", "5GMM 0x5e", failure="5GMM 0x5f"),
    # 5.6.1: SERVICE REQUEST -> SERVICE ACCEPT / SERVICE REJECT
    _p("Service Request", "5GMM 0x4c", "5GMM 0x4e", reject="5GMM 0x4d"),
    # 5.5.2.2 / 5.5.2.3: DEREGISTRATION REQUEST (UE / network originating) -> DEREGISTRATION ACCEPT
    _p("Deregistration", "5GMM 0x45, 5GMM 0x47", "5GMM 0x46, 5GMM 0x48"),
    # 6.4.1: PDU SESSION ESTABLISHMENT REQUEST -> ACCEPT / REJECT; the AMF may hand the request back
    # (DL NAS TRANSPORT with a 5GMM cause) or answer its UL NAS TRANSPORT with 5GMM STATUS.
    _p("PDU Session Establishment", "5GSM 0xc1", "5GSM 0xc2", reject=f"5GSM 0xc3, {RETURNED}",
       failure="5GMM 0x64", per_session=True),
    # 6.3.2 / 6.4.2: MODIFICATION REQUEST (UE) -> MODIFICATION COMMAND -> COMPLETE; REJECT / COMMAND REJECT
    _p("PDU Session Modification", "5GSM 0xc9, 5GSM 0xcb", "5GSM 0xcc", reject="5GSM 0xca",
       failure="5GSM 0xcd", per_session=True),
    # 6.3.3 / 6.4.3: RELEASE REQUEST (UE) -> RELEASE COMMAND -> RELEASE COMPLETE; RELEASE REJECT
    _p("PDU Session Release", "5GSM 0xd1, 5GSM 0xd3", "5GSM 0xd4", reject="5GSM 0xd2", per_session=True),
    # TS 38.413 8.4.1 HANDOVER REQUIRED -> HANDOVER COMMAND / HANDOVER PREPARATION FAILURE
    _p("Handover Preparation", "NGAP 12/0", "NGAP 12/1", failure="NGAP 12/2"),
    # 8.4.2 HANDOVER REQUEST -> HANDOVER REQUEST ACKNOWLEDGE / HANDOVER FAILURE
    _p("Handover Resource Allocation", "NGAP 13/0", "NGAP 13/1", failure="NGAP 13/2"),
    # 8.4.4 PATH SWITCH REQUEST -> PATH SWITCH REQUEST ACKNOWLEDGE / PATH SWITCH REQUEST FAILURE
    _p("Path Switch", "NGAP 25/0", "NGAP 25/1", failure="NGAP 25/2"),
    # 8.3.2 UE CONTEXT RELEASE REQUEST (gNB) -> 8.3.3 UE CONTEXT RELEASE COMMAND -> COMPLETE
    _p("UE Context Release", "NGAP 42/0, NGAP 41/0", "NGAP 41/1"),
)
NAMES = tuple(p.name for p in PROCEDURES)


@dataclass
class Instance:
    procedure: Procedure
    ue: Context
    psi: int | None
    start_key: str
    first: NgapPdu
    last: NgapPdu
    outcome: str | None = None  # None while open
    cause: dict[str, Any] | None = None
    why: str | None = None
    frames: list[int] = field(default_factory=list)
    ue_ipv4: str | None = None  # the PDU address a PDU SESSION ESTABLISHMENT ACCEPT gave
    core: Establishment | None = None  # its N4 / SBI messages, when the capture has them

    def describe(self) -> dict[str, Any]:
        done = self.outcome is not None and self.outcome != "incomplete"
        out: dict[str, Any] = {
            "procedure": self.procedure.name, "ue": self.ue.label,
            **({"pdu_session_id": self.psi} if self.procedure.per_session else {}),
            "first_frame": self.first.frame, "last_frame": self.last.frame, "start": iso(self.first.time),
            "duration_ms": duration_ms(self.first.time, self.last.time) if done else None,
            "outcome": self.outcome, "cause": self.cause, "frames": self.frames,
        }
        if self.why:
            out["why"] = self.why
        if self.ue_ipv4:
            out["ue_ipv4"] = self.ue_ipv4
        if self.core is not None:
            out["n4_sbi"] = self.core.attached
        return out


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def duration_ms(start: float, end: float) -> float:
    return round((end - start) * 1000, 3)


def message_keys(pdu: NgapPdu) -> list[tuple[str, NasMessage | None]]:
    """The procedure-relevant messages of one NGAP PDU, in order: its NGAP message, then its NAS.

    A 5GMM message inside another 5GMM message's container (the REGISTRATION REQUEST a SECURITY
    MODE COMPLETE carries back, TS 24.501 5.4.2.3) is not a new procedure step; 5GSM messages
    inside UL/DL NAS TRANSPORT are.
    """
    keys: list[tuple[str, NasMessage | None]] = []
    if pdu.procedure_code is not None and pdu.pdu_type in PDU_TYPE_INDEX:
        keys.append((f"NGAP {pdu.procedure_code}/{PDU_TYPE_INDEX[pdu.pdu_type]}", None))
    for message in pdu.nas:
        if message.layer == "5GMM" and message.outer is not None and message.outer.startswith("5GMM"):
            continue
        if message.layer == "5GMM" and message.code == "0x68" and message.cause is not None:
            keys.append((RETURNED, message))
        keys.append((f"{message.layer} {message.code}", message))
    return keys


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

    def feed(self, pdu: NgapPdu) -> None:
        for key, message in message_keys(pdu):
            psi = message.psi if message is not None else None
            for proc in PROCEDURES:
                self._step(proc, key, pdu, message, psi)

    def _step(self, proc: Procedure, key: str, pdu: NgapPdu, message: NasMessage | None, psi: int | None) -> None:
        slot = (proc.name, psi if proc.per_session else None)
        current = self.open.get(slot)
        if key in proc.start:
            if current is not None and key != current.start_key and current.frames[-1] <= pdu.frame:
                self._touch(current, pdu)  # e.g. RELEASE REQUEST then RELEASE COMMAND: one procedure
                return
            if current is not None:
                self._close(current, "incomplete", why=f"a new {proc.name} started in frame {pdu.frame} before "
                                                       "any answer")
            self.open[slot] = Instance(proc, self.ctx, slot[1], key, pdu, pdu, frames=[pdu.frame])
            return
        outcome = ("success" if key in proc.success else "reject" if key in proc.reject
                   else "failure" if key in proc.failure else None)
        if outcome is None:
            return
        if current is None and proc.per_session and psi is None:
            # An answer naming no PDU session (5GMM STATUS): the oldest open instance of this context.
            waiting = [i for s, i in self.open.items() if s[0] == proc.name]
            current = min(waiting, key=lambda i: i.first.frame) if waiting else None
            slot = (proc.name, current.psi) if current is not None else slot
        if current is None:
            return  # an answer to a request outside the capture (or the display filter)
        self._touch(current, pdu)
        if message is not None and outcome == "success":
            current.ue_ipv4 = message.first("nas_5gs.sm.pdu_addr_inf_ipv4")
        self._close(current, outcome, cause=_cause(pdu, message) if outcome != "success" else None)
        del self.open[slot]

    @staticmethod
    def _touch(instance: Instance, pdu: NgapPdu) -> None:
        instance.last = pdu
        if instance.frames[-1] != pdu.frame:
            instance.frames.append(pdu.frame)

    def _close(self, instance: Instance, outcome: str, *, cause: dict[str, Any] | None = None,
               why: str | None = None) -> None:
        instance.outcome, instance.cause, instance.why = outcome, cause, why
        self.done.append(instance)

    def finish(self, analysis: Analysis) -> list[Instance]:
        last_in_assoc = self.ctx.assoc.pdus[-1]
        last_in_ctx = self.ctx.pdus[-1]
        for instance in self.open.values():
            if last_in_ctx.frame > instance.last.frame:
                why = (f"no answer: the UE context carried NGAP until frame {last_in_ctx.frame} "
                       f"({duration_ms(instance.last.time, last_in_ctx.time)} ms later)")
            elif self.ctx.closed:
                why = f"no answer before the UE context ended ({self.ctx.closed})"
            elif last_in_assoc.frame > instance.last.frame:
                why = (f"no answer: this UE context fell silent while its association carried NGAP until frame "
                       f"{last_in_assoc.frame}")
            else:
                why = "the capture ends before any answer"
            self._close(instance, "incomplete", why=why)
        self.open.clear()
        return sorted(self.done, key=lambda i: (i.first.frame, NAMES.index(i.procedure.name)))


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


def _link_core(instances: list[Instance], rows: list[dict[str, str]], capture_end: float) -> dict[str, Any]:
    establishments = [i for i in instances if i.procedure.name == "PDU Session Establishment"]
    for i in establishments:
        # An unanswered request's window runs to the end of the capture: the core may still be at work.
        end = capture_end if i.outcome == "incomplete" else i.last.time
        i.core = Establishment(i.first.time, end, i.ue_ipv4, _suci_parts(i.ue))
    return attach([i.core for i in establishments if i.core is not None], core_messages(rows))


def procedures(pdus: list[NgapPdu], filtered: bool = False, core_rows: list[dict[str, str]] | None = None
               ) -> dict[str, Any]:
    analysis = analyse(pdus)
    everything: list[Instance] = []
    contexts_found: list[tuple[Context, list[Instance]]] = []
    ues = []
    for ctx in analysis.contexts:
        tracker = _Tracker(ctx)
        for pdu in ctx.pdus:
            tracker.feed(pdu)
        found = tracker.finish(analysis)
        everything.extend(found)
        contexts_found.append((ctx, found))
    core = _link_core(everything, core_rows or [], max((p.time for p in pdus), default=0.0))
    for ctx, found in contexts_found:
        ues.append({"ue": ctx.label, "association": ctx.assoc.label, "gnb": ctx.assoc.gnb,
                    "ran_ue_ngap_id": ctx.ran, "amf_ue_ngap_id": ctx.amf,
                    "procedures": [i.describe() for i in found]})
    failed = [i.describe() for i in everything if i.outcome in ("reject", "failure")]
    warnings = list(analysis.warnings)
    if filtered:
        warnings.append("display_filter given: procedures are built from the filtered NGAP frames only")
    result: dict[str, Any] = {
        "ue_count": len(ues), "procedure_count": len(everything), "ues": ues, "statistics": statistics(everything),
        "failed": failed, "incomplete": sum(1 for i in everything if i.outcome == "incomplete"),
        "associations": [a.describe() for a in analysis.associations], "ngap_pdus": len(pdus),
        "percentiles": "nearest rank over completed instances (success, reject, failure)", "warnings": warnings,
        "n4_sbi": core,
    }
    if not core["n4_sbi_messages"] and any(i.procedure.name == "PDU Session Establishment" for i in everything):
        warnings.append("no PFCP session establishment or SBI PDU session call in this capture: give a capture "
                        "merged with the N4/SBI views (mergecap) and decode_as for HTTP/2 on its port")
    if not everything:
        result["reason"] = ("no NGAP over SCTP in the capture" + (" that matches the display filter" if filtered
                                                                    else "") if not pdus else
                            "no procedure message (TS 24.501 / 38.413) in the NGAP PDUs" +
                            ("; NAS did not decode, see warnings" if any(p.nas_undecoded for p in pdus) else ""))
    return result
