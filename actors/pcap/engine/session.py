"""One loaded capture: its worker pool, filter passes and caches, and the primitives answers are built from.

A `CaptureSession` is what the pcap actor owns (one per actor, so one per capture key): it writes
the Wireshark config the workers load with, starts the pool (pool.py) and the filter passes
(passes.py), and keeps the capture's caches, bounded by bytes (cache.py): frame-number lists per
filter, frame trees, and whole answers. Its primitives (`sharkd_call`, `check_filter`, `matching`,
`page`, `tree`, `analysed`) are what the actor fetches with; the answer builders (answers.py,
stats.py, text.py, http2_srt.py) never see the session or the actor, only what was fetched.
"""

from __future__ import annotations

import functools
import math
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import structlog
import trio

from diagd.actors._subprocess import RunHead, head
from diagd.actors.base import Request, sole_exception
from diagd.actors.pcap.engine.cache import PackedLru
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.passes import HEAD_START_S, CaptureWorkers, Cores, EarlyNumbers, EarlyRows, Page, invalid
from diagd.actors.pcap.engine.pool import CaptureState, Headroom, Launch, LoadFacts, WorkerPool, estimated_rss
from diagd.actors.pcap.shark import decode_check
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.sharkd import Sharkd, SharkdError
from diagd.actors.pcap.shark.wireshark import Catalogue, Digests, decode_as_entries, write_sharkd_config
from diagd.actors.pcap.warm import first_page
from diagd.actors.pcap.warm.first_page import Kinds
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

MAX_FILTER_CHARS = 1800  # sharkd 4.0 reads each request line into a 2 KiB buffer
CACHE_BUDGET = 16 * 2**20  # bytes of cached answers, frame trees and frame lists per capture
LOAD_PROGRESS_S = 0.5  # how often a call waiting for the capture to load reports how far it is


# pcap_info's conversations: one sharkd `tap` request, one pass for the four tables.
CONVERSATION_TAPS = (("tap0", "conv:SCTP"), ("tap1", "conv:IPv4"), ("tap2", "conv:UDP"), ("tap3", "conv:TCP"))


