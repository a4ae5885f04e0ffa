"""The pcap back end's MCP tools: each builds a message for the capture's actor and shapes the reply.

Every tool is declared once on `tools` (one `ToolSet`); `register` binds them to the back end's
state (backend.py) and wraps each in the subscriber-identity masking boundary (guard.py), which every
result, error and progress message passes, so a tool added later is masked without doing anything.
"""

from __future__ import annotations

import math
from collections.abc import Container
from dataclasses import replace
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.pcap.actor import KIND
from diagd.actors.pcap.answer_types import FramesAnswer, StatsAnswer, TimelineAnswer
from diagd.actors.pcap.answers import stats as _stats
from diagd.actors.pcap.answers.answers import info_wait_s, not_read_yet
from diagd.actors.pcap.answers.field_search import search_fields
from diagd.actors.pcap.answers.follow import MAX_FOLLOW_TEXT
from diagd.actors.pcap.backend import PcapBackend, search_deadline
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.index.build import fields_args as build_fields_args
from diagd.actors.pcap.masking.guard import SubscriberMask
from diagd.actors.pcap.messages import (
    Check,
    Column,
    Detail,
    Export,
    Follow,
    Frames,
    IndexStats,
    IndexStatus,
    Info,
    PacketList,
    TextSearch,
    Timeline,
)
from diagd.actors.pcap.ngap_tools import tools as ngap_tools
from diagd.actors.pcap.replies import (
    ConfigReply,
    DetailReply,
    ExtractReply,
    FieldInfo,
    FieldsSearchReply,
    FollowReply,
    FramesReply,
    IndexReply,
    InfoReply,
    ListFieldsReply,
    PacketListReply,
    SearchReply,
    StatsReply,
    TimelineReply,
)
from diagd.actors.pcap.schemas import (
    CAPTURE,
    FILTER,
    FRAME_NUMBER,
    LAYERS,
    MAX_TEXT_BYTES,
    PAGING,
)
from diagd.actors.pcap.sequence_tool import tools as sequence_tools
from diagd.actors.pcap.shark import decode_check
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.rows import fields_filter, packet_file_command, packet_list_command
from diagd.actors.pcap.shark.wireshark import Catalogue
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSet, paging
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[PcapBackend] = ToolSet()
Args = dict[str, Any]
SINGLE_PASS = "single pass while sharkd loads"  # in served_by of a fresh capture's first page
CAPTURE_ONLY = ("pcap_path",)


def register(runtime: Runtime) -> PcapBackend:
    backend = PcapBackend(runtime)
    runtime.on_reload(backend.check_reload)

    async def field_names() -> Container[str]:
        return (await backend.catalogue()).fields  # the guard asks only `in`: no 233k-name copy

    async def capture_of(args: Args) -> tuple[str, list[str]] | None:
        # Through the tools, as the handler went: the guard wraps the tools and never calls the back end itself.
        return await backend.identity_source(args)

    # The one masking boundary: every pcap tool's handler is wrapped here, once.
    masking = SubscriberMask(enabled=lambda: backend.settings.mask_subscriber_ids,
                             output_dir=lambda: backend.settings.output_dir,
                             capture_of=capture_of, known_fields=field_names)
    for spec in [*tools.specs(backend), *ngap_tools.specs(backend), *sequence_tools.specs(backend)]:
        runtime.register_tool(replace(spec, handler=masking.guard(spec.name, spec.handler)))
    return backend


class _Probed(TypedDict, total=False):
    sbi_ports: list[dict[str, Any]]


class _Span(TypedDict):
    packet_count: int
    time_start: str | None
    time_end: str | None
    duration_s: float | None
    duration_s_text: str | None
    file_type: str | None
    file_encapsulation: str | None


class _Hashed(TypedDict, total=False):
    sha256: str


class _InfoShown(InfoReply):
    """pcap_info's reply as built: the actor's answer may say more than the model names."""

    sharkd_frames: NotRequired[int | None]
    provisional: NotRequired[list[str]]
    note: NotRequired[str]


