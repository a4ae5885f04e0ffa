"""NG associations and UE contexts: which context each PDU belongs to, and the evidence that links
contexts (same SUCI, 5G-TMSI, path switch, handover)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagd.actors.pcap.ngap.codes import (
    CLASS1_PROCEDURES,
    GNB_SENDS,
    NAS_TMSI_ASSIGNERS,
    NGAP_SCTP_PORT,
    PROC_HANDOVER_PREPARATION,
    PROC_HANDOVER_RESOURCE_ALLOCATION,
    PROC_INITIAL_UE_MESSAGE,
    PROC_NG_RESET,
    PROC_PATH_SWITCH,
    PROC_UE_CONTEXT_RELEASE,
)
from diagd.actors.pcap.ngap.failures import pdu_failures
from diagd.actors.pcap.ngap.pdus import NgapPdu, as_int


@dataclass
class Association:
    key: tuple[str, str, int | None]  # sorted endpoints, SCTP association index
    label: str
    first_frame: int
    pdus: list[NgapPdu] = field(default_factory=list)
    amf: str | None = None
    gnb: str | None = None
    ran_node: dict[str, str] = field(default_factory=dict)
    procedures: list[dict[str, Any]] = field(default_factory=list)  # non-UE-associated
    failures: list[dict[str, Any]] = field(default_factory=list)
    by_ran: dict[int, Context] = field(default_factory=dict)  # live contexts
    by_amf: dict[int, Context] = field(default_factory=dict)
    pending: dict[int, list[NgapPdu]] = field(default_factory=dict)  # non-UE class-1 requests

    def describe(self) -> dict[str, Any]:
        return {"association": self.label, "endpoints": list(self.key[:2]), "sctp_assoc_index": self.key[2],
                "gnb": self.gnb, "amf": self.amf, **self.ran_node, "first_frame": self.first_frame,
                "ngap_pdus": len(self.pdus)}


@dataclass
class Context:
    number: int
    assoc: Association
    ran: int | None = None
    amf: int | None = None
    amf_ids: list[int] = field(default_factory=list)
    pdus: list[NgapPdu] = field(default_factory=list)
    closed: str | None = None
    pending: dict[int, list[NgapPdu]] = field(default_factory=dict)
    label: str = ""

    def bind(self, ran: int | None, amf: int | None) -> None:
        if ran is not None and self.ran is None:
            self.ran = ran
            self.assoc.by_ran[ran] = self
        if amf is not None and amf not in self.amf_ids:
            self.amf_ids.append(amf)
            self.amf = self.amf if self.amf is not None else amf
            self.assoc.by_amf[amf] = self

    def close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
        if self.ran is not None and self.assoc.by_ran.get(self.ran) is self:
            del self.assoc.by_ran[self.ran]
        for amf in self.amf_ids:
            if self.assoc.by_amf.get(amf) is self:
                del self.assoc.by_amf[amf]


@dataclass
class Analysis:
    associations: list[Association]
    contexts: list[Context]
    owner: dict[int, Context | None]  # id(pdu) -> its UE context (None: not UE-associated)
    pdus: list[NgapPdu]
    links: list[dict[str, Any]]
    groups: dict[int, int]  # context number -> group number (linked contexts only)
    warnings: list[str]
    unlinked: list[dict[str, Any]] = field(default_factory=list)  # evidence refused, and why


def _opt_int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def analyse(pdus: list[NgapPdu]) -> Analysis:
    associations: dict[tuple[str, str, int | None], Association] = {}
    contexts: list[Context] = []
    owner: dict[int, Context | None] = {}

    def association(pdu: NgapPdu) -> Association:
        ends = sorted((pdu.src or "?", pdu.dst or "?"))
        key = (ends[0], ends[1], pdu.assoc_index)
        if key not in associations:
            associations[key] = Association(key, f"A{len(associations) + 1}", pdu.frame)
        return associations[key]

    def new_context(assoc: Association) -> Context:
        ctx = Context(len(contexts) + 1, assoc)
        contexts.append(ctx)
        return ctx

    for pdu in pdus:
        assoc = association(pdu)
        assoc.pdus.append(pdu)
        _learn_sides(assoc, pdu)
        ran, amf = _opt_int(pdu.ran_ue_id), _opt_int(pdu.amf_ue_id)
        ctx = _context_for(assoc, pdu, ran, amf, new_context)
        owner[id(pdu)] = ctx
        step_owner: Context | Association = ctx if ctx is not None else assoc
        _pair_outcome(step_owner.pending, pdu)
        if ctx is None:
            assoc.procedures.append(step(pdu))
            assoc.failures.extend(pdu_failures(pdu))
            if pdu.procedure_code == PROC_NG_RESET and pdu.initiating:
                _reset(assoc, pdu)
            continue
        ctx.pdus.append(pdu)
        if pdu.new_amf_ue_id is not None:
            ctx.bind(None, int(pdu.new_amf_ue_id))
        if pdu.procedure_code == PROC_UE_CONTEXT_RELEASE and pdu.pdu_type == "successfulOutcome":
            ctx.close(f"UEContextReleaseComplete in frame {pdu.frame}")
    _label(contexts)  # before linking: a refused link is reported by its contexts' labels
    links, groups, unlinked = _link(contexts, [(p, c) for p in pdus if (c := owner[id(p)]) is not None])
    warnings = _warnings(list(associations.values()), contexts, pdus)
    return Analysis(list(associations.values()), contexts, owner, pdus, links, groups, warnings, unlinked)


# How to include ciphered NAS: Wireshark deciphers NEA0 only (nas-5gs.null_decipher), it holds no NAS keys.
NAS_HOW = ("To include them: null_decipher=true (the default) reads NAS under NEA0; NAS ciphered with NEA1/2/3 "
           "needs a capture taken with the AMF's ciphering set to NEA0")


def _warnings(associations: list[Association], contexts: list[Context], pdus: list[NgapPdu]) -> list[str]:
    """What the reader of a summary must know about what it could not see."""
    warnings: list[str] = []
    if any(a.key[2] is None for a in associations):
        warnings.append("some NGAP frames have no SCTP association index: their contexts are keyed by the two "
                        "endpoints only (a restarted association on the same ports is not told apart)")
    unreadable = [p.unreadable for p in pdus if p.unreadable]
    if unreadable:
        warnings.append(f"{len(unreadable)} NGAP PDUs were read only in part: {unreadable[:5]}")
    undecoded = sum(p.nas_undecoded for p in pdus)
    if undecoded:
        warnings.append(f"{undecoded} security-protected NAS PDUs did not decode into a plain message (ciphered "
                        "with a real algorithm, or null_decipher=false): their registrations, rejects and "
                        f"PDU sessions are invisible. {NAS_HOW}")
    headless = [c for c in contexts if not any(p.procedure_code == PROC_INITIAL_UE_MESSAGE for p in c.pdus)]
    if headless:
        warnings.append(f"{len(headless)} UE contexts have no InitialUEMessage in the capture (it started "
                        "after them, or the display filter left it out)")
    return warnings


def _label(contexts: list[Context]) -> None:
    """Name each context by its association and ids; a pair reused within one association gets #n."""
    for ctx in contexts:
        ctx.label = f"{ctx.assoc.label}/amf-{_show(ctx.amf)}/ran-{_show(ctx.ran)}"
    seen: dict[str, int] = {}
    for ctx in contexts:  # ids reused within one association: same pair, later context
        seen[ctx.label] = seen.get(ctx.label, 0) + 1
        if seen[ctx.label] > 1:
            ctx.label += f"#{seen[ctx.label]}"


