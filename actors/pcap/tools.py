"""The pcap back end's MCP tools: capture specs, the LRU of loaded captures, schemas and handlers."""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors._paths import resolve_allowed
from diagd.actors._subprocess import run
from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.base import Op
from diagd.actors.pcap import tshark as _cold
from diagd.actors.pcap.actor import KIND, PcapActor
from diagd.actors.pcap.capture import CaptureSpec
from diagd.actors.pcap.field_search import search_fields
from diagd.actors.pcap.mask import SubscriberMask
from diagd.actors.pcap.rows import (
    packet_file_command,
    packet_list_command,
)
from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.wireshark import (
    COLUMN_PREFIX,
    capture_sha256,
    catalogue,
    parse_decode_as,
)
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, Handler, ToolSpec, caller_cwd
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

FRAME_NUMBER = {"type": "integer", "minimum": 1, "maximum": 2**32 - 1}  # frame.number is a uint32 in Wireshark


# ---------------------------------------------------------------------------------------------
# Tools


class PcapBackend:
    """Daemon-side state of the pcap back end: settings, capture keys, LRU of loaded workers."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.recent: OrderedDict[str, float] = OrderedDict()

    @property
    def settings(self) -> PcapSettings:
        # re-read: `diagd reload` applies at once
        return PcapSettings.from_config(self.runtime.config(), self.runtime.state_dir)

    async def spec_for(self, args: dict[str, Any], *, force_prefs: dict[str, str] | None = None) -> CaptureSpec:
        settings = self.settings
        readable = settings.allowed_dirs
        if readable:
            # What diagd wrote itself (sub-captures, packet lists) can be analysed next without
            # widening allowed_dirs by hand. An empty allow-list already means no restriction.
            readable = (*readable, str(settings.output_dir))
        path = resolve_allowed(str(args["pcap_path"]), readable, what="capture", cwd=caller_cwd())
        profile_name = args.get("profile")
        profile: dict[str, Any] = {}
        if profile_name:
            if profile_name not in settings.profiles:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown profile {profile_name!r}",
                                 profiles=sorted(settings.profiles))
            profile = settings.profiles[profile_name]
        decode_as = [*profile.get("decode_as", []), *_as_list(args.get("decode_as"))]
        cat = await catalogue()
        for rule in decode_as:
            parse_decode_as(rule, cat)  # refuse an unknown protocol before loading anything
        prefs = {**{k: str(v) for k, v in profile.get("preferences", {}).items()}, **(force_prefs or {})}
        sha, size = await capture_sha256(path)
        # Every tool refuses a file that is no capture before a worker is started for it.
        await _cold.capture_facts(path, sha, size)
        return CaptureSpec(path=path, sha256=sha, decode_as=tuple(dict.fromkeys(decode_as)),
                           preferences=tuple(sorted(prefs.items())), size=size)

    async def ask(self, ctx: CallContext, spec: CaptureSpec, op: str, op_args: dict[str, Any]) -> dict[str, Any]:
        settings = self.settings
        if self.runtime.find(KIND, spec.key) is None:
            self._evict(settings.max_loaded - 1)
        ref = await self.runtime.start(KIND, spec.key, lambda: PcapActor(spec.key, spec),
                                       idle_timeout_s=lambda: self.settings.idle_timeout_s)  # follows a reload
        self.recent[spec.key] = trio.current_time()
        self.recent.move_to_end(spec.key)
        return await self.runtime.ask(ref, Op(op, op_args), progress=ctx.progress)

    def _evict(self, keep: int) -> None:
        """Stop least recently used workers until at most `keep` stay loaded."""
        loaded = [k for k in self.recent if self.runtime.find(KIND, k) is not None]
        for key in loaded[: max(0, len(loaded) - keep)]:
            ref = self.runtime.find(KIND, key)
            if ref is not None:
                log.info("evicting capture", actor=ref.id, resource=key)
                self.runtime.stop(ref, reason="evicted (max_loaded captures)")
            self.recent.pop(key, None)

    async def source(self, spec: CaptureSpec, args: dict[str, Any], *, command: list[str] | None = None,
                     **extra: Any) -> dict[str, Any]:
        """Where an answer came from. With include_command, the tshark command that prints the same
        rows: `command` is what follows the capture's own options (filter, output format), given by
        each tool; without it the display filter alone."""
        cat = await catalogue()
        out: dict[str, Any] = {"pcap_path": str(spec.path), "sha256": spec.sha256, "profile": args.get("profile"),
                               **spec.describe(), "tshark_version": cat.version, **extra}
        if args.get("include_command"):
            argv = _cold.base_argv(spec.path, spec.decode_as, spec.preferences)
            if command is not None:
                argv += command
            elif extra.get("display_filter"):
                argv += ["-Y", extra["display_filter"]]
            out["equivalent_command"] = argv
            out["equivalent_command_line"] = shlex.join(argv)
        return out

    def finish(self, result: dict[str, Any]) -> dict[str, Any]:
        # Subscriber-identity masking is not done here but at the tool boundary (`register`), which
        # every result, error and progress message passes, so a handler cannot forget it.
        return result

    async def identity_source(self, args: dict[str, Any]) -> tuple[str, list[str]] | None:
        """(key, tshark argv) of the capture a call reads, decoded as the call decodes it."""
        if "pcap_path" not in args:
            return None
        spec = await self.spec_for(args)
        # ngap_* tools force null-deciphering, which identity collection always turns on: one key.
        prefs = [p for p in spec.preferences if p[0] != "nas-5gs.null_decipher"]
        key = f"{spec.sha256}:{json.dumps([spec.decode_as, prefs])}"
        return key, _cold.base_argv(spec.path, spec.decode_as, spec.preferences)

    def export_path(self, stem: str, suffix: str) -> Path:
        """A unique file in the output dir; the oldest exports beyond max_exports are removed."""
        settings = self.settings
        out = settings.output_dir
        out.mkdir(parents=True, exist_ok=True)
        existing = sorted(out.glob("*"), key=lambda p: p.stat().st_mtime)
        for old in existing[: max(0, len(existing) - settings.max_exports + 1)]:
            old.unlink(missing_ok=True)
        stamp = utc.compact()
        return out / f"{stem}-{stamp}-{os.urandom(3).hex()}{suffix}"


def search_deadline() -> float | None:
    """When a long scan stops to answer in time: the call's deadline less a margin for the answer
    (15 % of the time left, at least a second); None when the call has no deadline."""
    deadline = trio.current_effective_deadline()
    if math.isinf(deadline):
        return None
    now = trio.current_time()
    return deadline - max(1.0, 0.15 * (deadline - now))


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


_CAPTURE = {
    "pcap_path": {"type": "string", "description": "Capture file (pcap/pcapng), inside the allowed directories"},
    "decode_as": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
                  "description": "Decode-as rules like 'tcp.port==7777,http2' (HTTP/2 SBI on 7777 needs it)"},
    "profile": {"type": "string", "description": "Named decode_as + preferences set (e.g. '5gc-lab'); "
                                                 "see pcap_config_get"},
    "include_command": {"type": "boolean", "default": False,
                        "description": "Also return the equivalent tshark command line"},
}
_FILTER = {"display_filter": {"type": "string", "default": "",
                              "description": "Wireshark display filter, e.g. 'ngap && sctp'"}}
_PAGING = {
    "limit": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 500},
    "offset": {"type": "integer", "minimum": 0, "default": 0},
}


def _schema(props: dict[str, Any], required: tuple[str, ...] = ("pcap_path",)) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def register(runtime: Runtime) -> None:
    backend = PcapBackend(runtime)

    async def field_names() -> list[str]:
        return list((await catalogue()).fields)

    # The one masking boundary: every pcap tool is registered through `tool()` below.
    masking = SubscriberMask(enabled=lambda: backend.settings.mask_subscriber_ids,
                             output_dir=lambda: backend.settings.output_dir,
                             capture_of=backend.identity_source, known_fields=field_names)

    def tool(name: str, description: str, props: dict[str, Any], required: tuple[str, ...] = ("pcap_path",),
             read_only: bool = True, timeout_s: float | None = None) -> Callable[[Handler], Handler]:
        def wrap(handler: Handler) -> Handler:
            runtime.register_tool(ToolSpec(name=name, description=description, input_schema=_schema(props, required),
                                       handler=masking.guard(name, handler), read_only=read_only, idempotent=True,
                                       timeout_s=timeout_s))
            return handler  # unmasked: handlers calling each other (config_reload) are masked once, outside
        return wrap

    @tool("pcap_info", "Overview of a capture: sha256, packet count, time span, which telecom protocols occur "
          "(ngap, nas-5gs, pfcp, gtpv2, sip, diameter, http2...) and the top conversations (SCTP/N2 first). "
          "Start here.", {**_CAPTURE})
    async def pcap_info(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        facts = await _cold.capture_facts(spec.path, spec.sha256, spec.size)
        result = await backend.ask(ctx, spec, "info", {})
        sharkd_frames = result.pop("sharkd_frames", None)
        warnings = list(result.pop("warnings", []))
        if facts.warning and facts.warning not in warnings:
            warnings.append(facts.warning)
        if sharkd_frames is not None and sharkd_frames != facts.packets:
            warnings.append(f"sharkd loaded {sharkd_frames} frames where capinfos counts {facts.packets}")
        # Count and time span exactly as capinfos reports them (UTC, the capture's own precision).
        span = {"packet_count": facts.packets, "time_start": facts.iso(facts.start), "time_end": facts.iso(facts.end),
                "duration_s": facts.duration_s, "duration_s_text": facts.duration, "file_type": facts.file_type,
                "file_encapsulation": facts.encapsulation}
        return backend.finish({"sha256": spec.sha256, "file_size_bytes": spec.size, **span, **result,
                               "warnings": warnings, "tshark_version": (await catalogue()).version,
                               "source": await backend.source(spec, args, command=["-q", "-z", "io,phs"])})

    @tool("pcap_frames_by_filter", "Frames matching a display filter (Wireshark packet-list columns), paged. "
          "A filter that matches nothing says whether its protocols occur in the capture at all.",
          {**_CAPTURE, **_FILTER, **_PAGING})
    async def frames_by_filter(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        flt, limit, offset = args.get("display_filter", ""), args.get("limit", 500), args.get("offset", 0)
        result = await backend.ask(ctx, spec, "frames", {"display_filter": flt, "limit": limit, "offset": offset})
        return backend.finish({**result, "limit": limit, "offset": offset,
                               "source": await backend.source(spec, args, display_filter=flt,
                                                              command=packet_list_command(flt))})

    @tool("pcap_timeline", "Rows of field values (exactly as tshark -T fields prints them; packet-list columns as "
          "_ws.col.Info, _ws.col.Protocol...) for frames matching a filter; "
          "multi-occurrence fields (several NGAP PDUs or AVPs in one frame) come back as arrays. Unknown fields "
          "give INVALID_FIELDS with close matches; case-only mistakes are fixed with a warning.",
          {**_CAPTURE, **_FILTER,
           "fields": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64},
           "limit": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 200},
           "offset": {"type": "integer", "minimum": 0, "default": 0},
           "sort_by": {"type": "string", "description": "a field of `fields` (default: frame order)"}},
          required=("pcap_path", "fields"))
    async def timeline(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        cat = await catalogue()
        resolved: dict[str, str] = {}
        warnings: list[str] = []
        unknown: dict[str, list[str]] = {}
        for name in args["fields"]:
            canonical, warning = cat.resolve_field(name)
            if canonical is None:
                unknown[name] = cat.suggestions(name)
            else:
                resolved[name] = canonical
                if warning:
                    warnings.append(warning)
        if unknown:
            raise DiagdError(ErrorCode.INVALID_FIELDS, f"unknown field(s): {', '.join(unknown)}", did_you_mean=unknown)
        fields = list(dict.fromkeys(resolved.values()))
        sort_by = args.get("sort_by")
        if sort_by is not None:
            sort_by = resolved.get(sort_by, sort_by)
            if sort_by not in fields and sort_by != "frame.number":
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sort_by {sort_by!r} is not one of the fields",
                                 fields=fields)
        spec = await backend.spec_for(args)
        # Columns (_ws.col.*) are no display-filter fields: they cannot narrow the default filter.
        flt = args.get("display_filter") or " || ".join(
            f for f in fields if f != "frame.number" and not f.startswith(COLUMN_PREFIX)) or ""
        limit, offset = args.get("limit", 200), args.get("offset", 0)
        result = await backend.ask(ctx, spec, "timeline", {"display_filter": flt, "fields": fields, "limit": limit,
                                                           "offset": offset, "sort_by": sort_by})
        return backend.finish({**result, "fields_resolved": resolved, "warnings": warnings, "limit": limit,
                               "offset": offset, "sort_by": sort_by,
                               "source": await backend.source(
                                   spec, args, display_filter=flt, fields=fields,
                                   command=_cold.fields_argv([], flt, ["frame.number",
                                                                       *[f for f in fields if f != "frame.number"]]))})

    @tool("pcap_frame_detail", "Decoded protocol tree of frames as text (as tshark -V prints it), cut to the "
          "requested protocol subtrees (layers, e.g. ['ngap'] or ['nas-5gs'] / ['nas_5gs']); a layer none of the "
          "frames has is an error naming the layers they have. verbosity 'full' adds a hex dump. Capped by max_bytes.",
          {**_CAPTURE,
           "frame_numbers": {"type": "array", "items": FRAME_NUMBER, "minItems": 1,
                             "maxItems": 100},
           "layers": {"type": "array", "items": {"type": "string"}, "default": []},
           "restrict_layers": {"type": "boolean", "default": True},
           "verbosity": {"type": "string", "enum": ["summary", "full"], "default": "summary"},
           "max_bytes": {"type": "integer", "minimum": 1000, "maximum": 2 * 1024 * 1024, "default": 200000}},
          required=("pcap_path", "frame_numbers"))
    async def frame_detail(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        op_args = {"frame_numbers": args["frame_numbers"], "layers": args.get("layers", []),
                   "restrict_layers": args.get("restrict_layers", True),
                   "verbosity": args.get("verbosity", "summary"), "max_bytes": args.get("max_bytes", 200000)}
        result = await backend.ask(ctx, spec, "detail", op_args)
        members = sorted(set(args["frame_numbers"]))
        shown = f"frame.number == {members[0]}" if len(members) == 1 else \
            f"frame.number in {{{','.join(map(str, members))}}}"
        command = ["-Y", shown, "-V", *(["-x"] if op_args["verbosity"] == "full" else [])]
        return backend.finish({**result, "source": await backend.source(spec, args, command=command)})

    @tool("pcap_text_search", "Search the decoded text (tshark -V) of every frame matching display_filter "
          "(optionally only some layers) for a string or regex; returns matching lines with snippets. A search "
          "cut short (time, limit, max_matches) says complete=false, why, and the next_offset to continue from.",
          {**_CAPTURE, **_FILTER,
           "query": {"type": "string", "minLength": 1},
           "is_regex": {"type": "boolean", "default": False},
           "case_sensitive": {"type": "boolean", "default": False},
           "layers": {"type": "array", "items": {"type": "string"}, "default": []},
           "restrict_layers": {"type": "boolean", "default": True},
           "limit": {"type": "integer", "minimum": 1, "maximum": 2**32 - 1,
                     "description": "search at most this many frames (default: every frame matching the filter, "
                                    "as far as the call's time allows)"},
           "offset": {"type": "integer", "minimum": 0, "default": 0},
           "max_matches": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
           "snippet_context_chars": {"type": "integer", "minimum": 0, "maximum": 2000, "default": 240},
           "max_bytes": {"type": "integer", "minimum": 1000, "maximum": 2 * 1024 * 1024, "default": 200000}},
          required=("pcap_path", "query"))
    async def text_search(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        # A bad pattern fails here, before any capture loads (the actor compiles it again: its
        # arguments stay JSON, they key its result cache).
        await compile_in_thread(args["query"], literal=not args.get("is_regex", False),
                                case_sensitive=args.get("case_sensitive", False))
        op_args = {"display_filter": args.get("display_filter", ""), "query": args["query"],
                   "is_regex": args.get("is_regex", False), "case_sensitive": args.get("case_sensitive", False),
                   "budget_s": runtime.config().regex_budget_s,
                   "layers": args.get("layers", []), "restrict_layers": args.get("restrict_layers", True),
                   "limit": args.get("limit"), "offset": args.get("offset", 0),
                   "max_matches": args.get("max_matches", 50),
                   "snippet_context_chars": args.get("snippet_context_chars", 240),
                   "max_bytes": args.get("max_bytes", 200000), "stop_at": search_deadline()}
        result = await backend.ask(ctx, spec, "text_search", op_args)
        flt = op_args["display_filter"]
        return backend.finish({**result, "query": args["query"],
                               "source": await backend.source(spec, args, display_filter=flt,
                                                              command=[*(["-Y", flt] if flt else []), "-V"])})

    @tool("pcap_follow", "Follow the conversation a frame belongs to: an HTTP/2 stream (tcp.stream + "
          "http2.streamid), a Diameter Session-Id or a SIP Call-ID; returns the follow filter and its frames.",
          {**_CAPTURE, **_FILTER, "frame_number": {"type": "integer", "minimum": 1}, **_PAGING},
          required=("pcap_path", "frame_number"))
    async def follow(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        op_args = {"frame_number": args["frame_number"], "display_filter": args.get("display_filter", ""),
                   "limit": args.get("limit", 500), "offset": args.get("offset", 0)}
        result = await backend.ask(ctx, spec, "follow", op_args)
        return backend.finish({**result, "source": await backend.source(
            spec, args, display_filter=result["display_filter"],
            command=packet_list_command(result["display_filter"]))})

    @tool("pcap_packet_list", "Write a Wireshark-style packet list (default columns plus extra field columns) to a "
          "TSV file in the output directory; returns its path, row count and a preview.",
          {**_CAPTURE, **_FILTER,
           "columns_profile": {"type": "string", "description": "'default' or 'none' (only extra columns)"},
           "include_default_columns": {"type": "boolean", "default": True},
           "extra_columns": {"type": "array", "items": {
               "type": "object", "properties": {"name": {"type": "string"}, "field": {"type": "string"}},
               "required": ["field"], "additionalProperties": False}, "default": []},
           "preview_rows": {"type": "integer", "minimum": 0, "maximum": 500, "default": 50}},
          read_only=False)
    async def packet_list(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        cat = await catalogue()
        settings = backend.settings
        columns: list[dict[str, str]] = [dict(c) for c in settings.packet_list_columns]
        warnings: list[str] = []
        for col in args.get("extra_columns", []):
            canonical, warning = cat.resolve_field(col["field"])
            if canonical is None:
                raise DiagdError(ErrorCode.INVALID_FIELDS, f"unknown field {col['field']!r}",
                                 did_you_mean={col["field"]: cat.suggestions(col["field"])})
            if warning:
                warnings.append(warning)
            columns.append({"name": col.get("name") or canonical, "field": canonical})
        include_default = args.get("include_default_columns", True) and args.get("columns_profile") != "none"
        if not include_default and not columns:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "no columns: keep the default columns or add extra_columns")
        spec = await backend.spec_for(args)
        output = backend.export_path(spec.path.stem, ".tsv")
        op_args = {"display_filter": args.get("display_filter", ""), "columns": columns,
                   "include_default_columns": include_default, "output_path": str(output),
                   "preview_rows": args.get("preview_rows", 50)}
        result = await backend.ask(ctx, spec, "packet_list", op_args)
        flt = op_args["display_filter"]
        return backend.finish({**result, "warnings": warnings,
                               "source": await backend.source(spec, args, display_filter=flt,
                                                              command=packet_file_command(flt, columns,
                                                                                          include_default))})

    @tool("pcap_extract_subcapture", "Write the frames matching a display filter (or the listed frame numbers) to a "
          "new pcapng file in the output directory, for sharing and reproduction.",
          {**_CAPTURE, **_FILTER,
           "frame_numbers": {"type": "array", "items": FRAME_NUMBER, "maxItems": 100000}},
          read_only=False, timeout_s=120)
    async def extract(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        spec = await backend.spec_for(args)
        flt = args.get("display_filter", "")
        if args.get("frame_numbers"):
            members = ",".join(str(n) for n in sorted(set(args["frame_numbers"])))
            numbers_filter = f"frame.number in {{{members}}}"
            flt = f"({numbers_filter}) && ({flt})" if flt else numbers_filter
        if not flt:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "give display_filter or frame_numbers")
        if args.get("display_filter"):
            await backend.ask(ctx, spec, "check", {"display_filter": args["display_filter"]})
        output = backend.export_path(spec.path.stem, ".pcapng")
        tail = ["-Y", flt, "-w", str(output), "-F", "pcapng"]
        argv = [*_cold.base_argv(spec.path, spec.decode_as, spec.preferences), *tail]
        done = await run(argv)
        if done.returncode != 0:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "tshark could not write the sub-capture",
                             stderr=done.stderr[-2000:])
        counted = await run(["capinfos", "-M", "-c", "-T", "-r", str(output)])
        fields = counted.out.strip().split("\t")
        packets = int(fields[-1]) if counted.returncode == 0 and fields[-1].isdigit() else 0
        if packets == 0:
            output.unlink(missing_ok=True)
            raise DiagdError(ErrorCode.NOT_FOUND, "no frame matches: nothing to extract", display_filter=flt)
        return backend.finish({"output_path": str(output), "packet_count": packets,
                               "file_size_bytes": output.stat().st_size, "display_filter": flt,
                               "source": await backend.source(spec, args, display_filter=flt, command=tail)})

    async def ngap_summary(ctx: CallContext, args: dict[str, Any], op: str) -> dict[str, Any]:
        # NGAP UE ids are unique only inside one SCTP association: Wireshark numbers them (first pass).
        prefs = {"sctp.association_index": "TRUE"}
        if args.get("null_decipher", True):
            prefs["nas-5gs.null_decipher"] = "TRUE"
        spec = await backend.spec_for(args, force_prefs=prefs)
        result = await backend.ask(ctx, spec, op, {"display_filter": args.get("display_filter", "")})
        return backend.finish({**result, "source": await backend.source(spec, args)})

    ngap_props = {**_CAPTURE, **_FILTER, "null_decipher": {"type": "boolean", "default": True}}
    tool("ngap_ue_sessions", "5G N2 view per UE context, keyed by (SCTP association, AMF-UE-NGAP-ID, "
         "RAN-UE-NGAP-ID) so gNBs reusing ids stay apart: gNB, SUCI MSIN, 5G-TMSI, first/last time, frames, NGAP "
         "procedures in order, NAS messages, failures (frame, kind, code, cause, why; normal releases are not "
         "failures), failed_ues, NG associations, and contexts linked only on evidence (same SUCI, 5G-TMSI, path "
         "switch, handover). NAS after Security Mode is decoded with nas-5gs.null_decipher unless "
         "null_decipher=false.",
         ngap_props)(functools.partial(ngap_summary, op="ngap_sessions"))
    tool("ngap_pdu_session_summary", "One entry per PDU session establishment (UE context, session id, n-th "
         "request): NAS establishment request/accept/reject, NGAP PDU session resource setup request/response, N3 "
         "uplink/downlink address and TEID, QFIs, S-NSSAI, DNN, UE IP, failure causes (NGAP and 5GSM), status; "
         "established_count, rejected (reject or failed setup), incomplete.",
         ngap_props)(functools.partial(ngap_summary, op="pdu_sessions"))

    @tool("pcap_list_fields", "Discover Wireshark field names (from tshark -G fields) by substring or regex over "
          "names and descriptions.",
          {"query": {"type": "string", "default": ""}, "is_regex": {"type": "boolean", "default": False},
           "case_sensitive": {"type": "boolean", "default": False},
           "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 100},
           "include_protocols": {"type": "array", "items": {"type": "string"}, "default": []}}, required=())
    async def list_fields(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        cat = await catalogue()
        query = args.get("query", "")
        pattern = await compile_in_thread(query, literal=not args.get("is_regex"),
                                          case_sensitive=bool(args.get("case_sensitive")))
        protocols = set(args.get("include_protocols", []))
        limit = args.get("limit", 100)
        matcher = Matcher(pattern, runtime.config().regex_budget_s, unit="field", total=len(cat.fields))
        rows = await search_fields(cat, pattern, matcher, protocols=protocols)
        matches = [{"name": name, "description": desc, "type": ftype, "protocol": proto}
                   for name, (desc, ftype, proto) in rows[:limit]]
        return {"total": len(rows), "fields": matches, "truncated": len(rows) > limit,
                "tshark_version": cat.version}

    @tool("pcap_fields_search", "Fields whose name starts with a prefix (e.g. 'ngap.'), optionally containing a "
          "keyword in name or description.",
          {"prefix": {"type": "string", "minLength": 1}, "keyword": {"type": "string", "default": ""},
           "limit": {"type": "integer", "minimum": 1, "maximum": 2000, "default": 200}}, required=("prefix",))
    async def fields_search(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        cat = await catalogue()
        prefix, keyword = args["prefix"], args.get("keyword", "").lower()
        limit = args.get("limit", 200)
        matches = [
            {"name": name, "description": desc, "type": ftype}
            for name, (desc, ftype, _) in cat.fields.items()
            if name.startswith(prefix) and (not keyword or keyword in name.lower() or keyword in desc.lower())
        ]
        return {"total": len(matches), "fields": matches[:limit], "truncated": len(matches) > limit}

    @tool("pcap_config_get", "The pcap back end's configuration: profiles (decode_as + preferences), packet-list "
          "columns, allowed directories, limits, output directory, and the captures loaded now.", {}, required=())
    async def config_get(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        s = backend.settings
        loaded = [ref.statistics() for ref in runtime.actors(KIND)]
        return {"profiles": s.profiles, "packet_list_columns": list(s.packet_list_columns),
                "allowed_dirs": list(s.allowed_dirs), "output_dir": str(s.output_dir), "max_loaded": s.max_loaded,
                "idle_timeout_s": s.idle_timeout_s if math.isfinite(s.idle_timeout_s) else None,
                "max_exports": s.max_exports, "mask_subscriber_ids": s.mask_subscriber_ids,
                "call_timeout_s": runtime.config().call_timeout_s, "loaded_captures": loaded}

    @tool("pcap_config_reload", "Re-read the config file (profiles, columns, limits) without a restart.", {},
          required=(), read_only=False)
    async def config_reload(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        runtime.reload()
        result: dict[str, Any] = await config_get(ctx, args)
        return result