@tools.tool("pcap_info", "Start here: sha256, packet count, time span, protocols, top conversations.",
            CAPTURE, required=CAPTURE_ONLY)
async def pcap_info(backend: PcapBackend, ctx: CallContext, args: Args) -> InfoReply:
    # The count and span first, on cores of their own: the check that the file is a capture reads them
    # (capinfos, on two halves side by side for a big file) instead of only opening it.
    with _cold.facts_wanted():
        spec = await backend.spec_for(args)
    wait_s = info_wait_s(spec.size)
    wait_until = trio.current_time() + wait_s  # one wait for both: the protocols' and the probe's
    facts = await backend.wireshark.capinfos.capture_facts(spec.path, spec.identity, spec.size)

    def probe() -> decode_check.Probing:
        return backend.wireshark.probes.begin(spec.path, spec.identity, [c.port for c in spec.decode_checks])

    # What HTTP each TCP port carries: one more tshark pass over the file. A small capture's answer
    # waits for it within the same second as for the protocols, so it starts beside them. A big one's
    # answer does not wait for it (a 55 MB capture needs seconds on 2 cores): it starts after the
    # answer is made and goes on for the next call. Beside a loaded capture's first answer (sharkd's
    # protocol and conversation passes, side by side on two workers) it took one of 2 cores for
    # nothing this call shows: that answer took 1.47-1.63 s instead of ~0.9 (dense GTP-U, 50 MB).
    probing = probe() if wait_s else None
    if not backend.is_started(spec) and not wait_s:
        # A big fresh capture: the answer would not wait for the protocols, so it does not wait for the
        # capture's start either (5-10 ms of process starts on the call path, and what they cost the
        # reply on 2 cores); the start goes on beside it, as the same call would have left it.
        backend.begin(spec, Info())
        result = not_read_yet()
    else:
        result = await backend.ask(ctx, spec, Info())
    warnings = list(result.get("warnings", []))
    probed: _Probed = {}
    if probing is None:
        probing = probe()
    if not probing.done.is_set():
        with trio.move_on_at(wait_until):
            await probing.done.wait()
    if probing.done.is_set():
        probed["sbi_ports"] = decode_check.sbi_ports(probing.result(), spec.decode_checks)
    else:
        warnings.append("sbi_ports left out: the pass that reads what HTTP each TCP port carries is still "
                        "running; call again")
    sharkd_frames = result.get("sharkd_frames")
    if facts.warning and facts.warning not in warnings:
        warnings.append(facts.warning)
    if sharkd_frames is not None and sharkd_frames != facts.packets:
        warnings.append(f"sharkd loaded {sharkd_frames} frames where capinfos counts {facts.packets}")
    # Count and time span exactly as capinfos reports them (UTC, the capture's own precision).
    span: _Span = {"packet_count": facts.packets, "time_start": facts.iso(facts.start),
                   "time_end": facts.iso(facts.end), "duration_s": facts.duration_s,
                   "duration_s_text": facts.duration, "file_type": facts.file_type,
                   "file_encapsulation": facts.encapsulation}
    source = await backend.source(spec, args, command=["-T", "fields", "-e", "frame.protocols"],
                                  provisional=not result.get("protocols_ready", True))
    hashed: _Hashed = {"sha256": source["sha256"]} if "sha256" in source else {}  # a fresh 1 GB file: still hashing
    reply: _InfoShown = {**hashed, "file_size_bytes": spec.size, **span, **result, **probed, "warnings": warnings,
                         "tshark_version": (await backend.catalogue()).version, "source": source}
    reply.pop("sharkd_frames", None)  # the count is capinfos' (packet_count); sharkd's only checks it
    return reply


@tools.tool("pcap_frames_by_filter", "Packet-list rows of matching frames.",
            {**CAPTURE, **FILTER, **PAGING}, required=CAPTURE_ONLY, ui="ui://diagd/packet-list")