def _show(value: int | None) -> str:
    return "?" if value is None else str(value)


def _learn_sides(assoc: Association, pdu: NgapPdu) -> None:
    if pdu.ran_node:
        assoc.ran_node.update(pdu.ran_node)
    if assoc.amf is not None or pdu.src is None or pdu.dst is None:
        return
    if pdu.src.endswith(f":{NGAP_SCTP_PORT}") != pdu.dst.endswith(f":{NGAP_SCTP_PORT}"):
        assoc.amf, assoc.gnb = (pdu.src, pdu.dst) if pdu.src.endswith(f":{NGAP_SCTP_PORT}") else (pdu.dst, pdu.src)
    elif pdu.procedure_code in GNB_SENDS and pdu.initiating:
        assoc.gnb, assoc.amf = pdu.src, pdu.dst


def _context_for(assoc: Association, pdu: NgapPdu, ran: int | None, amf: int | None,
                 new_context: Any) -> Context | None:
    """The UE context a PDU belongs to, by the ids it carries, inside its own association."""
    if ran is None and amf is None:
        return None
    if pdu.procedure_code == PROC_INITIAL_UE_MESSAGE and pdu.initiating:
        stale = assoc.by_ran.get(ran) if ran is not None else None
        if stale is not None:
            stale.close(f"RAN-UE-NGAP-ID reused by InitialUEMessage in frame {pdu.frame}")
        ctx: Context = new_context(assoc)
        ctx.bind(ran, amf)
        return ctx
    by_ran = assoc.by_ran.get(ran) if ran is not None else None
    by_amf = assoc.by_amf.get(amf) if amf is not None else None
    chosen: Context | None = None
    if by_ran is not None and (amf is None or by_ran.amf is None or amf in by_ran.amf_ids):
        chosen = by_ran
    elif by_amf is not None and (ran is None or by_amf.ran is None):
        chosen = by_amf  # e.g. HandoverRequestAcknowledge: the target's RAN id for a context the AMF opened
    for stale in (by_ran, by_amf):  # the pair names another live context: its ids were reused
        if stale is not None and stale is not chosen:
            stale.close(f"ids reused by a different UE in frame {pdu.frame}")
    if chosen is None:
        chosen = new_context(assoc)
    chosen.bind(ran, amf)
    return chosen


