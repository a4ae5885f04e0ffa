"""The pcap actor: warm `sharkd` workers per capture (pool.py), on Wireshark's own dissectors.

Actor key: the file version (device, inode, size, mtime) + decode-as rules + preferences, so the
same file opened with the same decoding by any client (any path or link) shares its workers. A
worker loads the file once and answers filters, frame trees and follows from memory; a second one
serves a busy capture; plain tshark is used where it is the right tool (a new filter's first
matches, sub-capture export with `-w`, timeline values with `-T fields`, capinfos for the count and
time span). Loaded captures are bounded by count and memory (LRU eviction) and expire when idle.

Answers are what Wireshark's command-line tools print for the same question, and `include_command`
shows that command: timeline values come from `tshark -T fields` itself (the protocol tree's filter
strings differ from it for hex widths, bytes and times), frame text is rendered as `tshark -V` renders
it, the time span is capinfos' own text.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors.base import Actor, ActorState, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap import answers, stats, text
from diagd.actors.pcap import ngap as ngap_summary
from diagd.actors.pcap import tshark as _cold
from diagd.actors.pcap.cache import PackedLru
from diagd.actors.pcap.capture import CaptureSpec
from diagd.actors.pcap.first_page import Kinds
from diagd.actors.pcap.messages import (
    Check,
    Detail,
    Export,
    Follow,
    Frames,
    Info,
    NgapProcedures,
    NgapSessions,
    PacketList,
    PduSessions,
    Stats,
    TextSearch,
    Timeline,
    cache_key,
)
from diagd.actors.pcap.passes import CaptureWorkers, Page, invalid
from diagd.actors.pcap.pool import Headroom, WorkerPool
from diagd.actors.pcap.sharkd import SharkdError
from diagd.actors.pcap.wireshark import Catalogue, catalogue, parse_decode_as
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

KIND = "pcap"
MAX_FILTER_CHARS = 1800  # sharkd 4.0 reads each request line into a 2 KiB buffer
CACHE_BUDGET = 16 * 2**20  # bytes of cached answers, frame trees and frame lists per capture
LOAD_PROGRESS_S = 0.5  # how often a call waiting for the capture to load reports how far it is


class PcapActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.2)
    # Calls on one capture run together: they share its sharkd workers (pool.py), so a frame tree
    # is not queued behind another call's filter pass when a second worker is free.
    concurrency = 8

    def __init__(self, resource: str, settings: CaptureSpec, *, max_workers: int = 2,
                 headroom: Headroom = lambda: None, ledger: dict[str, int] | None = None) -> None:
        super().__init__(resource, settings)
        self.spec = settings
        self._max_workers = max_workers
        self._headroom = headroom
        self._ledger: dict[str, int] = {} if ledger is None else ledger
        self._config_dir: Path | None = None
        self.workers: CaptureWorkers | None = None
        self.analysis: dict[str, Any] = {}
        self.ngap_models: dict[str, Any] = {}  # display filter -> ngap.Model: one procedure model per capture
        # Bounded by bytes, CACHE_BUDGET in all (cache.py): each once kept 64 lists, 4096 trees and
        # 256 answers whatever their size, ~40 MB of RSS after a short session (issue 12).
        self.filters: PackedLru[str, list[int]] = PackedLru(CACHE_BUDGET * 3 // 8, 64)
        self._trees: PackedLru[int, dict[str, Any]] = PackedLru(CACHE_BUDGET // 4, 4096)
        self._results: PackedLru[object, dict[str, Any]] = PackedLru(CACHE_BUDGET * 3 // 8, 256)
        self.cache_hits = 0
        self.cat: Catalogue | None = None

    async def start(self, nursery: trio.Nursery) -> None:
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
        pool = WorkerPool(nursery, self.spec, self._config_dir, max_workers=self._max_workers,
                          headroom=self._headroom, ledger=self._ledger)
        self.workers = CaptureWorkers(nursery, pool, self.cold_argv())
        self.workers.start()

    @property
    def worker_state(self) -> ActorState:
        """STARTING while the capture loads, IDLE when a worker is loaded and alive, FAILED after a
        failed load, STOPPED when every worker died."""
        state = self.workers.state() if self.workers is not None else "loading"
        return {"loading": ActorState.STARTING, "failed": ActorState.FAILED, "stopped": ActorState.STOPPED,
                "ready": ActorState.IDLE}[state]

    @property
    def loaded(self) -> bool:
        return self.worker_state is ActorState.IDLE

    @property
    def frame_count(self) -> int:
        return self.workers.facts.frame_count if self.workers is not None else 0

    @property
    def load_warning(self) -> str | None:
        return self.workers.facts.warning if self.workers is not None else None

    @property
    def column_formats(self) -> dict[str, int]:
        return self.workers.facts.column_formats if self.workers is not None else {}

    def cold_argv(self) -> list[str]:
        return _cold.base_argv(self.spec.path, self.spec.decode_as, self.spec.preferences)

    def tshark_argv(self, kinds: Kinds | None) -> list[str]:
        """cold_argv, single pass when that gives the same for every name (Catalogue.kinds) in it."""
        assert self.workers is not None
        return self.workers.tshark_argv(kinds)

    async def sharkd_call(self, request: Request, method: str, params: dict[str, Any] | None = None, *,
                          display_filter: str | None = None) -> Any:
        """One sharkd request on whichever worker is free (the one holding `display_filter`'s bitmap
        if one does); progress is reported while the capture loads."""
        assert self.workers is not None
        async with self.load_progress(request):
            return await self.workers.call(method, params, display_filter=display_filter, deadline=request.deadline)

    @asynccontextmanager
    async def load_progress(self, request: Request) -> AsyncIterator[None]:
        """While the capture loads: progress every LOAD_PROGRESS_S, in bytes sharkd has read of the file."""
        assert self.workers is not None
        if not self.workers.loading:
            yield
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._report_load, request)
            yield
            nursery.cancel_scope.cancel(reason="the call's wait is over")
        if not self.workers.loading:
            await request.report_progress(self.spec.size, self.spec.size, "capture loaded")

    async def _report_load(self, request: Request) -> None:
        assert self.workers is not None
        size, name, told = self.spec.size, self.spec.path.name, -1
        while self.workers.loading:
            read = await trio.to_thread.run_sync(self.workers.pool.load_position)  # /proc reads: off the loop
            done = min(read or 0, size - 1)  # "all read" is said once loaded
            if done > told:  # MCP: each notification's progress is higher than the last
                await request.report_progress(done, size, f"loading {name}: {_mb(done)} of {_mb(size)} MB read")
                told = done
            await trio.sleep(LOAD_PROGRESS_S)

    async def stop(self) -> None:
        if self.workers is not None:
            await self.workers.close()
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)

    def statistics(self) -> dict[str, Any]:
        pool: dict[str, Any] = self.workers.statistics() if self.workers is not None else {"workers": [], "loads": 0}
        workers: list[dict[str, Any]] = pool["workers"]
        first = workers[0] if workers else {}
        return {
            "path": str(self.spec.path),
            "identity": self.spec.identity,
            **self.spec.describe(),
            "frames": self.frame_count,
            "load_s": first.get("load_s", 0.0),
            "sharkd_pid": first.get("pid"),
            "sharkd_rss_bytes": sum(w["rss_bytes"] or 0 for w in workers) or None,
            "sharkd_requests": sum(w["requests"] for w in workers),
            **pool,
            "cache_hits": self.cache_hits,
        }

    # -- sharkd primitives ------------------------------------------------------------------

    async def check_filter(self, request: Request, display_filter: str) -> None:
        if not display_filter:
            return
        self.check_length(display_filter)
        try:
            await self.sharkd_call(request, "check", {"filter": display_filter})
        except SharkdError as exc:
            raise invalid(display_filter, exc) from None

    @staticmethod
    def check_length(display_filter: str) -> None:
        if len(display_filter) > MAX_FILTER_CHARS:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"display filter of {len(display_filter)} characters: sharkd 4.0 takes requests of at "
                             f"most 2 KiB, so filters are limited to {MAX_FILTER_CHARS} characters",
                             display_filter=display_filter[:200] + "...")

    async def matching(self, request: Request, display_filter: str) -> list[int]:
        """Frame numbers matching a filter (all frames for ''), cached per filter."""
        cached = self.filters.get(display_filter)
        if cached is not None:
            return cached
        await self.check_filter(request, display_filter)
        params: dict[str, Any] = {"column0": "frame.number:0"}
        if display_filter:
            params["filter"] = display_filter
        try:
            rows = await self.sharkd_call(request, "frames", params, display_filter=display_filter)
        except SharkdError as exc:
            raise invalid(display_filter, exc) from None
        numbers = [int(r["num"]) for r in rows]
        self.filters.put(display_filter, numbers)
        return numbers

    async def page(self, request: Request, display_filter: str, offset: int, limit: int,
                   kinds: Kinds | None = None) -> Page:
        """(total matches, one page of default packet-list columns): from a worker holding the
        filter in milliseconds, or for a new filter the first page first (passes.py)."""
        self.check_length(display_filter)
        assert self.workers is not None
        async with self.load_progress(request):
            return await self.workers.page(display_filter, offset, limit, request.deadline, kinds)

    async def tree(self, request: Request, number: int, *, keep: bool = True) -> dict[str, Any]:
        """A frame's protocol tree with its bytes (tshark -V dumps `data` items in hex), cached:
        the bytes always come along, so one frame is one cache entry whatever the caller renders.
        A scan over a whole capture passes keep=False: thousands of trees would hold hundreds of MB."""
        cached = self._trees.get(number)
        if cached is not None:
            return cached
        if not self.loaded:
            await self.sharkd_call(request, "status")  # loads the capture first, so frame_count is known
        if not 1 <= number <= self.frame_count:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"frame {number} does not exist: the capture has frames 1..{self.frame_count}",
                             frame=number, frame_count=self.frame_count)
        answer = await self.sharkd_call(request, "frame", {"frame": number, "proto": True, "bytes": True})
        if keep:
            self._trees.put(number, answer)
        return dict(answer)

    # -- requests ---------------------------------------------------------------------------

    async def analysed(self, request: Request) -> dict[str, Any]:
        """Protocols and time span of the whole capture (one dissection pass, done once)."""
        if not self.analysis:
            self.analysis = await self.sharkd_call(request, "analyse")
        return self.analysis

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        # Equal questions share one answer: a message is its own cache key (less stop_at, a moment).
        key = cache_key(request.message)
        cached = self._results.get(key) if key is not None else None
        if cached is not None:
            self.cache_hits += 1
            return {**cached, "cached": True}
        result = await self._answer(request)
        if key is None or result.get("served_by", "sharkd") != "sharkd" or result.get("total_exact") is False:
            return {**result, "cached": False}  # a stand-in answer while loading: ask the worker next time
        if result.get("stopped_because") == "time_budget":
            return {**result, "cached": False}  # another call may have the time to finish it
        self._results.put(key, result)
        return {**result, "cached": False}

    async def _frames(self, request: Request, message: Frames) -> dict[str, Any]:
        """Fetched here, shaped by answers.frames (which never calls back into the actor)."""
        display_filter = message.display_filter
        assert self.workers is not None
        if self.worker_state is ActorState.STARTING and display_filter and not self.workers.raceable(
                display_filter, message.offset, message.limit, message.kinds):
            # A filter only a two-pass read answers, asked while sharkd loads: one tshark pass beside it.
            self.check_length(display_filter)
            total, rows = await answers.frames_while_loading(request, self.spec, self.cold_argv(), self.filters,
                                                             message)
            page = Page(total, True, rows, "tshark (capture still loading)")
        else:
            page = await self.page(request, display_filter, message.offset, message.limit, message.kinds)
        present = None
        if not page.total and display_filter:
            present = list((await self.analysed(request)).get("protocols", []))
        return answers.frames(message, page, present, self.cat)

    async def _answer(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Info():
                return await answers.info(self, request)
            case Check(display_filter=display_filter):
                await self.check_filter(request, display_filter)
                return {"valid": True}
            case Frames() as message:
                return await self._frames(request, message)
            case Timeline() as message:
                return await answers.timeline(self, request, message)
            case Detail() as message:
                trees = {n: await self.tree(request, n) for n in sorted(set(message.frame_numbers))}
                return await text.detail(self, message, trees)
            case TextSearch() as message:
                return await text.text_search(self, request, message)
            case Follow() as message:
                return await answers.follow(self, request, message)
            case PacketList() as message:
                return await answers.packet_list(self, request, message)
            case Export() as message:
                return await answers.export(self, message)
            case NgapSessions(display_filter=display_filter):
                model = await answers.ngap_model(self, request, display_filter)
                return ngap_summary.ue_sessions(model, filtered=bool(display_filter))
            case PduSessions(display_filter=display_filter):
                model = await answers.ngap_model(self, request, display_filter)
                return ngap_summary.pdu_sessions(model, filtered=bool(display_filter))
            case NgapProcedures(display_filter=display_filter):
                model = await answers.ngap_model(self, request, display_filter)
                return ngap_summary.procedures(model, filtered=bool(display_filter),
                                               core_rows=await answers.core_rows(self) if model.pdus else [])
            case Stats() as message:
                return await stats.answer(self, request, message)
        raise unhandled("pcap", request)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"