async def frames_by_filter(backend: PcapBackend, ctx: CallContext, args: Args) -> FramesReply:
    spec = await backend.spec_for(args)
    flt, limit, offset = args["display_filter"], args["limit"], args["offset"]
    built_by = None
    indexed: FramesAnswer | None = None
    # The whole capture's rows at any offset, from its index (pcap_index): no sharkd load, any size. A filter
    # it translates (or none) needs no field catalogue: a restarted daemon's first page does not wait the
    # second tshark takes to list its fields. A filter it does not translate is matched by tshark over the
    # frames it can match, cut from the file (the names' kinds say which). While it is built, a page within
    # the frames indexed so far (index/partial.py), when sharkd does not hold the capture.
    message = Frames(flt, limit, offset, None)
    if (index := await backend.index_for(spec, message)) is None:
        message = Frames(flt, limit, offset, await backend.kinds(flt))
        index = await backend.index_for(spec, message) or backend.building_index(spec)
    if index is not None and (got := await backend.ask_index(index, message, ctx.progress)) is not None:
        indexed, built_by = got
    result = indexed if indexed is not None else await backend.ask(ctx, spec, message)
    return {**result, "limit": limit, "offset": offset,
            "source": await backend.source(spec, args, display_filter=flt, command=packet_list_command(flt),
                                           provisional=SINGLE_PASS in result.get("served_by", ""), built_by=built_by)}


@tools.tool("pcap_index", "Build or read a capture's persistent index (Parquet, DuckDB): one tshark pass, kept "
            "across restarts; then unfiltered pages at any offset, timelines of its fields and pcap_stats "
            "conversations/endpoints come from it in ms.",
            {**CAPTURE, "wait_s": {"type": "number", "minimum": 0, "maximum": 600, "default": 0,
                                   "description": "wait this long for the build"}}, required=CAPTURE_ONLY)
async def pcap_index(backend: PcapBackend, ctx: CallContext, args: Args) -> IndexReply:
    spec = await backend.spec_for(args)
    ref = await backend.index(spec)
    # Within the call's own time (call_timeout_s unless timeout_s says more): the answer says "building"
    # a second before the deadline rather than the call ending in TIMEOUT.
    left = trio.current_effective_deadline() - trio.current_time() - 1.0
    wait_s = max(0.0, min(float(args["wait_s"]), left))
    result = await backend.runtime.ask(ref, IndexStatus(wait_s), progress=ctx.progress)
    summary = result.get("summary")
    if result["state"] == "ready" and summary is not None and "ngap" in summary["protocols"]:
        # What every NGAP summary's warnings need (decode_check.py: a pass over the whole file, kept on disk),
        # begun now: an NGAP answer from the index soon after does not wait for it.
        backend.wireshark.probes.begin(spec.path, spec.identity, [c.port for c in spec.decode_checks])
    return {**result, "source": await backend.source(spec, args, command=build_fields_args(),
                                                     built_by=backend.index_version(ref))}


def resolve_fields(cat: Catalogue, names: list[str]) -> tuple[dict[str, str], list[str]]:
    """(asked name -> canonical field, warnings); INVALID_FIELDS naming close matches of unknown ones."""
    resolved: dict[str, str] = {}
    warnings: list[str] = []
    unknown: dict[str, list[str]] = {}
    for name in names:
        canonical, warning = cat.resolve_field(name)
        if canonical is None:
            unknown[name] = cat.suggestions(name)
        else:
            resolved[name] = canonical
            if warning:
                warnings.append(warning)
    if unknown:
        raise DiagdError(ErrorCode.INVALID_FIELDS, f"unknown field(s): {', '.join(unknown)}", did_you_mean=unknown)
    return resolved, warnings


@tools.tool("pcap_timeline", "Field values per matching frame (tshark -T fields); repeated fields are arrays.",
            {**CAPTURE, **FILTER,
             "fields": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64,
                        "description": "e.g. ['_ws.col.Info']"},
             **paging(limit=200, maximum=5000),
             "sort_by": {"type": "string", "description": "one of fields"}},
            required=("pcap_path", "fields"))