def _pair_outcome(pending: dict[int, list[NgapPdu]], pdu: NgapPdu) -> None:
    code = pdu.procedure_code
    if code is None or code not in CLASS1_PROCEDURES:
        return
    if pdu.initiating:
        pending.setdefault(code, []).append(pdu)
    elif pending.get(code):
        pending[code].pop(0)


def _reset(assoc: Association, pdu: NgapPdu) -> None:
    if pdu.reset_all:
        for ctx in {id(c): c for c in [*assoc.by_ran.values(), *assoc.by_amf.values()]}.values():
            ctx.close(f"NGReset (whole interface) in frame {pdu.frame}")
        return
    for amf, ran in pdu.reset_pairs:
        for listed in (assoc.by_amf.get(int(amf)) if amf else None, assoc.by_ran.get(int(ran)) if ran else None):
            if listed is not None:
                listed.close(f"NGReset in frame {pdu.frame}")


def step(pdu: NgapPdu) -> dict[str, Any]:
    return {"frame": pdu.frame, "procedure": pdu.procedure, "code": pdu.procedure_code, "type": pdu.pdu_type}


class _Groups:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        while self.parent.setdefault(x, x) != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(b)] = self.find(a)


def _link(contexts: list[Context], owned: list[tuple[NgapPdu, Context]]
          ) -> tuple[list[dict[str, Any]], dict[int, int], list[dict[str, Any]]]:
    """Links between contexts of the same UE, each with its evidence; never a merge.

    The evidence is read in capture order (`owned`: each UE-associated PDU with its context), not context by
    context: a 5G-TMSI links only when assigned before it is presented, and a refusal names its frames in order.
    """
    links: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    groups = _Groups()
    first_suci: dict[str, tuple[Context, int]] = {}
    tmsi_seen: dict[int, tuple[Context, int, str]] = {}
    containers: dict[str, tuple[Context, int]] = {}

    sucis = {c.number: {m.suci() for p in c.pdus for m in p.nas} - {None} for c in contexts}

    def two_subscribers(a: Context, b: Context) -> bool:
        return bool(sucis[a.number] and sucis[b.number] and not sucis[a.number] & sucis[b.number])

    def refuse(a: Context, b: Context, evidence: str, frames: list[int], why: str) -> None:
        if a is b or groups.find(a.number) == groups.find(b.number):
            return
        if two_subscribers(a, b):
            why += "; and the two contexts identified with different SUCIs: two subscribers"
        entry = {"ue": b.label, "not_linked_to": a.label, "evidence": evidence, "frames": frames, "why": why}
        if entry not in refused:  # one frame may show the 5G-TMSI twice (NGAP's 5G-S-TMSI and the NAS)
            refused.append(entry)

    def link(a: Context, b: Context, evidence: str, frames: list[int]) -> None:
        if a is b or groups.find(a.number) == groups.find(b.number):
            return
        if two_subscribers(a, b):
            refused.append({"ue": b.label, "not_linked_to": a.label, "evidence": evidence, "frames": frames,
                            "why": "the two contexts identified with different SUCIs: two subscribers"})
            return
        groups.union(a.number, b.number)
        links.append({"from": a, "to": b, "evidence": evidence, "frames": frames})

    for pdu, ctx in owned:
        for message in pdu.nas:
            suci = message.suci()
            if suci is not None:
                if suci in first_suci:
                    other, frame = first_suci[suci]
                    link(other, ctx, "same SUCI", [frame, pdu.frame])
                else:
                    first_suci[suci] = (ctx, pdu.frame)
            tmsi = message.first("nas_5gs.5g_tmsi")
            if tmsi is not None:
                how = "assigned" if message.code in NAS_TMSI_ASSIGNERS else "presented"
                _tmsi(as_int(tmsi), ctx, pdu.frame, how, tmsi_seen, link, refuse)
        for value in pdu.tmsi:
            _tmsi(value, ctx, pdu.frame, "presented", tmsi_seen, link, refuse)
        if pdu.s2t_container is not None and pdu.initiating:
            if pdu.procedure_code == PROC_HANDOVER_PREPARATION:
                containers[pdu.s2t_container] = (ctx, pdu.frame)
            elif pdu.procedure_code == PROC_HANDOVER_RESOURCE_ALLOCATION and pdu.s2t_container in containers:
                source, frame = containers[pdu.s2t_container]
                link(source, ctx, "handover: the same SourceToTarget-TransparentContainer in HandoverRequired "
                     "and HandoverRequest", [frame, pdu.frame])
        if pdu.procedure_code == PROC_PATH_SWITCH and pdu.initiating and pdu.source_amf_ue_id is not None:
            switched = _path_switch_source(contexts, ctx, int(pdu.source_amf_ue_id), pdu.frame)
            if switched is not None:
                link(switched, ctx, "path switch: SourceAMF-UE-NGAP-ID names the source context", [pdu.frame])
    members: dict[int, list[int]] = {}
    for ctx in contexts:
        members.setdefault(groups.find(ctx.number), []).append(ctx.number)
    numbers: dict[int, int] = {}
    for member_list in (m for m in members.values() if len(m) > 1):
        group = len(set(numbers.values())) + 1
        numbers.update((m, group) for m in member_list)
    return links, numbers, refused


