"""The pcap actor: one warm `sharkd` worker per capture, on Wireshark's own dissectors.

Actor key: the capture's sha256 + decode-as rules + preferences, so the same file opened with the
same decoding by any client shares one loaded worker. The worker loads the file once and answers
filters, frame trees and follows from memory; plain tshark is used where it is the right tool
(sub-capture export with `-w`, timeline values with `-T fields`, capinfos for the count and time
span). Loaded captures are capped (LRU eviction) and expire when idle.

Answers are what Wireshark's command-line tools print for the same question, and `include_command`
shows that command: timeline values come from `tshark -T fields` itself (the protocol tree's filter
strings differ from it for hex widths, bytes and times), frame text is rendered as `tshark -V` renders
it, the time span is capinfos' own text.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors import _pcap_ngap as ngap_summary
from diagd.actors import _pcap_tree as tree_mod
from diagd.actors import _tshark_cold as _cold
from diagd.actors._field_search import search_fields
from diagd.actors._paths import resolve_allowed
from diagd.actors._pcap_mask import SubscriberMask
from diagd.actors._sharkd import Sharkd, SharkdError
from diagd.actors._subprocess import run
from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors._wireshark import (
    COLUMN_FIELDS,
    COLUMN_FORMATS,
    COLUMN_PREFIX,
    Catalogue,
    capture_sha256,
    catalogue,
    column_format_pref,
    parse_decode_as,
)
from diagd.actors.base import Actor, Op, Request, SupervisionPolicy
from diagd.actors.runtime import BackendConfig, Runtime
from diagd.actors.settings import parse_table, refuse, setting
from diagd.actors.tooling import CallContext, Handler, ToolSpec, caller_cwd
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

KIND = "pcap"
INTERESTING_PROTOCOLS = ("ngap", "nas-5gs", "sctp", "s1ap", "nas-eps", "gtpv2", "pfcp", "gtp", "sip", "diameter",
                         "http2", "http", "json", "dns", "tcp", "udp")
BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    # The decoding these lab captures need (see tests/pcaps facts): SBI HTTP/2 on 7777 and
    # NAS after Security Mode Command "ciphered" with NEA0.
    "5gc-lab": {"decode_as": ["tcp.port==7777,http2"], "preferences": {"nas-5gs.null_decipher": "TRUE"}},
}
MAX_SORTED_ROWS = 20000
FRAME_NUMBER = {"type": "integer", "minimum": 1, "maximum": 2**32 - 1}  # frame.number is a uint32 in Wireshark
MAX_FILTER_CHARS = 1800  # sharkd 4.0 reads each request line into a 2 KiB buffer
DEFAULT_COLUMNS = ("number", "time_relative", "src", "dst", "protocol", "length", "info")


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class PcapSettings:
    allowed_dirs: tuple[str, ...] = ()  # default: [daemon] allowed_dirs
    output_dir: Path = Path("exports")  # default: $state/pcap/exports
    max_loaded: int = setting(4, positive=True)
    idle_timeout_s: float = setting(900.0, positive=True)
    max_exports: int = setting(50, positive=True)
    mask_subscriber_ids: bool = False
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)  # [pcap.profiles.<name>], + BUILTIN_PROFILES
    packet_list_columns: tuple[dict[str, str], ...] = setting((), items=dict)

    @classmethod
    def from_config(cls, config: BackendConfig, state_dir: Path) -> PcapSettings:
        parsed = parse_table(cls, "pcap", config.table, inherited={"allowed_dirs": config.allowed_dirs,
                                                                    "output_dir": state_dir / "exports"})
        for name, prof in parsed.profiles.items():
            if not isinstance(prof, dict):
                raise refuse("pcap", f"profiles.{name}", "must be a table")
        return replace(parsed, profiles={**BUILTIN_PROFILES, **parsed.profiles})


@dataclass(frozen=True)
class CaptureSpec:
    """What one worker loads: the file and exactly how it is decoded."""

    path: Path
    sha256: str
    decode_as: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]
    size: int

    @property
    def key(self) -> str:
        extra = json.dumps([self.decode_as, self.preferences])
        return f"{self.sha256[:16]}:{hashlib.sha1(extra.encode()).hexdigest()[:8]}"

    def describe(self) -> dict[str, Any]:
        return {"decode_as": list(self.decode_as), "preferences": dict(self.preferences)}


# ---------------------------------------------------------------------------------------------
# The actor


class PcapActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.2)

    def __init__(self, resource: str, settings: CaptureSpec) -> None:
        super().__init__(resource, settings)
        self.spec = settings
        self.sharkd: Sharkd | None = None
        self._nursery: trio.Nursery | None = None
        self._config_dir: Path | None = None
        self.analysis: dict[str, Any] = {}
        self.frame_count = 0
        self.load_s = 0.0
        self.loads = 0
        self._filters: OrderedDict[str, list[int]] = OrderedDict()
        self._trees: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._results: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.cache_hits = 0
        self.cat: Catalogue | None = None
        self.load_warning: str | None = None
        self._loading = trio.Event()
        self._load_error: DiagdError | None = None
        self.column_formats: dict[str, int] = {}

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._config_dir = Path(tempfile.mkdtemp(prefix="diagd-wsconf-"))
        lines = []
        cat = self.cat = await catalogue()
        for rule in self.spec.decode_as:
            table, value, proto = parse_decode_as(rule, cat)
            lines.append(f"decode_as_entry: {table},{value},(none),{proto.upper()}")
        (self._config_dir / "decode_as_entries").write_text("\n".join(lines) + "\n")
        # No name resolution, as `tshark -n` (the cold passes and every equivalent command): with
        # it sharkd writes "f2:41:23:4c:99:3b (f2:41:23:4c:99:3b)" in Ethernet items and vendor
        # names in the address columns, and its answers would not match tshark's.
        (self._config_dir / "preferences").write_text(
            "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n")
        # The capture loads in the background: the first request reports progress while it waits,
        # or (frames, info) is answered by one cold tshark pass on the other core meanwhile.
        self._loading = self._begin_load()

    def _begin_load(self) -> trio.Event:
        assert self._nursery is not None
        done = trio.Event()
        self._load_error = None

        async def load() -> None:
            try:
                await self._load()
            except DiagdError as exc:
                self._load_error = exc
            except Exception as exc:
                self._load_error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd failed to load: {exc}")
            finally:
                done.set()

        self._nursery.start_soon(load)
        return done

    @property
    def loaded(self) -> bool:
        return self._loading.is_set() and self._load_error is None and self.sharkd is not None and self.sharkd.alive

    def cold_argv(self) -> list[str]:
        return _cold.base_argv(self.spec.path, self.spec.decode_as, self.spec.preferences)

    async def _load(self) -> None:
        assert self._nursery is not None and self._config_dir is not None
        started = time.monotonic()
        self._retire_worker()
        self.sharkd = await Sharkd.start(self._nursery, self._config_dir)
        # Preferences go in before the file is read: some act only in the first, sequential pass
        # (sctp.association_index numbers associations there; set after `load` every frame says 65535).
        for name, value in self.spec.preferences:
            try:
                await self.sharkd.call("setconf", {"name": name, "value": value})
            except SharkdError as exc:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"preference {name}={value}: {exc.message}") from None
        try:
            self.frame_count, self.load_warning = await self.sharkd.load(str(self.spec.path))
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sharkd cannot read {self.spec.path}: {exc.message}",
                             path=str(self.spec.path)) from None
        self.analysis = {}  # a whole extra pass: computed when first needed, not at load
        info = await self.sharkd.call("info")
        # Column formats are an enum whose order sharkd lists in `info`: map %m, %t, ... to indices.
        self.column_formats = {c["format"]: i for i, c in enumerate(info.get("columns", []))}
        self.load_s = time.monotonic() - started
        self.loads += 1
        self._filters.clear()
        self._trees.clear()

    async def _worker(self, request: Request) -> Sharkd:
        if self._loading.is_set() and not self.loaded:
            error = self._take_load_error()
            # A worker that died (killed, crashed, timed out) is replaced by the call that finds it
            # dead; a capture sharkd cannot read is reported once (the file may be fixed later).
            if error is not None and error.code != ErrorCode.BACKEND_UNAVAILABLE:
                raise error
            self._loading = self._begin_load()
        if not self._loading.is_set():
            await request.report_progress(0, 1, f"loading {self.spec.path.name} ({self.spec.size} bytes)")
            await self._loading.wait()
            error = self._take_load_error()
            if error is not None:
                raise error  # this call waited for that load: it gets its error, the next call retries
            await request.report_progress(1, 1, "capture loaded")
        assert self.sharkd is not None
        return self.sharkd

    def _take_load_error(self) -> DiagdError | None:
        error, self._load_error = self._load_error, None
        if error is not None:
            self._loading = trio.Event()
            self._loading.set()
            self._retire_worker()
        return error

    def _retire_worker(self) -> None:
        """Drop the current worker; stop it in the background (usually it is reaped already)."""
        old, self.sharkd = self.sharkd, None
        if old is not None and self._nursery is not None:
            self._nursery.start_soon(old.close)

    async def stop(self) -> None:
        if self.sharkd is not None:
            await self.sharkd.close()
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)

    def statistics(self) -> dict[str, Any]:
        return {
            "path": str(self.spec.path),
            "sha256": self.spec.sha256,
            **self.spec.describe(),
            "frames": self.frame_count,
            "load_s": round(self.load_s, 3),
            "loads": self.loads,
            "sharkd_pid": self.sharkd.proc.pid if self.sharkd else None,
            "sharkd_rss_bytes": self.sharkd.rss_bytes() if self.sharkd else None,
            "sharkd_requests": self.sharkd.requests if self.sharkd else 0,
            "cache_hits": self.cache_hits,
        }

    # -- sharkd primitives ------------------------------------------------------------------

    async def check_filter(self, request: Request, display_filter: str) -> None:
        if not display_filter:
            return
        self.check_length(display_filter)
        try:
            await (await self._worker(request)).call("check", {"filter": display_filter})
        except SharkdError as exc:
            message = exc.message.removeprefix("Filter invalid - ")
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {message}",
                             display_filter=display_filter) from None

    @staticmethod
    def check_length(display_filter: str) -> None:
        if len(display_filter) > MAX_FILTER_CHARS:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"display filter of {len(display_filter)} characters: sharkd 4.0 takes requests of at "
                             f"most 2 KiB, so filters are limited to {MAX_FILTER_CHARS} characters",
                             display_filter=display_filter[:200] + "...")

    async def matching(self, request: Request, display_filter: str) -> list[int]:
        """Frame numbers matching a filter (all frames for ''), cached per filter."""
        if display_filter in self._filters:
            self._filters.move_to_end(display_filter)
            return self._filters[display_filter]
        await self.check_filter(request, display_filter)
        params: dict[str, Any] = {"column0": "frame.number:0"}
        if display_filter:
            params["filter"] = display_filter
        try:
            rows = await (await self._worker(request)).call("frames", params)
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {exc.message}",
                             display_filter=display_filter) from None
        numbers = [int(r["num"]) for r in rows]
        self._filters[display_filter] = numbers
        if len(self._filters) > 64:
            self._filters.popitem(last=False)
        return numbers

    async def page(self, request: Request, display_filter: str, offset: int, limit: int
                   ) -> tuple[int, list[dict[str, Any]]]:
        """(total matches, one page of default packet-list columns) in two cheap sharkd calls.

        sharkd keeps a bitmap per filter, so the page (`skip`/`limit`) costs one pass the first
        time and milliseconds after; the total comes from `intervals` on the same bitmap.
        """
        await self.check_filter(request, display_filter)
        worker = await self._worker(request)
        params: dict[str, Any] = {"limit": limit}
        if offset:
            params["skip"] = offset  # sharkd refuses skip=0
        if display_filter:
            params["filter"] = display_filter
        try:
            result = await worker.call("frames", params)
            if display_filter:
                counted = await worker.call("intervals", {"filter": display_filter, "interval": 2**31 - 1})
                total = int(counted.get("frames", 0))
            else:
                total = self.frame_count
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {exc.message}",
                             display_filter=display_filter) from None
        rows = [packet_row(r["c"]) for r in result]
        return total, rows

    async def tree(self, request: Request, number: int, *, keep: bool = True) -> dict[str, Any]:
        """A frame's protocol tree with its bytes (tshark -V dumps `data` items in hex), cached:
        the bytes always come along, so one frame is one cache entry whatever the caller renders.
        A scan over a whole capture passes keep=False: thousands of trees would hold hundreds of MB."""
        worker = await self._worker(request)  # loads the capture first, so frame_count is known
        if not 1 <= number <= self.frame_count:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"frame {number} does not exist: the capture has frames 1..{self.frame_count}",
                             frame=number, frame_count=self.frame_count)
        key = number
        if key in self._trees:
            self._trees.move_to_end(key)
            return self._trees[key]
        params: dict[str, Any] = {"frame": number, "proto": True, "bytes": True}
        answer = await worker.call("frame", params)
        if keep:
            self._trees[key] = answer
            if len(self._trees) > 4096:
                self._trees.popitem(last=False)
        return dict(answer)

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        # stop_at is a moment, not part of the question: equal questions share cached answers.
        cache_key = request.op + json.dumps({k: v for k, v in request.args.items() if k != "stop_at"},
                                            sort_keys=True)
        if cache_key in self._results:
            self.cache_hits += 1
            self._results.move_to_end(cache_key)
            return {**self._results[cache_key], "cached": True}
        op = getattr(self, f"op_{request.op}", None)
        if op is None:
            raise DiagdError(ErrorCode.INTERNAL_ERROR, f"pcap actor has no operation {request.op!r}")
        result: dict[str, Any] = await op(request, **request.args)
        if result.get("served_by", "sharkd") != "sharkd":
            return {**result, "cached": False}  # a stand-in answer while loading: ask the worker next time
        if result.get("stopped_because") == "time_budget":
            return {**result, "cached": False}  # another call may have the time to finish it
        self._results[cache_key] = result
        if len(self._results) > 256:
            self._results.popitem(last=False)
        return {**result, "cached": False}

    async def op_info(self, request: Request) -> dict[str, Any]:
        """Protocols and conversations; the count and time span come from capinfos (the handler)."""
        served_by = "sharkd"
        if not self._loading.is_set():  # while sharkd loads: one tshark pass gives all of it
            await request.report_progress(0, 1, f"loading {self.spec.path.name} ({self.spec.size} bytes)")
            cold = await _cold.info(self.cold_argv(), INTERESTING_PROTOCOLS)
            await request.report_progress(1, 1, "read with tshark while sharkd loads")
            protocols = list(cold["protocols"])
            conversations = cold["conversations"]
            frame_count = None
            warnings = cold["warnings"]
            served_by = "tshark (capture still loading)"
        else:
            analysis = await self.analysed(request)
            protocols = list(analysis.get("protocols", []))
            worker = await self._worker(request)
            frame_count = self.frame_count
            warnings = [self.load_warning] if self.load_warning else []
            taps = await worker.call("tap", {"tap0": "conv:SCTP", "tap1": "conv:IPv4", "tap2": "conv:UDP",
                                             "tap3": "conv:TCP"})
            conversations = []
            for tap in taps.get("taps", []):
                for conv in tap.get("convs", []):
                    conversations.append({
                        "proto": tap.get("proto"),
                        "a": f"{conv['saddr']}" + (f":{conv['sport']}" if "sport" in conv else ""),
                        "b": f"{conv['daddr']}" + (f":{conv['dport']}" if "dport" in conv else ""),
                        "frames": conv["rxf"] + conv["txf"],
                        "bytes": conv["rxb"] + conv["txb"],
                    })
        order = {"SCTP": 0, "TCP": 1, "UDP": 2, "IPv4": 3}
        conversations.sort(key=lambda c: (order.get(str(c["proto"]), 9), -c["frames"]))
        return {
            "sharkd_frames": frame_count,
            "served_by": served_by,
            "has_protocols": {p: (p in protocols) for p in INTERESTING_PROTOCOLS},
            "protocols": protocols,
            "top_conversations": conversations[:10],
            "warnings": warnings,
        }

    async def op_check(self, request: Request, display_filter: str) -> dict[str, Any]:
        await self.check_filter(request, display_filter)
        return {"valid": True}

    async def op_frames(self, request: Request, display_filter: str, limit: int, offset: int) -> dict[str, Any]:
        served_by = "sharkd"
        if not self._loading.is_set():  # first question while sharkd loads: one tshark pass beside it
            self.check_length(display_filter)
            await request.report_progress(0, 1, f"loading {self.spec.path.name} ({self.spec.size} bytes)")
            all_rows = await _cold.frames(self.cold_argv(), display_filter)
            await request.report_progress(1, 1, "read with tshark while sharkd loads")
            self._filters[display_filter] = [r["number"] for r in all_rows]
            total, rows = len(all_rows), all_rows[offset:offset + limit]
            served_by = "tshark (capture still loading)"
        else:
            total, rows = await self.page(request, display_filter, offset, limit)
        result: dict[str, Any] = {"total": total, "frames": rows, "has_more": offset + len(rows) < total,
                                  "served_by": served_by}
        if not total and display_filter:
            result["hint"] = await self.absent_protocols_hint(request, display_filter)
        return result

    async def analysed(self, request: Request) -> dict[str, Any]:
        """Protocols and time span of the whole capture (one dissection pass, done once)."""
        if not self.analysis:
            self.analysis = await (await self._worker(request)).call("analyse")
        return self.analysis

    async def absent_protocols_hint(self, request: Request, display_filter: str) -> str:
        present = set((await self.analysed(request)).get("protocols", []))
        tokens = {t.split(".")[0] for t in re.findall(r"[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*",
                                                        display_filter)}
        aliases = {"nas_5gs": "nas-5gs", "nas_eps": "nas-eps"}
        known = self.cat.protocols if self.cat else {}
        candidates = sorted({aliases.get(t, t) for t in tokens if aliases.get(t, t) in known})
        missing = [p for p in candidates if p not in present]
        there = [p for p in candidates if p in present]
        parts = []
        if missing:
            parts.append(f"not in this capture at all: {', '.join(missing)}")
        if there:
            parts.append(f"present in the capture but no frame matches the whole filter: {', '.join(there)}")
        if "nas-5gs" in missing or "nas-5gs" in there:
            parts.append("NAS after Security Mode Command needs preferences nas-5gs.null_decipher=TRUE "
                         "(profile 5gc-lab)")
        if "http2" in missing:
            parts.append("HTTP/2 on a non-standard port needs decode_as, e.g. tcp.port==7777,http2")
        return "; ".join(parts) or "no frame matches"

    async def op_timeline(self, request: Request, display_filter: str, fields: list[str], limit: int,
                          offset: int, sort_by: str | None) -> dict[str, Any]:
        """Rows of field values from `tshark -T fields` itself, so they are what it prints.

        The protocol tree's filter strings are not: bytes come colon-separated and cut short, hex
        integers unpadded, some enumerations by name, absolute times in another format. The warm
        worker still gives the matching frames (total, hint) from memory; tshark reads only as far
        as the page needs unless sort_by needs every row.
        """
        numbers = await self.matching(request, display_filter)
        if sort_by and len(numbers) > MAX_SORTED_ROWS:
            raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE,
                             f"sort_by needs every matching frame: {len(numbers)} match, the limit is "
                             f"{MAX_SORTED_ROWS}; narrow display_filter or drop sort_by", total=len(numbers))
        rows: list[dict[str, Any]] = []
        if numbers and (sort_by or offset < len(numbers)):
            extra = [f for f in fields if f != "frame.number"]
            argv = _cold.fields_argv(self.cold_argv(), display_filter, ["frame.number", *extra])
            for cells in await _cold.field_rows(argv, None if sort_by else offset + limit):
                cells += [""] * (len(extra) + 1 - len(cells))
                row: dict[str, Any] = {"frame.number": int(cells[0].split(_cold.AGGREGATOR)[0])}
                for name, text in zip(extra, cells[1:], strict=False):
                    row[name] = _field_value(name, text)
                rows.append(row)
        if sort_by:
            rows.sort(key=lambda r: _sort_key(r.get(sort_by)))
        rows = rows[offset:offset + limit]
        result: dict[str, Any] = {"total": len(numbers), "rows": rows,
                                  "has_more": offset + len(rows) < len(numbers)}
        if not numbers and display_filter:
            result["hint"] = await self.absent_protocols_hint(request, display_filter)
        return result

    @staticmethod
    def displayed(tree: list[tree_mod.Node], previous_ns: int | None) -> list[tree_mod.Node]:
        """The frame's tree as `tshark -Y` shows it when the frame displayed before it arrived at
        `previous_ns` (None: it is the first one displayed)."""
        now = tree_mod.epoch_ns(tree)
        delta = now - previous_ns if now is not None and previous_ns is not None else 0
        return tree_mod.with_displayed_delta(tree, delta)

    async def resolve_layers(self, layers: list[str]) -> dict[str, str | None]:
        """Each requested layer -> its protocol filter name (either spelling), or None when Wireshark
        has no such protocol."""
        if not layers:
            return {}
        cat = self.cat or await catalogue()
        return {name: cat.resolve_layer(name) for name in layers}

    @staticmethod
    def layer_error(unknown: list[str], present: list[str], where: str, **details: Any) -> DiagdError:
        close = {name: difflib.get_close_matches(name.lower().replace("_", "-"), present, n=3, cutoff=0.5)
                 for name in unknown}
        return DiagdError(ErrorCode.INVALID_ARGUMENT,
                          f"layer(s) {', '.join(map(repr, unknown))} not in {where}; its layers are: "
                          f"{', '.join(present) or 'none'}", layers_present=present, did_you_mean=close, **details)

    async def op_detail(self, request: Request, frame_numbers: list[int], layers: list[str], restrict_layers: bool,
                        verbosity: str, max_bytes: int) -> dict[str, Any]:
        full = verbosity == "full"
        # The text is what `tshark -Y "frame.number in {...}" -V` prints: those frames are the
        # displayed ones, so each one's "previous displayed frame" is the one before it among them.
        ordered = sorted(set(frame_numbers))
        answers = {n: await self.tree(request, n) for n in ordered}
        epochs = [tree_mod.epoch_ns(answers[n]["tree"]) for n in ordered]
        trees = {n: self.displayed(answers[n]["tree"], epochs[i - 1] if i else None) for i, n in enumerate(ordered)}
        present = {n: tree_mod.layer_names(trees[n]) for n in ordered}
        wanted = await self.resolve_layers(layers)
        anywhere = {layer for names in present.values() for layer in names}
        unknown = [name for name, proto in wanted.items() if proto is None or proto not in anywhere]
        if unknown:
            # A layer no requested frame has would give empty text: say so, and what is there.
            first = ordered[0]
            where = f"frame {first}" if len(ordered) == 1 else f"frames {', '.join(map(str, ordered))}"
            by_frame = {"layers_by_frame": {str(n): present[n] for n in ordered}} if len(ordered) > 1 else {}
            raise self.layer_error(unknown, present[first] if len(ordered) == 1 else sorted(anywhere), where,
                                   **by_frame)
        canonical = {proto for proto in wanted.values() if proto is not None}
        frames = []
        budget = max_bytes
        for number in frame_numbers:
            nodes = trees[number]
            if canonical and restrict_layers:
                nodes = tree_mod.protocol_nodes(nodes, canonical)
            # tshark -V dumps uninterpreted data in hex; with -x it prints the whole frame instead.
            text = tree_mod.render(nodes, sources=None if full else tree_mod.frame_sources(answers[number]))
            if full:
                text += "\n\n" + tree_mod.frame_hexdump(answers[number])
            encoded = text.encode()
            truncated = len(encoded) > budget
            if truncated:
                text = encoded[:max(budget, 0)].decode(errors="ignore")
            budget -= len(text.encode())
            entry: dict[str, Any] = {"frame_number": number, "protocols": tree_mod.top_protocols(trees[number]),
                                     "layers_found": None, "text": text, "truncated": truncated}
            if canonical:
                entry["layers_found"] = [n.get("f") for n in tree_mod.protocol_nodes(trees[number], canonical)]
                missing = [name for name, proto in wanted.items() if proto not in present[number]]
                if missing:
                    entry["layers_missing"] = missing
                    entry["layers_present"] = present[number]
            frames.append(entry)
        return {"frames": frames, "truncated": any(f["truncated"] for f in frames),
                "layers_resolved": {k: v for k, v in wanted.items() if v != k} or None}

    async def op_text_search(self, request: Request, display_filter: str, query: str, is_regex: bool,
                             case_sensitive: bool, budget_s: float, layers: list[str], restrict_layers: bool,
                             limit: int | None, offset: int, max_matches: int, snippet_context_chars: int,
                             max_bytes: int, stop_at: float | None = None) -> dict[str, Any]:
        """Search every frame matching the filter (from `offset`, at most `limit` when given) in the
        text `tshark -Y <filter> -V` prints, until done or until `stop_at` (trio time, set by the
        handler inside the call's timeout). A search cut short says how far it got and why."""
        pattern = await compile_in_thread(query, literal=not is_regex, case_sensitive=case_sensitive)
        numbers = await self.matching(request, display_filter)
        wanted = await self.resolve_layers(layers)
        if wanted:
            in_capture = list((await self.analysed(request)).get("protocols", []))
            unknown = [name for name, proto in wanted.items() if proto is None or proto not in in_capture]
            if unknown:
                raise self.layer_error(unknown, in_capture, "this capture")
        canonical = {proto for proto in wanted.values() if proto is not None}
        candidates = numbers[offset:] if limit is None else numbers[offset:offset + limit]
        matcher = Matcher(pattern, budget_s, unit="frame")
        matches: list[dict[str, Any]] = []
        used = 0
        scanned = 0
        without_layers = 0
        stopped: str | None = None
        previous_ns = None
        if offset and candidates:  # the frame displayed before the first one searched
            previous_ns = tree_mod.epoch_ns((await self.tree(request, numbers[offset - 1], keep=False))["tree"])
        for number in candidates:
            if stop_at is not None and trio.current_time() >= stop_at:
                stopped = "time_budget"
                break
            answer = await self.tree(request, number, keep=False)
            nodes = self.displayed(answer["tree"], previous_ns)
            previous_ns = tree_mod.epoch_ns(answer["tree"])
            if canonical and restrict_layers:
                nodes = tree_mod.protocol_nodes(nodes, canonical)
                if not nodes:
                    without_layers += 1
            text = tree_mod.render(nodes, sources=tree_mod.frame_sources(answer))
            spans = await matcher.run(functools.partial(matcher.spans, text, number, max_matches - len(matches)))
            for m_start, m_end in spans:
                start, end = max(0, m_start - snippet_context_chars), min(len(text), m_end + snippet_context_chars)
                line_start = text.rfind("\n", 0, m_start) + 1
                line_end = text.find("\n", m_end)
                snippet = re.sub(r"\n[ ]+", "\n", text[start:end])  # indentation costs tokens, not meaning
                used += len(snippet)
                matches.append({"frame_number": number, "match": text[m_start:m_end],
                                "line": text[line_start:line_end if line_end >= 0 else None].strip(),
                                "snippet": snippet})
                if len(matches) >= max_matches or used >= max_bytes:
                    stopped = "max_matches" if len(matches) >= max_matches else "max_bytes"
                    break
            if stopped:
                break  # this frame may hold more matches: it does not count as searched
            scanned += 1
        if stopped is None and offset + scanned < len(numbers):
            stopped = "limit"
        searched = numbers[offset:offset + scanned]
        result: dict[str, Any] = {
            "frames_total": len(numbers), "frames_scanned": scanned, "offset": offset,
            "complete": stopped is None,
            "stopped_because": stopped,
            "searched_frames": [searched[0], searched[-1]] if searched else None,
            "next_offset": offset + scanned if stopped else None,
            "matches": matches, "match_count": len(matches),
            "truncated": stopped in ("max_matches", "max_bytes"),
            "has_more": stopped is not None,
        }
        if canonical:
            result["frames_without_layers"] = without_layers
        if stopped:
            why = {"time_budget": "the call's time budget was spent",
                   "limit": f"limit={limit} frames were searched",
                   "max_matches": f"max_matches={max_matches} matches were found",
                   "max_bytes": f"the snippets reached max_bytes={max_bytes}"}[stopped]
            result["note"] = (f"INCOMPLETE: searched {scanned} of the {len(numbers) - offset} frames matching the "
                              f"filter from offset {offset} ({len(numbers)} in all), then stopped because {why}; "
                              f"frames not searched may match. Continue with offset={offset + scanned}.")
        elif offset:
            result["note"] = f"searched every frame from offset {offset}; the {offset} frames before it were skipped"
        return result

    async def op_follow(self, request: Request, frame_number: int, display_filter: str, limit: int,
                        offset: int) -> dict[str, Any]:
        answer = await self.tree(request, frame_number)
        values = tree_mod.field_values(answer["tree"], {"http2.streamid", "tcp.stream", "diameter.Session-Id",
                                                        "sip.Call-ID"})
        if values.get("http2.streamid") and values.get("tcp.stream"):
            streams = [s for s in values["http2.streamid"] if s != "0"] or values["http2.streamid"]
            follow_type, key = "http2.streamid", {"tcp.stream": values["tcp.stream"][0], "http2.streamid": streams[0]}
            follow_filter = f"tcp.stream == {key['tcp.stream']} && http2.streamid == {key['http2.streamid']}"
        elif values.get("diameter.Session-Id"):
            follow_type, key = "diameter.Session-Id", {"diameter.Session-Id": values["diameter.Session-Id"][0]}
            follow_filter = f"diameter.Session-Id == {json.dumps(key['diameter.Session-Id'])}"
        elif values.get("sip.Call-ID"):
            follow_type, key = "sip.Call-ID", {"sip.Call-ID": values["sip.Call-ID"][0]}
            follow_filter = f"sip.Call-ID == {json.dumps(key['sip.Call-ID'])}"
        else:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"frame {frame_number} carries no HTTP/2 stream, Diameter Session-Id or SIP Call-ID",
                             protocols=tree_mod.top_protocols(answer["tree"]),
                             hint="HTTP/2 on a non-standard port needs decode_as (e.g. tcp.port==7777,http2)")
        combined = f"({follow_filter}) && ({display_filter})" if display_filter else follow_filter
        total, rows = await self.page(request, combined, offset, limit)
        return {"follow_type": follow_type, "follow_key": key, "follow_display_filter": follow_filter,
                "display_filter": combined, "total": total, "frames": rows, "has_more": offset + len(rows) < total}

    async def op_packet_list(self, request: Request, display_filter: str, columns: list[dict[str, str]],
                             include_default_columns: bool, output_path: str, preview_rows: int) -> dict[str, Any]:
        await self.check_filter(request, display_filter)
        worker = await self._worker(request)  # loaded first: column_formats come from the loaded worker
        params: dict[str, Any] = {}
        names: list[str] = []
        index = 0
        if include_default_columns:
            for fmt, name in (("%m", "No."), ("%t", "Time"), ("%s", "Source"), ("%d", "Destination"),
                              ("%p", "Protocol"), ("%L", "Length"), ("%i", "Info")):
                params[f"column{index}"] = str(self.column_formats[fmt])
                names.append(name)
                index += 1
        for col in columns:
            params[f"column{index}"] = f"{col['field']}:0"
            names.append(col["name"])
            index += 1
        if display_filter:
            params["filter"] = display_filter
        rows = await worker.call("frames", params)
        table = [[str(v).replace("\t", " ").replace("\n", " ").strip() for v in r["c"]] for r in rows]

        def write() -> int:
            with open(output_path, "w", encoding="utf-8") as f:
                f.write("\t".join(names) + "\n")
                for row in table:
                    f.write("\t".join(row) + "\n")
            return os.path.getsize(output_path)

        size = await trio.to_thread.run_sync(write)
        return {"output_path": output_path, "rows_written": len(table), "file_size_bytes": size,
                "columns": names, "preview_rows": [dict(zip(names, r, strict=True)) for r in table[:preview_rows]]}

    async def op_ngap_sessions(self, request: Request, display_filter: str) -> dict[str, Any]:
        pdus = await self._ngap_pdus(request, display_filter)
        return ngap_summary.ue_sessions(pdus, filtered=bool(display_filter))

    async def op_pdu_sessions(self, request: Request, display_filter: str) -> dict[str, Any]:
        pdus = await self._ngap_pdus(request, display_filter)
        return ngap_summary.pdu_sessions(pdus, filtered=bool(display_filter))

    async def _ngap_pdus(self, request: Request, display_filter: str) -> list[ngap_summary.NgapPdu]:
        base = "ngap && sctp"
        numbers = await self.matching(request, f"({base}) && ({display_filter})" if display_filter else base)
        pdus: list[ngap_summary.NgapPdu] = []
        for number in numbers:
            answer = await self.tree(request, number)
            pdus.extend(ngap_summary.pdus_in_frame(number, answer["tree"]))
        return pdus