class CaptureSession:
    """One capture as its workers load and serve it (state: `state`, a CaptureState)."""

    def __init__(self, spec: CaptureSpec, *, max_workers: int = 2, headroom: Headroom = lambda: None,
                 cores: Cores | None = None, launch: Launch = Sharkd.start,
                 early_numbers: EarlyNumbers | None = None, early_rows: EarlyRows | None = None,
                 run_head: RunHead = head, memory_budget: int | None = None, digests: Digests | None = None,
                 wireshark: Wireshark | None = None) -> None:
        self.spec = spec
        # The back end's file hashes (a session of a test without one hashes for itself).
        self._digests = digests if digests is not None else Digests()
        # The back end's Wireshark facts: the field catalogue, capinfos' counts, the decode-as probes (a
        # session of a test without one reads and keeps its own).
        self.wireshark = wireshark if wireshark is not None else Wireshark()
        self._memory_budget = memory_budget  # bytes of sharkd RSS all captures may hold ([pcap] max_memory_mb)
        self._max_workers = max_workers
        self._headroom = headroom
        self._cores = cores if cores is not None else Cores()
        self._launch = launch
        # Early passes and timelines run their tshark with run_head: the back end's hands it to a warm one (standby.py).
        self.run_head = run_head
        self._early_numbers = early_numbers or functools.partial(first_page.early_numbers, run=run_head)
        self._early_rows = early_rows or functools.partial(first_page.early_rows, run=run_head)
        self._config_dir: Path | None = None
        self.workers: CaptureWorkers | None = None
        self.facts = LoadFacts()  # the pool's, once started (updated in place)
        self.analysis: dict[str, Any] = {}
        self.conversation_taps: dict[str, Any] = {}
        self.ngap_models: dict[str, Any] = {}  # display filter -> ngap.Model: one procedure model per capture
        # Bounded by bytes, CACHE_BUDGET in all (cache.py): each once kept 64 lists, 4096 trees and
        # 256 answers whatever their size, ~40 MB of RSS after a short session (issue 12).
        self.filters: PackedLru[str, list[int]] = PackedLru(CACHE_BUDGET * 3 // 8, 64)
        self.trees: PackedLru[int, dict[str, Any]] = PackedLru(CACHE_BUDGET // 4, 4096)
        self.results: PackedLru[object, dict[str, Any]] = PackedLru(CACHE_BUDGET * 3 // 8, 256)
        self.cache_hits = 0
        # (kind, filter) a call answered by a single pass before sharkd counted the filter
        self._before_count: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.cat: Catalogue | None = None
        self._nursery: trio.Nursery | None = None
        self.summary: Summary | None = None  # protocols and conversations read by tshark while sharkd loads
        self._told: WeakKeyDictionary[Request, Told] = WeakKeyDictionary()  # per call: load_progress

    async def start(self, nursery: trio.Nursery) -> None:
        """Write the workers' Wireshark config and start loading the first one (in `nursery`)."""
        self._nursery = nursery
        self._config_dir = Path(tempfile.mkdtemp(prefix="diagd-wsconf-"))
        cat = self.cat = await self.wireshark.catalogue()
        write_sharkd_config(self._config_dir, decode_as_entries(self.spec.decode_as, cat))
        # The capture loads in the background: the first request reports progress while it waits,
        # or (frames, info) is answered by one cold tshark pass on the other core meanwhile.
        pool = WorkerPool(nursery, self.spec, self._config_dir, max_workers=self._max_workers,
                          headroom=self._headroom, launch=self._launch, cores=self._cores.count)
        # A big file's first answer gets a head start (passes.HEAD_START_S) before the load and the
        # other background reads take the cores; a small one loads in less than that anyway.
        big = self.spec.size >= _cold.BIG_FILE
        self.workers = CaptureWorkers(nursery, pool, self.cold_argv(), cores=self._cores,
                                      early_numbers=self._early_numbers, early_rows=self._early_rows,
                                      head_start_s=HEAD_START_S if big else 0.0, after_head_start=self._read_beside)
        self.facts = pool.facts
        pool.refused = self.too_big()
        if pool.refused is not None:
            log.info("capture answered from tshark only", capture=self.spec.path.name, why=pool.refused.message)
        self.workers.start()

    def _read_beside(self) -> None:
        """What every answer names later (the file's sha256) or reports (capinfos' count, in the load's
        progress), read once the head start is over."""
        self._digests.begin(self.spec.path, self.spec.identity)
        self.wireshark.capinfos.begin_count(self.spec.path, self.spec.identity, self.spec.size)

    def end_head_start(self) -> None:
        """The call that had the head start has its answer (answers.py: a timeline's or pcap_info's)."""
        if self.workers is not None:
            self.workers.end_head_start()

    def too_big(self) -> DiagdError | None:
        """Why sharkd is not started for this capture: its estimated RSS is over the whole budget."""
        need = estimated_rss(self.spec.size)
        if self._memory_budget is None or need <= self._memory_budget:
            return None
        return DiagdError(
            ErrorCode.OUTPUT_TOO_LARGE,
            f"{self.spec.path.name} would not fit [pcap] max_memory_mb={self._memory_budget // 2**20}: sharkd "
            f"needs about {need // 2**20} MB for it, so it is not loaded; pcap_info, pcap_frames_by_filter "
            "(first pages), pcap_timeline and pcap_extract_subcapture answer from tshark passes; this tool needs "
            "sharkd: raise max_memory_mb, or cut the capture with pcap_extract_subcapture",
            max_memory_mb=self._memory_budget // 2**20, estimated_mb=need // 2**20)

    @property
    def tshark_only(self) -> DiagdError | None:
        return self.workers.pool.refused if self.workers is not None else None

    async def close(self) -> None:
        if self.workers is not None:
            await self.workers.close()
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)

    # -- state --------------------------------------------------------------------------------

    @property
    def state(self) -> CaptureState:
        return self.workers.state if self.workers is not None else CaptureState.LOADING

    def __repr__(self) -> str:
        workers = self.workers.pool.workers if self.workers is not None else []
        busy = sum(1 for w in workers if w.busy)
        return (f"<CaptureSession [{self.state.name}, workers: {len(workers)}, busy: {busy}, "
                f"cache hits: {self.cache_hits}] {self.spec.path.name}>")

    @property
    def loaded(self) -> bool:
        return self.state is CaptureState.READY

    @property
    def frame_count(self) -> int:
        return self.facts.frame_count

    @property
    def load_warning(self) -> str | None:
        return self.facts.warning

    @property
    def column_formats(self) -> dict[str, int]:
        return self.facts.column_formats

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

    # -- whole answers ------------------------------------------------------------------------

    def cached_answer(self, key: object) -> dict[str, Any] | None:
        """The answer kept for an equal question (a message is its own key: messages.cache_key)."""
        cached = self.results.get(key)
        if cached is not None:
            self.cache_hits += 1
        return cached

    def keep_answer(self, key: object, result: dict[str, Any]) -> None:
        self.results.put(key, result)

    # -- argv of the cold tools -----------------------------------------------------------------

    def cold_argv(self) -> list[str]:
        return _cold.base_argv(self.spec.path, self.spec.decode_as, self.spec.preferences)

    def tshark_argv(self, kinds: Kinds | None) -> list[str]:
        """cold_argv, single pass when that gives the same for every name (Catalogue.kinds) in it."""
        assert self.workers is not None
        return self.workers.tshark_argv(kinds)

    def raceable(self, display_filter: str, offset: int, limit: int, kinds: Kinds | None) -> bool:
        assert self.workers is not None
        return self.workers.raceable(display_filter, offset, limit, kinds)

    # -- sharkd primitives ------------------------------------------------------------------

    async def sharkd_call(self, request: Request, method: str, params: dict[str, Any] | None = None, *,
                          display_filter: str | None = None, keep: int | None = None) -> Any:
        """One sharkd request on whichever worker is free (the one holding `display_filter`'s bitmap
        if one does); progress is reported while the capture loads. `keep`: an answer longer than that many
        bytes is read only that far (sharkd.Cut)."""
        assert self.workers is not None
        async with self.load_progress(request):
            return await self.workers.call(method, params, display_filter=display_filter, deadline=request.deadline,
                                           keep=keep)

    async def sharkd_call_many(self, request: Request, method: str, params: list[dict[str, Any]]) -> list[Any]:
        """`method` for each parameter set, pipelined on one free worker (sharkd.Sharkd.call_many):
        each answer is the result or that request's SharkdError."""
        assert self.workers is not None
        async with self.load_progress(request):
            return await self.workers.call_many(method, params, deadline=request.deadline)

    @asynccontextmanager
    async def foreground(self) -> AsyncIterator[None]:
        """One call of this capture under way: background passes yield their cores meanwhile (passes.py)."""
        if self.workers is None:
            yield
            return
        async with self.workers.foreground():
            yield

    @asynccontextmanager
    async def load_progress(self, request: Request) -> AsyncIterator[None]:
        """While the capture loads: progress at most every LOAD_PROGRESS_S, in bytes sharkd has read
        of the file (total: its size), and "capture loaded" once it is. A call may wait several times
        (a filter check, then its page): the reports of one request stay increasing and spaced."""
        assert self.workers is not None
        if not self.workers.loading or self.tshark_only is not None:  # no load to report
            yield
            return
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._report_load, request)
                yield
                nursery.cancel_scope.cancel(reason="the call's wait is over")
        except BaseExceptionGroup as group:
            # The nursery wraps what the call raised (INVALID_FILTER while the capture loads): the
            # caller gets the coded error itself, not a group the actor takes for a crash.
            raise sole_exception(group) from None
        if self.loaded:  # not after a failed load: the call's error says what happened
            await self._tell(request, self.spec.size, "capture loaded")

    async def _report_load(self, request: Request) -> None:
        assert self.workers is not None
        checked = -math.inf
        while True:
            # Spaced from this request's last report (an earlier wait of the same call) and last look.
            await trio.sleep_until(max(self._told.get(request, Told()).at, checked) + LOAD_PROGRESS_S)
            if not self.workers.loading:
                return
            read = await self.read_position()
            checked = trio.current_time()
            await self._tell(request, *self._load_report(read))

    async def tell_load(self, request: Request) -> None:
        """One report of how far the load is, now: a call that answers at once still says it."""
        if self.workers is not None and self.workers.loading and self.tshark_only is None:
            await self._tell(request, *self._load_report(await self.read_position()))

    def _load_report(self, read: int | None) -> tuple[int, str]:
        size, name = self.spec.size, self.spec.path.name
        done = min(read or 0, size - 1)  # "all read" is said once loaded
        facts = self.wireshark.capinfos.known_facts(self.spec.identity)
        # Frames by the share of bytes read (an estimate: "~"), when capinfos has counted them.
        frames = f"~{facts.packets * done // size:,} of {facts.packets:,} frames, " if facts and size else ""
        return done, (f"loading {name}: {frames}{_mb(done)} of {_mb(size)} MB read" if done < size - 1 else
                      f"loading {name}: all {_mb(size)} MB read, sharkd finishing")

    async def read_position(self) -> int | None:
        """Bytes of the file the loading sharkd has read (pool.load_position)."""
        assert self.workers is not None
        return await trio.to_thread.run_sync(self.workers.load_position)  # /proc reads: off the loop

    async def _tell(self, request: Request, done: int, message: str) -> None:
        """One report, if it is higher than the request's last (MCP: each notification's progress
        is higher than the one before)."""
        told = self._told.setdefault(request, Told())
        if done > told.done:
            told.done, told.at = done, trio.current_time()
            await request.report_progress(done, self.spec.size, message)

    async def check_filter(self, request: Request, display_filter: str) -> None:
        if not display_filter:
            return
        check_length(display_filter)
        try:
            await self.sharkd_call(request, "check", {"filter": display_filter})
        except SharkdError as exc:
            raise invalid(display_filter, exc) from None

    def counted(self, display_filter: str) -> int | None:
        """How many frames match, when a pass or a cached frame list has counted them (nothing is run)."""
        cached = self.filters.get(display_filter)
        if cached is not None:
            return len(cached)
        return self.workers.totals.get(display_filter) if self.workers is not None else None

    def first_before_count(self, kind: str, display_filter: str) -> bool:
        """Whether a call of this `kind` ("timeline", "search") on this filter is the first since its
        frame set was last counted (then its page may come from a single pass; the next one counts):
        True once per uncounted filter and kind; never for all frames (""), whose count is the capture's."""
        if not display_filter:
            return False
        counted = self.counted(display_filter) is not None or (
            self.workers is not None and bool(self.workers.pool.holders(display_filter)))
        key = (kind, display_filter)
        if counted or key in self._before_count:
            return False
        self._before_count[key] = None
        while len(self._before_count) > 256:
            self._before_count.popitem(last=False)
        return True

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
        check_length(display_filter)
        assert self.workers is not None
        async with self.load_progress(request):
            return await self.workers.page(display_filter, offset, limit, request.deadline, kinds)

    async def tree(self, request: Request, number: int, *, keep: bool = True) -> dict[str, Any]:
        """A frame's protocol tree with its bytes (tshark -V dumps `data` items in hex), cached:
        the bytes always come along, so one frame is one cache entry whatever the caller renders.
        A scan over a whole capture passes keep=False: thousands of trees would hold hundreds of MB."""
        return (await self.trees_of(request, [number], keep=keep))[0]

    async def trees_of(self, request: Request, numbers: Sequence[int], *, keep: bool = True) -> list[dict[str, Any]]:
        """`tree` of each of `numbers`, in order: the ones not cached are fetched from one worker in
        one pipelined batch (sharkd dissects the next frame while this process decodes the last)."""
        found: dict[int, dict[str, Any]] = {}
        for number in numbers:
            cached = self.trees.get(number)
            if cached is not None:
                found[number] = cached
        missing = [n for n in dict.fromkeys(numbers) if n not in found]
        if missing:
            if not self.loaded:
                await self.sharkd_call(request, "status")  # loads the capture first, so frame_count is known
            for number in missing:
                if not 1 <= number <= self.frame_count:
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                                     f"frame {number} does not exist: the capture has frames 1..{self.frame_count}",
                                     frame=number, frame_count=self.frame_count)
            answers = await self.sharkd_call_many(request, "frame", [{"frame": n, "proto": True, "bytes": True}
                                                                     for n in missing])
            for number, answer in zip(missing, answers, strict=True):
                if isinstance(answer, SharkdError):
                    raise answer
                found[number] = answer
                if keep:
                    self.trees.put(number, answer)
        return [dict(found[n]) for n in numbers]

    def cold_summary(self) -> Summary:
        """Protocols and conversations of the capture from one tshark pass beside the load, started
        once in the background (a call may wait for it or answer without it)."""
        if self.summary is None:
            assert self._nursery is not None
            self.summary = Summary()
            self._nursery.start_soon(self.summary.read, self.cold_argv())
        return self.summary

    async def analysed(self, request: Request) -> dict[str, Any]:
        """Protocols and time span of the whole capture (one dissection pass, done once)."""
        if not self.analysis:
            self.analysis = await self.sharkd_call(request, "analyse")
        return self.analysis

    async def conversations(self, request: Request) -> dict[str, Any]:
        """sharkd's conversation taps of the whole capture (CONVERSATION_TAPS: one pass, done once)."""
        if not self.conversation_taps:
            self.conversation_taps = await self.sharkd_call(request, "tap", dict(CONVERSATION_TAPS))
        return self.conversation_taps

    async def analysed_and_conversations(self, request: Request) -> tuple[dict[str, Any], dict[str, Any]]:
        """`analysed` and `conversations`: two passes over the whole capture, side by side on two
        workers when two are free now (each pass ~0.6 s on 55 MB: pcap_info's first call on a loaded
        capture took their sum, as long as a cold tshark doing both), else one after the other (not
        worth a worker's load: it would cost more than the pass it saves). Side by side, a pass that
        fails does not cancel the other (a sharkd left mid-request is killed, its load lost): the
        other's answer is kept, and the first failure is the call's error."""
        assert self.workers is not None
        if not self.analysis and not self.conversation_taps and self.workers.pool.free_count() >= 2:
            failed: list[DiagdError] = []

            async def keeping_errors(read: Callable[[Request], Awaitable[dict[str, Any]]]) -> None:
                try:
                    await read(request)
                except DiagdError as exc:
                    failed.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(keeping_errors, self.analysed)
                nursery.start_soon(keeping_errors, self.conversations)
            if failed:
                raise failed[0]
        return await self.analysed(request), await self.conversations(request)

    async def sbi_hint(self) -> str:
        """Where this capture's TCP conversations carry HTTP/2 or HTTP/1.1, and which decode-as
        shows HTTP/2 without hiding anything (decode_check.py; one cached tshark pass)."""
        found = await self.wireshark.probes.probe(self.spec.path, self.spec.identity,
                                                  [c.port for c in self.spec.decode_checks])
        return decode_check.http2_hint(found, self.spec.decode_checks)

    async def protocols(self, request: Request) -> list[str]:
        """The protocols the capture carries (sharkd's `analyse`)."""
        return list((await self.analysed(request)).get("protocols", []))


@dataclass
class Told:
    """A request's last load report: bytes and when (progress only goes up, at a bounded rate)."""

    done: int = -1
    at: float = -math.inf


class Summary:
    """One tshark pass's protocols and conversations (tshark.info), or why it failed, once done."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: dict[str, Any] = {}
        self.error: DiagdError | None = None

    async def read(self, argv: list[str]) -> None:
        try:
            self.result = await _cold.info(argv)
        except DiagdError as exc:
            self.error = exc
        finally:
            self.done.set()

    async def wait(self) -> dict[str, Any]:
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


def check_length(display_filter: str) -> None:
    if len(display_filter) > MAX_FILTER_CHARS:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"display filter of {len(display_filter)} characters: sharkd 4.0 takes requests of at "
                         f"most 2 KiB, so filters are limited to {MAX_FILTER_CHARS} characters",
                         display_filter=display_filter[:200] + "...")


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}"