def _tmsi(value: int, ctx: Context, frame: int, how: str, seen: dict[int, tuple[Context, int, str]],
          link: Any, refuse: Any) -> None:
    """Link a context presenting a 5G-TMSI to the one that assigned it in this capture.

    Two assignments of one value are no evidence (the AMF may hand a freed TMSI to another UE),
    and neither are two presentations (a test UE or a stale GUTI repeats one): those pairs are
    refused with their reason. The 5G-TMSI alone (without AMF set/pointer) identifies the UE
    within one AMF set, which is what one capture of one core shows.
    """
    if how == "presented" and value in seen:
        other, other_frame, other_how = seen[value]
        if other_how == "assigned":
            link(other, ctx, f"5G-TMSI assigned in frame {other_frame}, presented in frame {frame}",
                 [other_frame, frame])
            return
        refuse(other, ctx, f"5G-TMSI {value} presented in frames {other_frame} and {frame}", [other_frame, frame],
               "the 5G-TMSI was presented by both and never assigned in this capture: a presentation alone is "
               "no evidence")
        return
    if how == "assigned" or value not in seen:
        seen[value] = (ctx, frame, how)


def _path_switch_source(contexts: list[Context], target: Context, amf_id: int, frame: int) -> Context | None:
    """The latest context with that AMF-UE-NGAP-ID at the same AMF address, on another association."""
    amf_ip = (target.assoc.amf or "").rsplit(":", 1)[0]
    best = None
    for ctx in contexts:
        if ctx is target or ctx.assoc is target.assoc or amf_id not in ctx.amf_ids:
            continue
        if (ctx.assoc.amf or "").rsplit(":", 1)[0] != amf_ip or not ctx.pdus or ctx.pdus[0].frame > frame:
            continue
        best = ctx
    return best