async def timeline(backend: PcapBackend, ctx: CallContext, args: Args) -> TimelineReply:
    resolved, warnings = resolve_fields(await backend.catalogue(), args["fields"])
    fields = list(dict.fromkeys(resolved.values()))
    sort_by = args.get("sort_by")
    if sort_by is not None:
        sort_by = resolved.get(sort_by, sort_by)
        if sort_by not in fields and sort_by != "frame.number":
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sort_by {sort_by!r} is not one of the fields",
                             fields=fields)
    spec = await backend.spec_for(args)
    flt = args["display_filter"] or fields_filter(fields)
    limit, offset = args["limit"], args["offset"]
    built_by = None
    asked = Timeline(flt, tuple(fields), limit, offset, sort_by)
    indexed: TimelineAnswer | None = None
    # Values of the fields the index holds, with their default filter: from it, at any size, in ms; while it
    # is built, a page within the frames indexed so far (index/partial.py), when sharkd does not hold it.
    index = await backend.index_for(spec, asked) or backend.building_index(spec)
    if index is not None and (got := await backend.ask_index(index, asked, ctx.progress)) is not None:
        indexed, built_by = got
    result = indexed if indexed is not None else await backend.ask(
        ctx, spec, Timeline(flt, tuple(fields), limit, offset, sort_by, await backend.kinds(flt, *fields)))
    command = _cold.fields_argv([], flt, ["frame.number", *[f for f in fields if f != "frame.number"]])
    return {**result, "fields_resolved": resolved, "warnings": warnings, "limit": limit, "offset": offset,
            "sort_by": sort_by,
            "source": await backend.source(spec, args, display_filter=flt, fields=fields, command=command,
                                           provisional=SINGLE_PASS in result.get("served_by", ""),
                                           built_by=built_by)}


@tools.tool("pcap_frame_detail", "Decoded tree of frames (tshark -V text).",
            {**CAPTURE,
             "frame_numbers": {"type": "array", "items": FRAME_NUMBER, "minItems": 1, "maxItems": 100,
                               "description": "frames to decode"},
             **LAYERS,
             "verbosity": {"type": "string", "enum": ["summary", "full"], "default": "summary",
                           "description": "full adds hex"},
             "max_bytes": MAX_TEXT_BYTES},
            required=("pcap_path", "frame_numbers"))
async def frame_detail(backend: PcapBackend, ctx: CallContext, args: Args) -> DetailReply:
    spec = await backend.spec_for(args)
    message = Detail(tuple(args["frame_numbers"]), tuple(args["layers"]), args["restrict_layers"],
                     args["verbosity"], args["max_bytes"])
    result = await backend.ask(ctx, spec, message)
    members = sorted(set(message.frame_numbers))
    shown = f"frame.number == {members[0]}" if len(members) == 1 else \
        f"frame.number in {{{','.join(map(str, members))}}}"
    command = ["-Y", shown, "-V", *(["-x"] if message.verbosity == "full" else [])]
    return {**result, "source": await backend.source(spec, args, command=command)}


@tools.tool("pcap_text_search", "Search frames' decoded text; complete=false: go on from next_offset; "
            "exact=false: single pass.",
            {**CAPTURE, **FILTER,
             "query": {"type": "string", "minLength": 1, "description": "text or regex"},
             "is_regex": {"type": "boolean", "default": False, "description": "regex query"},
             "case_sensitive": {"type": "boolean", "default": False, "description": "match case"},
             **LAYERS,
             "limit": {"type": "integer", "minimum": 1, "maximum": 2**32 - 1,
                       "description": "frames to search (default all)"},
             "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "frames to skip"},
             "max_matches": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50,
                             "description": "stop after"},
             "snippet_context_chars": {"type": "integer", "minimum": 0, "maximum": 2000, "default": 240,
                                       "description": "around a match"},
             "max_bytes": MAX_TEXT_BYTES},
            required=("pcap_path", "query"))
