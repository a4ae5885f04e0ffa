"""Paging (TS 38.413 8.5.1): each PAGING of the capture, answered when the paged UE shows up, else not.

Paging is class 2 and not UE-associated: nothing answers it on N2. The paged UE answers over the radio
(TS 24.501 5.6.2.2.1) with a SERVICE REQUEST or a REGISTRATION REQUEST, which reaches the AMF in a UE
context of any association. The first NGAP PDU after the PAGING that presents the paged 5G-S-TMSI (AMF Set
ID, AMF Pointer and 5G-TMSI, TS 23.003 2.10.1) answers it: a SERVICE REQUEST or REGISTRATION REQUEST whose
5GS mobile identity (a 5G-S-TMSI, or a 5G-GUTI holding one) is it, or an InitialUEMessage whose 5G-S-TMSI
IE (26) is it. The instance names that UE context and the evidence (`answered_by`); a PAGING nobody
answered is `incomplete`, its `why` saying how long the capture's NGAP went on after it.
"""

from __future__ import annotations

from typing import Any

from diagd.actors.pcap.ngap.associations import Analysis, Context
from diagd.actors.pcap.ngap.codes import PROC_INITIAL_UE_MESSAGE, PROC_PAGING
from diagd.actors.pcap.ngap.pdus import NgapPdu, STmsi
from diagd.actors.pcap.ngap.procedures import NAMES, PAGING, PROCEDURES, Instance, duration_ms
from diagd.actors.pcap.ngap.rules import RULES

# The NAS messages a paged UE answers with (TS 24.501 5.6.2.2.1), by message type.
ANSWERS = {"0x4c": "SERVICE REQUEST", "0x41": "REGISTRATION REQUEST"}


def presented(pdu: NgapPdu) -> list[tuple[STmsi, str]]:
    """Each 5G-S-TMSI a PDU presents as a paged UE would, with where it is (the evidence's words)."""
    found = [(s, f"the 5G-S-TMSI IE of the InitialUEMessage in frame {pdu.frame}") for s in pdu.s_tmsi
             if pdu.procedure_code == PROC_INITIAL_UE_MESSAGE and pdu.initiating]
    for message in pdu.nas:
        if message.layer == "5GMM" and message.code in ANSWERS:
            found += [(s, f"the {ANSWERS[message.code]} in frame {pdu.frame}") for s in message.s_tmsis()]
    return found


def track_paging(analysis: Analysis) -> list[Instance]:
    """Every PAGING (not UE-associated) of the capture, in order, each answered or not (see the module)."""
    proc = PROCEDURES[NAMES.index(PAGING)]
    assoc_of = {id(p): a for a in analysis.associations for p in a.pdus}
    waiting: list[Instance] = []
    done: list[Instance] = []
    for pdu in analysis.pdus:
        owner = analysis.owner.get(id(pdu))
        if owner is None and pdu.procedure_code == PROC_PAGING and pdu.initiating:
            paging = Instance(proc, None, None, f"NGAP {PROC_PAGING}/0", pdu, pdu, frames=[pdu.frame],
                              association=assoc_of.get(id(pdu)), paged=pdu.paging_identity)
            (waiting if paging.paged is not None else done).append(paging)
            continue
        if owner is None or not waiting:
            continue
        for identity, where in presented(pdu):
            for paging in [p for p in waiting if p.paged == identity]:
                waiting.remove(paging)
                _answered(paging, pdu, owner, f"{where} presents the paged 5G-S-TMSI ({identity.words()})")
                done.append(paging)
    last = analysis.pdus[-1] if analysis.pdus else None
    for paging in done + waiting:
        if paging.outcome is None:
            paging.outcome, paging.rule, paging.why = "incomplete", RULES["paging-no-response"], _silence(paging, last)
    return sorted(done + waiting, key=lambda i: i.first.frame)


def _answered(paging: Instance, pdu: NgapPdu, ctx: Context, evidence: str) -> None:
    paging.last = pdu
    if paging.frames[-1] != pdu.frame:
        paging.frames.append(pdu.frame)
    paging.outcome, paging.rule = "success", RULES["paging-answered"]
    paging.answered_by = ctx
    paging.evidence = evidence


def _silence(paging: Instance, last: NgapPdu | None) -> str:
    if paging.paged is None:
        return "the PAGING names no 5G-S-TMSI this reader could read: no UE can be found to have answered it"
    said = f"no UE presented the paged 5G-S-TMSI ({paging.paged.words()}) after it: "
    if last is None or last.frame <= paging.first.frame:
        return said + "the capture ends with the PAGING"
    return (said + f"the capture's NGAP went on until frame {last.frame} "
            f"({duration_ms(paging.first.time, last.time)} ms after the PAGING)")


def answered(non_ue: list[Instance], ctx: Context) -> list[dict[str, Any]]:
    """The PAGINGs a UE context answered, for the contexts view."""
    return [{"paging_frame": i.first.frame, "association": i.association.label if i.association else None,
             "answered_in_frame": i.last.frame, "evidence": i.evidence}
            for i in non_ue if i.procedure.name == PAGING and i.answered_by is ctx]
