"""The ngap_* tools: NGAP UE contexts (or their procedures) and PDU sessions of a capture, from its index
when it has one (index/ngap_pdus.py) or from the loaded capture, each answer paged in the lists that grow
with the UEs. Kept apart from tools.py, which is near the module size limit; tools.register binds this
ToolSet with the others."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import trio

from diagd.actors.message import Message, ReplyT
from diagd.actors.pcap.answers.left_out import sbi_warning
from diagd.actors.pcap.backend import PcapBackend, ShownSource
from diagd.actors.pcap.messages import NgapProcedures, NgapSessions, PduSessions
from diagd.actors.pcap.replies import PduSessionsReply, UeSessionsReply
from diagd.actors.pcap.schemas import CAPTURE, FILTER, PAGING
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError

tools: ToolSet[PcapBackend] = ToolSet()
Args = dict[str, Any]
CAPTURE_ONLY = ("pcap_path",)

INDEX_PROBE_WAIT_S = 2.0  # how long an NGAP answer from the index waits for the SBI probe
NGAP_PROPS = {**CAPTURE, **FILTER, "null_decipher": {"type": "boolean", "default": True,
                                                     "description": "decode NAS after NEA0"}, **PAGING}


# The lists of an ngap_* answer that grow with the UEs (or sessions): each paged alike by offset/limit.
PAGED_LISTS = {"ues": ("ues", "failed_ues", "linked_ue_groups", "not_linked"), "procedures": ("ues", "failed"),
               "sessions": ("sessions", "rejected", "incomplete")}


def _paged(answer: Mapping[str, Any], key: str, args: Args) -> dict[str, Any]:
    """An ngap_* answer with one page of each list that grows with the UEs (PAGED_LISTS[key], the first
    the per-UE or per-session list): thousands of UEs are megabytes no agent reads at once. Each list is
    cut at the same offset and limit; `totals` says how many each holds, `has_more` whether any goes on;
    the counts and the other lists stay whole."""
    offset, limit = args["offset"], args["limit"]
    lists = [name for name in PAGED_LISTS[key] if isinstance(answer.get(name), list)]
    paged = {**answer, **{name: answer[name][offset:offset + limit] for name in lists}, "offset": offset,
             "has_more": any(offset + limit < len(answer[name]) for name in lists),
             "totals": {name: len(answer[name]) for name in lists}}
    items = answer[lists[0]]  # the longest: the others hold some of its items
    if items and all(offset >= len(answer[name]) for name in lists):  # beside what the answer says already
        past = f"offset {offset} is past the last of {len(items)} {lists[0]}"
        paged["reason"] = "; ".join(x for x in (answer.get("reason"), past) if x)
    return paged


async def ngap_summary(backend: PcapBackend, ctx: CallContext, args: Args,
                       message: Message[ReplyT]) -> tuple[ReplyT, str | None, ShownSource]:
    """(the actor's answer, the warning of SBI left undecoded or None, the source) of an ngap_* tool."""
    # NGAP UE ids are unique only inside one SCTP association: Wireshark numbers them (first pass).
    prefs = {"sctp.association_index": "TRUE"}
    if args["null_decipher"]:
        prefs["nas-5gs.null_decipher"] = "TRUE"
    spec = await backend.spec_for(args, force_prefs=prefs)
    # What HTTP each TCP conversation carries (decode_check's one cached tshark pass, beside the load): SBI no
    # applied rule decodes is named in every summary's warnings, with the rule that includes it (left_out.py).
    probing = backend.wireshark.probes.begin(spec.path, spec.identity, [c.port for c in spec.decode_checks])
    indexed = await backend.ngap_from_index(args, spec, message, ctx.progress)
    result = indexed[0] if indexed is not None else await backend.ask(ctx, spec, message)
    # An answer from the index does not wait for the probe's pass over the whole file (40 s a GB) once it
    # is ready: it says the check is not done yet (the probe goes on, kept for the next call).
    with trio.move_on_after(INDEX_PROBE_WAIT_S if indexed is not None else math.inf):
        await probing.done.wait()
    try:
        sbi = (sbi_warning(probing.result(), spec.decode_as) if probing.done.is_set() else
               "whether SBI (HTTP/2) was left undecoded is not known yet: tshark is still reading the whole "
               "file for it (the same call again says)")
    except DiagdError as exc:
        sbi = f"whether SBI (HTTP/2) was left undecoded is unknown: {exc.message}"
    # An index answer names the tshark that built it: a restarted daemon's waits neither for the catalogue nor the hash.
    return result, sbi, await backend.source(spec, args, built_by=indexed[1] if indexed is not None else None)


class _ProceduresShown(UeSessionsReply):
    """ngap_ue_sessions' procedures view as built: the keys it has beyond the contexts view's."""

    procedure_count: int
    non_ue_procedures: list[dict[str, Any]]
    statistics: dict[str, Any]
    failed: list[dict[str, Any]]
    incomplete: int
    percentiles: str
    n4_sbi: dict[str, Any]


class _PduSessionsShown(PduSessionsReply):
    """ngap_pdu_session_summary's reply as built: the counts it has beyond the model's."""

    reactivation_count: int
    failed_count: int


@tools.tool("ngap_ue_sessions", "Per UE context (AMF/RAN UE NGAP ids): gNB, SUCI, 5G-TMSI, NGAP procedures, NAS "
            "messages, failures with causes; NG associations.",
            {**NGAP_PROPS, "view": {"enum": ["contexts", "procedures"], "default": "contexts",
                                    "description": "procedures: each with latency"}},
            required=CAPTURE_ONLY, ui="ui://diagd/ue-procedures")
async def ngap_ue_sessions(backend: PcapBackend, ctx: CallContext, args: Args) -> UeSessionsReply:
    if args["view"] == "procedures":
        viewed, sbi, source = await ngap_summary(backend, ctx, args, NgapProcedures(args["display_filter"]))
        procedures = cast("_ProceduresShown", {**_paged(viewed, "procedures", args), "source": source})
        if sbi is not None:
            procedures["warnings"] = [*viewed.get("warnings", []), sbi]
        return procedures
    contexts, sbi, source = await ngap_summary(backend, ctx, args, NgapSessions(args["display_filter"]))
    reply = cast("UeSessionsReply", {**_paged(contexts, "ues", args), "source": source})
    if sbi is not None:
        reply["warnings"] = [*contexts.get("warnings", []), sbi]
    return reply


@tools.tool("ngap_pdu_session_summary", "Per PDU session establishment: NAS and N2 messages, N3 address/TEID, QFIs, "
            "S-NSSAI, DNN, UE IP, causes.",
            NGAP_PROPS, required=CAPTURE_ONLY)
async def ngap_pdu_session_summary(backend: PcapBackend, ctx: CallContext, args: Args) -> PduSessionsReply:
    answer, sbi, source = await ngap_summary(backend, ctx, args, PduSessions(args["display_filter"]))
    sessions = cast("_PduSessionsShown", {**_paged(answer, "sessions", args), "source": source})
    if sbi is not None:
        sessions["warnings"] = [*answer.get("warnings", []), sbi]
    return sessions