async def text_search(backend: PcapBackend, ctx: CallContext, args: Args) -> SearchReply:
    spec = await backend.spec_for(args)
    # A bad pattern fails here, before any capture loads (the actor compiles it again: a compiled
    # pattern is no part of a message, which keys the actor's answer cache).
    await compile_in_thread(args["query"], literal=not args["is_regex"], case_sensitive=args["case_sensitive"])
    flt = args["display_filter"]
    message = TextSearch(display_filter=flt, query=args["query"], is_regex=args["is_regex"],
                         case_sensitive=args["case_sensitive"], budget_s=backend.runtime.config().regex_budget_s,
                         layers=tuple(args["layers"]), restrict_layers=args["restrict_layers"],
                         limit=args.get("limit"), offset=args["offset"], max_matches=args["max_matches"],
                         snippet_context_chars=args["snippet_context_chars"], max_bytes=args["max_bytes"],
                         stop_at=search_deadline(), kinds=await backend.kinds(flt))
    result = await backend.ask(ctx, spec, message)
    return {**result, "query": args["query"],
            "source": await backend.source(spec, args, display_filter=flt,
                                           command=[*(["-Y", flt] if flt else []), "-V"],
                                           provisional=SINGLE_PASS in result.get("served_by", ""))}


@tools.tool("pcap_follow", "Frames of a frame's stream/session/call/GTPv2 tunnel.",
            {**CAPTURE, **FILTER, "frame_number": {"type": "integer", "minimum": 1, "description": "in it"},
             "text": {"type": "integer", "description": "tcp/udp bytes"}, **PAGING},
            required=("pcap_path", "frame_number"))
async def follow(backend: PcapBackend, ctx: CallContext, args: Args) -> FollowReply:
    spec = await backend.spec_for(args)
    text = min(max(0, args.get("text", 0)), MAX_FOLLOW_TEXT)
    message = Follow(args["frame_number"], args["display_filter"], args["limit"], args["offset"], text)
    result = await backend.ask(ctx, spec, message)
    return {**result, "source": await backend.source(
        spec, args, display_filter=result["display_filter"], command=packet_list_command(result["display_filter"]))}


@tools.tool("pcap_packet_list", "Write a packet-list TSV to the output dir.",
            {**CAPTURE, **FILTER,
             "columns_profile": {"enum": ["default", "none"], "description": "none: extra columns only"},
             "include_default_columns": {"type": "boolean", "default": True, "description": "[pcap] columns"},
             "extra_columns": {"type": "array", "items": {
                 "type": "object", "properties": {"name": {"type": "string"}, "field": {"type": "string"}},
                 "required": ["field"], "additionalProperties": False}, "default": [], "description": "more columns"},
             "preview_rows": {"type": "integer", "minimum": 0, "maximum": 500, "default": 50,
                              "description": "rows inline"}},
            required=CAPTURE_ONLY, read_only=False)
async def packet_list(backend: PcapBackend, ctx: CallContext, args: Args) -> PacketListReply:
    cat = await backend.catalogue()
    columns = [Column(c["name"], c["field"]) for c in backend.settings.packet_list_columns]
    warnings: list[str] = []
    for col in args["extra_columns"]:
        canonical, warning = cat.resolve_field(col["field"])
        if canonical is None:
            raise DiagdError(ErrorCode.INVALID_FIELDS, f"unknown field {col['field']!r}",
                             did_you_mean={col["field"]: cat.suggestions(col["field"])})
        if warning:
            warnings.append(warning)
        columns.append(Column(col.get("name") or canonical, canonical))
    include_default = args["include_default_columns"] and args.get("columns_profile") != "none"
    if not include_default and not columns:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "no columns: keep the default columns or add extra_columns")
    spec = await backend.spec_for(args)
    output = backend.export_path(spec.path.stem, ".tsv")
    flt = args["display_filter"]
    result = await backend.ask(ctx, spec, PacketList(flt, tuple(columns), include_default, str(output),
                                                     args["preview_rows"]))
    command = packet_file_command(flt, [{"name": c.name, "field": c.field} for c in columns], include_default)
    return {**result, "warnings": warnings,
            "source": await backend.source(spec, args, display_filter=flt, command=command)}


