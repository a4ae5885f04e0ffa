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
import json
import os
import re
import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.base import Actor, Request, SupervisionPolicy
from diagd.actors.pcap import ngap as ngap_summary
from diagd.actors.pcap import tree as tree_mod
from diagd.actors.pcap import tshark as _cold
from diagd.actors.pcap.capture import CaptureSpec
from diagd.actors.pcap.rows import (
    field_value,
    packet_row,
    sort_key,
)
from diagd.actors.pcap.sharkd import Sharkd, SharkdError
from diagd.actors.pcap.wireshark import (
    Catalogue,
    catalogue,
    parse_decode_as,
)
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

KIND = "pcap"
INTERESTING_PROTOCOLS = ("ngap", "nas-5gs", "sctp", "s1ap", "nas-eps", "gtpv2", "pfcp", "gtp", "sip", "diameter",
                         "http2", "http", "json", "dns", "tcp", "udp")
MAX_SORTED_ROWS = 20000
MAX_FILTER_CHARS = 1800  # sharkd 4.0 reads each request line into a 2 KiB buffer


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
                    row[name] = field_value(name, text)
                rows.append(row)
        if sort_by:
            rows.sort(key=lambda r: sort_key(r.get(sort_by)))
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