def _field_value(name: str, text: str) -> Any:
    """One cell of `tshark -T fields`: null when empty, a list when the field occurs several times
    (a column is one text and is never split)."""
    if text == "":
        return None
    if name.startswith(COLUMN_PREFIX):
        return text
    values = text.split(_cold.AGGREGATOR)
    return values[0] if len(values) == 1 else values


def packet_row(c: list[str]) -> dict[str, Any]:
    """A packet-list row from sharkd's default columns. A file type without timestamps or lengths
    (wiretap reads some odd formats) leaves those columns empty: they become null, not a crash."""
    def number(text: str, kind: Callable[[str], Any]) -> Any:
        try:
            return kind(text)
        except ValueError:
            return None

    return dict(zip(DEFAULT_COLUMNS, [number(c[0], int), number(c[1], float), c[2], c[3], c[4], number(c[5], int),
                                      c[6].strip()], strict=True))


def packet_list_command(display_filter: str) -> list[str]:
    """The tshark arguments that print pcap_frames_by_filter's rows: the default columns, by name."""
    return [*(["-Y", display_filter] if display_filter else []), "-o", column_format_pref(), "-T", "fields",
            "-E", "header=n", *[a for name in COLUMN_FIELDS for a in ("-e", name)]]


def packet_file_command(display_filter: str, columns: list[dict[str, str]], include_default: bool) -> list[str]:
    """The tshark arguments that print pcap_packet_list's rows: the same columns defined with -o
    (extra fields as custom columns showing every occurrence, resolved, as the worker's do)."""
    defined = dict(COLUMN_FORMATS) if include_default else {}
    for index, col in enumerate(columns, start=1):
        defined[f"extra{index}"] = f"%Cus:{col['field']}:0:R"  # its own title: any name stays quotable
    return [*(["-Y", display_filter] if display_filter else []), "-o", column_format_pref(defined), "-T", "fields",
            "-E", "header=n", *[a for title in defined for a in ("-e", COLUMN_PREFIX + title)]]


def _sort_key(value: Any) -> tuple[int, float, str]:
    first = value[0] if isinstance(value, list) and value else value
    if first is None:
        return (2, 0.0, "")
    try:
        return (0, float(int(first, 0)) if isinstance(first, str) and first.startswith("0x") else float(first), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(first))


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