@tools.tool("pcap_extract_subcapture", "Write matching frames to a new pcapng in the output dir.",
            {**CAPTURE, **FILTER, "frame_numbers": {"type": "array", "items": FRAME_NUMBER, "maxItems": 100000,
                                                    "description": "these frames (and display_filter)"}},
            required=CAPTURE_ONLY, read_only=False, timeout_s=120)
async def extract(backend: PcapBackend, ctx: CallContext, args: Args) -> ExtractReply:
    spec = await backend.spec_for(args)
    flt = args["display_filter"]
    if args.get("frame_numbers"):
        members = ",".join(str(n) for n in sorted(set(args["frame_numbers"])))
        numbers_filter = f"frame.number in {{{members}}}"
        flt = f"({numbers_filter}) && ({flt})" if flt else numbers_filter
    if not flt:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "give display_filter or frame_numbers")
    if args["display_filter"]:
        await backend.ask(ctx, spec, Check(args["display_filter"]))
    output = backend.export_path(spec.path.stem, ".pcapng")
    result = await backend.ask(ctx, spec, Export(flt, str(output)))
    tail = ["-Y", flt, "-w", str(output), "-F", "pcapng"]
    return {**result, "source": await backend.source(spec, args, display_filter=flt, command=tail)}


@tools.tool("pcap_stats", "tshark -z statistics.",
            {**CAPTURE, "kind": {"enum": list(_stats.KINDS), "description": "which"},
             "protocol": {"type": "string", "description": "srt/conversations/endpoints of"}, **FILTER,
             "interval_ms": {"type": "integer", "minimum": 1, "description": "io bin"}, **PAGING},
            required=("pcap_path", "kind"), ui="ui://diagd/stats")
async def pcap_stats(backend: PcapBackend, ctx: CallContext, args: Args) -> StatsReply:
    message = _stats.resolve(args["kind"], args.get("protocol"), args["display_filter"], args.get("interval_ms"))
    if message.display_filter:  # the filter's names: whether the index may apply it to a cut (narrowing.py)
        message = replace(message, kinds=await backend.kinds(message.display_filter))
    spec = await backend.spec_for(args)
    offset, limit = args["offset"], args["limit"]
    if (indexed := await _stats_from_index(backend, ctx, spec, IndexStats(message, offset, limit))) is not None:
        result, built_by = indexed
        page, total = result["rows"], result.get("total", 0)
    else:
        result, built_by = await backend.ask(ctx, spec, message), None
        page, total = result["rows"][offset:offset + limit], len(result["rows"])
    flt = message.display_filter
    answer: _StatsShown = {
        "kind": message.kind, "protocol": message.protocol, **result, "total": total, "rows": page,
        "offset": offset, "limit": limit, "has_more": offset + len(page) < total,
        "source": await backend.source(spec, args, display_filter=flt, command=_stats.tap_command(message),
                                       built_by=built_by)}
    if total and not page:
        answer["reason"] = f"offset {offset} is past the last of {total} rows"
    return answer


async def _stats_from_index(backend: PcapBackend, ctx: CallContext, spec: CaptureSpec, paged: IndexStats
                            ) -> tuple[StatsAnswer, str | None] | None:
    """A page of conversations, endpoints, I/O intervals or response times of a capture of any size from its
    index (pcap_index), paged there, and the tshark that built it; None: the loaded capture answers (no
    ready index, a question it does not answer, or one it cannot after all, as a file it cannot cut)."""
    if (index := await backend.index_for(spec, paged.question)) is None:
        return None
    return await backend.ask_index(index, paged, ctx.progress)


class _StatsShown(StatsReply):
    """pcap_stats' reply as built: what each kind of statistics says beyond the model's keys."""

    items: NotRequired[int]
    by_severity: NotRequired[dict[str, int]]
    by_protocol: NotRequired[dict[str, dict[str, int]]]
    interval_ms: NotRequired[int]
    frames: NotRequired[int]
    bytes: NotRequired[int]
    icmp_errors_quoting_no_request: NotRequired[int]
    acks: NotRequired[int]
    unread_frames: NotRequired[list[int]]


@tools.tool("pcap_list_fields", "Wireshark fields whose name or description matches query.",
            {"query": {"type": "string", "default": "", "description": "text or regex"},
             "is_regex": {"type": "boolean", "default": False, "description": "regex query"},
             "case_sensitive": {"type": "boolean", "default": False, "description": "match case"},
             "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 100, "description": "at most"},
             "include_protocols": {"type": "array", "items": {"type": "string"}, "default": [],
                                   "description": "only of these"}})
async def list_fields(backend: PcapBackend, ctx: CallContext, args: Args) -> ListFieldsReply:
    cat = await backend.catalogue()
    pattern = await compile_in_thread(args["query"], literal=not args["is_regex"],
                                      case_sensitive=args["case_sensitive"])
    limit = args["limit"]
    matcher = Matcher(pattern, backend.runtime.config().regex_budget_s, unit="field", total=len(cat.fields))
    rows = await search_fields(cat, pattern, matcher, protocols=set(args["include_protocols"]))
    matches: list[FieldInfo] = [{"name": name, "description": desc, "type": ftype, "protocol": proto}
               for name, (desc, ftype, proto) in rows[:limit]]
    return {"total": len(rows), "fields": matches, "truncated": len(rows) > limit, "tshark_version": cat.version}


@tools.tool("pcap_fields_search", "Wireshark fields by name prefix.",
            {"prefix": {"type": "string", "minLength": 1, "description": "e.g. 'ngap.'"},
             "keyword": {"type": "string", "default": "", "description": "in name or description"},
             "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 200, "description": "at most"}},
            required=("prefix",))
async def fields_search(backend: PcapBackend, ctx: CallContext, args: Args) -> FieldsSearchReply:
    table = (await backend.catalogue()).table
    prefix, keyword, limit = args["prefix"], args["keyword"].lower(), args["limit"]
    # The names with the prefix are one range of the name-sorted table, listed in catalogue order.
    matches: list[FieldInfo] = [
        {"name": name, "description": desc, "type": ftype}
        for name, (desc, ftype, _) in map(table.row, table.with_prefix(prefix))
        if not keyword or keyword in name.lower() or keyword in desc.lower()
    ]
    return {"total": len(matches), "fields": matches[:limit], "truncated": len(matches) > limit}


@tools.tool("pcap_config_get", "Profiles, columns, limits, output dir, loaded captures.", {})
async def config_get(backend: PcapBackend, ctx: CallContext, args: Args) -> ConfigReply:
    s, runtime = backend.settings, backend.runtime
    # An evicted capture's actor is stopping (its workers already gone): it is not loaded any more.
    loaded = [ref.statistics() for ref in runtime.actors(KIND) if ref.accepting]
    return {"profiles": s.profiles, "packet_list_columns": list(s.packet_list_columns),
            "allowed_dirs": list(s.allowed_dirs), "output_dir": str(s.output_dir), "max_loaded": s.max_loaded,
            "max_memory_mb": s.max_memory_mb, "workers_per_capture": s.workers_per_capture,
            "idle_timeout_s": s.idle_timeout_s if math.isfinite(s.idle_timeout_s) else None,
            "max_exports": s.max_exports, "mask_subscriber_ids": s.mask_subscriber_ids,
            "call_timeout_s": runtime.config().call_timeout_s, "loaded_captures": loaded}
