"""A capture's sharkd workers as the actor reaches them, and pages of a display filter: from a
worker that holds the filter, or first page first for a new one.

The actor reaches its workers only through `CaptureWorkers` (one request on a free worker: `use`,
`call`; a page: `page`), which owns the pool (pool.py).

A new filter costs sharkd one pass over the whole capture before its first row. Here that pass runs
as a background task of the actor (one per filter, shared by every call asking for it), and the call
races it with an early-stopping tshark (`first_page`) when that gives the same rows: the first page
is answered by whichever is ready first. A pass that has not got a worker yet when tshark wins is
dropped again (nobody needs it before the next page); one that has started goes on — sharkd cannot
be interrupted except by killing it — and leaves the filter's bitmap on its worker and its exact
total here, so the next page costs milliseconds.
"""

from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from diagd.actors.pcap.engine.pool import SPARE_IDLE_S, CaptureState, Lease, WorkerPool
from diagd.actors.pcap.shark.rows import packet_row
from diagd.actors.pcap.shark.sharkd import SharkdError
from diagd.actors.pcap.warm import first_page
from diagd.protocol.errors import DiagdError, ErrorCode

TOTALS_BUDGET = 2**20  # bytes of known totals (filters of up to 1800 characters each)
WHOLE = 2**31 - 1  # one interval spanning the capture: `intervals` then counts every match
# How long an early tshark is worth it beside a pass (matches in the first few % of a capture come
# within it), and the head start it gets when the pass would take the capture's only worker.
EARLY_BUDGET_S = 0.5
# How long a fresh big capture's background work (starting and loading sharkd, the file's sha256,
# capinfos' count) waits for the first answer's early pass: on 2 cores, four readers beside that pass left it half a
# core; a first page early in a file takes a single pass about this long (tshark's start is 0.3 s of it).
HEAD_START_S = 0.5
# How long after a first answer is made the head start still holds: its reply's way to the client (JSON,
# the shim, the client's own parse and check of hundreds of matches: 20-30 ms alone, 55-75 ms beside
# a 55 MB capture's load, sha256 and count, measured with a text search's 600 matches).
REPLY_HEAD_START_S = 0.1
# Background passes yield to calls. A pass whose first page was answered early has nobody waiting for
# it (it makes the filter's next page exact and fast), yet takes a core from the calls that come right
# after it: a text search of the new filter took 0.21-0.23 s beside it, 0.18-0.20 s alone (2 cores;
# the search's own single pass and sharkd reads need both). While a call of the capture is under way
# such a pass's sharkd is stopped (SIGSTOP); it goes on when the calls are over, when a call waits for
# it or for a worker, or once it has yielded YIELD_MAX_S in all, so that a stream of calls cannot starve it.
YIELD_MAX_S = 2.0
ROWS_TIMEOUT_S = 60.0  # a page's `frame` requests take milliseconds: past this sharkd is hung
FIRST_FOUND_KEPT = 64  # filters whose single-pass first frame numbers are kept (up to MAX_EARLY_ROWS each)
# (argv, display filter, how many) -> (the first matching frame numbers, complete): first_page.early_numbers,
# a scripted fake in the unit tests.
EarlyNumbers = Callable[[list[str], str, int], Awaitable[tuple[list[int], bool]]]
# (argv, display filter, how many) -> (the first matching rows, complete): first_page.early_rows.
EarlyRows = Callable[[list[str], str, int], Awaitable[tuple[list[dict[str, Any]], bool]]]


class Cores:
    """Dissection passes and early tshark runs going on now over every capture (one object per back
    end, handed to each capture): an early tshark is a speculative second pass, worth a core only
    when one is free."""

    def __init__(self, count: int | None = None) -> None:
        self.count = max(1, count or os.cpu_count() or 1)
        self.running = 0

    @property
    def one_free(self) -> bool:
        """A core is free beside one more pass (the one about to start)."""
        return self.running + 1 < self.count

    def __repr__(self) -> str:
        return f"<Cores [running: {self.running} of {self.count}]>"



@dataclass
class Page:
    total: int
    exact: bool
    rows: list[dict[str, Any]]
    served_by: str
    rows_exact: bool = True  # False: some rows came from a single pass, their `provisional` columns may change


@dataclass(eq=False)
class FilterPass:
    display_filter: str
    deadline: float
    done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    started: bool = False  # it has a worker: cancelling it now would kill that sharkd
    waiting: int = 0
    error: DiagdError | None = None
    lease: Lease | None = None  # its worker, once started
    paused_at: float | None = None  # stopped to yield to calls (CaptureWorkers.foreground) since then
    yielded_s: float = 0.0  # stopped this long in all
    pause_timer: trio.CancelScope = field(default_factory=trio.CancelScope)


def invalid(display_filter: str, exc: SharkdError) -> DiagdError:
    """sharkd's refusal of a request carrying `display_filter`: INVALID_FILTER with the compiler's
    message when it is the filter sharkd refused, else its own coded error (SharkdError's table)."""
    if exc.code is not ErrorCode.INVALID_FILTER:
        return exc
    message = exc.sharkd_message.removeprefix("Filter invalid - ")
    return DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {message}", display_filter=display_filter,
                      sharkd_code=exc.sharkd_code)


class CaptureWorkers:
    """The pool of one capture, the exact totals known per filter and the passes running."""

    def __init__(self, nursery: trio.Nursery, pool: WorkerPool, cold_argv: list[str], *, cores: Cores,
                 early_numbers: EarlyNumbers = first_page.early_numbers,
                 early_rows: EarlyRows = first_page.early_rows, head_start_s: float = 0.0,
                 after_head_start: Callable[[], None] = lambda: None) -> None:
        self._nursery = nursery
        self.pool = pool
        # Over when the first call's early pass has its page, a call needs sharkd, or head_start_s has
        # passed; then the pool starts its first worker and after_head_start starts the rest.
        self.head_start = pool.hold = trio.Event()
        self._head_start_s = head_start_s
        self._after_head_start = after_head_start
        self.facts = pool.facts  # updated in place by the pool when the capture loads
        self.cold_argv = cold_argv
        self.cores = cores
        self._early_numbers = early_numbers
        self._early_rows = early_rows
        self.totals: OrderedDict[str, int] = OrderedDict()
        self.totals_bytes = 0  # about what `totals` holds: its filters' lengths and ~100 bytes an entry
        self.passes: dict[str, FilterPass] = {}
        # Early tshark runs share the cores with the passes: one per core at most.
        self.early_slots = trio.CapacityLimiter(cores.count)
        self.early_answers = 0
        self.answered_early: OrderedDict[str, None] = OrderedDict()  # lower-bound totals given
        # The frame numbers those single passes found (the first `offset + limit` matches, and whether
        # that was all): a text search of the filter right after its first page reads its frames here.
        self._first_found: OrderedDict[str, tuple[list[int], bool]] = OrderedDict()
        self._calls = 0  # calls of this capture under way (foreground)
        pool.on_wait = self._resume_passes

    # -- the pool, as the actor sees it ----------------------------------------------------------

    async def call(self, method: str, params: dict[str, Any] | None, *, display_filter: str | None,
                   deadline: float, keep: int | None = None) -> Any:
        """One sharkd request on a free worker (the holder of `display_filter` if one does); `keep`: read at most
        that many bytes of its answer (sharkd.Cut)."""
        async with self.pool.use(method, display_filter=display_filter, deadline=deadline) as worker:
            return await worker.call(method, params, keep=keep)

    async def call_many(self, method: str, params: list[dict[str, Any]], *, deadline: float) -> list[Any]:
        """`method` for each parameter set, pipelined on one free worker (answers or SharkdErrors)."""
        async with self.pool.use(method, deadline=deadline) as worker:
            return await worker.call_many(method, params)

    @property
    def loading(self) -> bool:
        return self.pool.loading

    @property
    def state(self) -> CaptureState:
        return self.pool.state

    def load_position(self) -> int | None:
        return self.pool.load_position()

    def first_numbers(self, display_filter: str) -> tuple[list[int], bool] | None:
        """(the first matching frame numbers, whether they are all) of a filter whose first page came
        from a single pass, if one did lately; None otherwise."""
        return self._first_found.get(display_filter)

    def _found_early(self, display_filter: str, numbers: list[int], complete: bool) -> None:
        self._first_found.pop(display_filter, None)
        self._first_found[display_filter] = (numbers, complete)
        while len(self._first_found) > FIRST_FOUND_KEPT:
            self._first_found.popitem(last=False)

    def raceable(self, display_filter: str, offset: int, limit: int, kinds: first_page.Kinds | None) -> bool:
        return first_page.raceable(display_filter, offset, limit, kinds)

    def tshark_argv(self, kinds: first_page.Kinds | None) -> list[str]:
        """The capture's cold tshark argv, single pass (output from the first match on, so it can
        stop early) when a single pass gives the same for every filter and field named."""
        if first_page.single_pass_safe(kinds):
            return first_page.single_pass(self.cold_argv)
        return list(self.cold_argv)

    def statistics(self) -> dict[str, Any]:
        return {"workers": self.pool.statistics(), "loads": self.pool.loads, "early_first_pages": self.early_answers,
                "filter_passes_running": len(self.passes), "second_workers_started": self.pool.grown}

    def start(self) -> None:
        """Load the first worker (unless the pool refused to: over the memory budget) once the head start
        is over, and stop spares that stay idle."""
        if self.pool.refused is None:
            self.pool.begin()
        self._nursery.start_soon(self._end_head_start_in_time)
        self._nursery.start_soon(self._retire_spares)

    def end_head_start(self) -> None:
        """The first answer no longer needs the cores to itself: background reads may begin (the pool
        ends it too when a call asks for a worker: then the load is what the call waits for)."""
        self.head_start.set()

    def end_head_start_after(self, delay_s: float) -> None:
        """end_head_start `delay_s` from now (or sooner: the time a first answer's reply takes to reach
        its client, which beside sharkd's load, sha256 and capinfos ran at a fraction of a core)."""
        if not self.head_start.is_set():
            self._nursery.start_soon(self._end_head_start_after, delay_s)

    async def _end_head_start_after(self, delay_s: float) -> None:
        with trio.move_on_after(delay_s):
            await self.head_start.wait()
        self.head_start.set()

    async def _end_head_start_in_time(self) -> None:
        with trio.move_on_after(self._head_start_s):
            await self.head_start.wait()
        self.head_start.set()
        self._after_head_start()

    async def _retire_spares(self) -> None:
        while True:
            await trio.sleep(SPARE_IDLE_S / 4)
            self.pool.retire_idle_spares()

    async def close(self) -> None:
        await self.pool.close()

    # -- background passes yield to calls ------------------------------------------------------

    @asynccontextmanager
    async def foreground(self) -> AsyncIterator[None]:
        """One call of this capture under way: passes nobody waits for stop meanwhile (YIELD_MAX_S)."""
        self._calls += 1
        for running in list(self.passes.values()):
            self._yield(running)
        try:
            yield
        finally:
            self._calls -= 1
            if not self._calls:
                self._resume_passes()

    def _yield(self, running: FilterPass) -> None:
        """Stop a started pass nobody waits for while calls are under way, within its budget."""
        if (not self._calls or running.lease is None or running.waiting or running.paused_at is not None
                or running.yielded_s >= YIELD_MAX_S or running.done.is_set()):
            return
        running.lease.pause()
        self.cores.running -= 1  # a core free for the calls (a new filter's early tshark may race on it)
        running.paused_at = trio.current_time()
        running.pause_timer = trio.CancelScope()
        self._nursery.start_soon(self._resume_in_time, running, running.pause_timer, YIELD_MAX_S - running.yielded_s)

    async def _resume_in_time(self, running: FilterPass, timer: trio.CancelScope, after_s: float) -> None:
        with timer:
            await trio.sleep(after_s)
            self._resume(running)

    def _resume(self, running: FilterPass) -> None:
        if running.paused_at is None:
            return
        running.yielded_s += trio.current_time() - running.paused_at
        running.paused_at = None
        running.pause_timer.cancel()
        self.cores.running += 1
        if running.lease is not None:
            running.lease.resume()

    def _resume_passes(self) -> None:
        for running in list(self.passes.values()):
            self._resume(running)

    # -- pages ----------------------------------------------------------------------------------

    async def page(self, display_filter: str, offset: int, limit: int, deadline: float,
                   kinds: first_page.Kinds | None = None) -> Page:
        # A page answered early is answered by sharkd the next time, unless no sharkd will ever load.
        again = display_filter in self.answered_early and self.pool.refused is None
        if (self.pool.loading and not again and display_filter not in self.passes
                and first_page.loading_safe(display_filter, offset, limit, kinds)):
            return await self._while_loading(display_filter, offset, limit)
        self.end_head_start()  # the page needs sharkd (or its pass) either way
        if display_filter and not self.pool.holders(display_filter):
            early = await self._first(display_filter, offset, limit, deadline, kinds)
            if early is not None:
                return early
        return await self._from_worker(display_filter, offset, limit, deadline)

    async def _from_worker(self, display_filter: str, offset: int, limit: int, deadline: float) -> Page:
        params: dict[str, Any] = {"limit": limit}
        if offset:
            params["skip"] = offset  # sharkd refuses skip=0
        if display_filter:
            params["filter"] = display_filter
        async with self.pool.use("frames", display_filter=display_filter, deadline=deadline) as worker:
            try:
                result = await worker.call("frames", params)
                total = self.totals.get(display_filter)
                if total is None and display_filter:
                    counted = await worker.call("intervals", {"filter": display_filter, "interval": WHOLE})
                    total = self._known(display_filter, int(counted.get("frames", 0)))
            except SharkdError as exc:
                raise invalid(display_filter, exc) from None
        if not display_filter:
            total = self.pool.facts.frame_count
        assert total is not None
        return Page(total, True, [packet_row(r["c"]) for r in result], "sharkd")

    def _known(self, display_filter: str, total: int) -> int:
        if self.totals.pop(display_filter, None) is None:
            self.totals_bytes += len(display_filter) + 100
        self.totals[display_filter] = total
        while len(self.totals) > 4096 or self.totals_bytes > TOTALS_BUDGET:
            self.totals_bytes -= len(self.totals.popitem(last=False)[0]) + 100
        return total

    async def _first(self, display_filter: str, offset: int, limit: int, deadline: float,
                     kinds: first_page.Kinds | None) -> Page | None:
        """The first page of a filter no worker holds: the pass's, or tshark's if that comes first."""
        # A filter answered early before is not raced again: this call waits for the exact total.
        raceable = (first_page.raceable(display_filter, offset, limit, kinds)
                    and display_filter not in self.answered_early)
        if raceable and self.pool.loading and display_filter not in self.passes:
            # A fresh capture: tshark looks for the page while sharkd loads, and the pass waits until
            # it is done: started now, it would take the loaded worker the page's rows need.
            try:
                page = await self._early(display_filter, offset, limit, deadline)
            except DiagdError as exc:
                if exc.code is ErrorCode.INVALID_FILTER:
                    raise
            else:
                assert page is not None  # no budget: tshark reads to the end if it must
                if not page.exact and self._beside_pass():
                    # The exact total for the next call; with one worker the pass would hold it for a
                    # whole pass while other calls' rows wait, so the next call of this filter starts it.
                    self._start_pass(display_filter, math.inf)
                return page
        # With one worker, the pass would hold it while tshark's matches wait for their rows: tshark
        # gets a head start before the pass takes it.
        head_start = EARLY_BUDGET_S if raceable and not self._beside_pass() else 0.0
        running = self.passes.get(display_filter) or self._start_pass(display_filter, deadline, head_start)
        running.waiting += 1
        self._resume(running)  # this call waits for it now
        try:
            # tshark races only on a free core (the pass about to start takes one), or when the pass
            # waits for it (the head start).
            if raceable and (head_start or self.cores.one_free):
                early = await self._race(running, offset, limit)
                if early is not None:
                    return early
            await running.done.wait()
        finally:
            running.waiting -= 1
            if running.waiting == 0 and not running.started:
                running.scope.cancel()  # answered early and nobody else waits: no pass before the next page
            elif running.waiting == 0:
                self._yield(running)  # answered early: the pass goes on in the background
        if running.error is not None:
            raise running.error
        return None

    async def _early(self, display_filter: str, offset: int, limit: int, deadline: float,
                     budget: float = math.inf) -> Page | None:
        """The page from tshark's first matches and a free worker's rows of them; None when tshark
        did not find them within `budget` seconds (it is stopped)."""
        found: tuple[list[int], bool] | None = None
        with trio.move_on_after(budget):
            async with self.early_slots:
                self.cores.running += 1
                try:
                    found = await self._early_numbers(self.cold_argv, display_filter, offset + limit)
                finally:
                    self.cores.running -= 1
                    self.end_head_start()
        if found is None:
            return None
        numbers, complete = found
        self._found_early(display_filter, numbers, complete)
        seen = len(numbers) if complete else offset + limit + 1
        if complete:
            self._known(display_filter, seen)
        else:
            self.answered_early[display_filter] = None
            if len(self.answered_early) > 256:
                self.answered_early.popitem(last=False)
        rows = await self._rows(numbers[offset:offset + limit], deadline)
        self.early_answers += 1
        return Page(seen, complete, rows, "sharkd (frames found by tshark)" if complete else
                    "sharkd (first page found by tshark; sharkd's pass gives the exact total)")

    async def _while_loading(self, display_filter: str, offset: int, limit: int) -> Page:
        """A page of a capture no worker has loaded yet: rows and all from an early-stopping single
        pass beside the load, marked per row where a later frame may change them. The same call
        again waits for sharkd and gets the exact page."""
        async with self.early_slots:
            self.cores.running += 1
            try:
                rows, complete = await self._early_rows(self.cold_argv, display_filter, offset + limit)
            finally:
                self.cores.running -= 1
                self.end_head_start()
        seen = len(rows) if complete else offset + limit + 1
        if display_filter:
            self._found_early(display_filter, [int(row["number"]) for row in rows], complete)
        if complete and display_filter:
            self._known(display_filter, seen)
        page = rows[offset:offset + limit]
        rows_exact = not any("provisional" in row for row in page)
        if not (complete and rows_exact):
            self.answered_early[display_filter] = None
            if len(self.answered_early) > 256:
                self.answered_early.popitem(last=False)
        self.early_answers += 1
        return Page(seen, complete, page, "tshark (single pass while sharkd loads)", rows_exact)

    async def _race(self, running: FilterPass, offset: int, limit: int) -> Page | None:
        page: Page | None = None
        failure: DiagdError | None = None
        async with trio.open_nursery() as race:
            # Beside a pass on another worker tshark only helps when matches come early: it is stopped
            # after EARLY_BUDGET_S, not left to read the whole capture on a core the passes need.
            budget = EARLY_BUDGET_S if self._beside_pass() else math.inf

            async def tshark() -> None:
                nonlocal page, failure
                try:
                    page = await self._early(running.display_filter, offset, limit, running.deadline, budget)
                    if page is None:
                        return
                except DiagdError as exc:
                    failure = exc  # the pass says the same or better (sharkd's own message): wait for it
                    if exc.code is ErrorCode.INVALID_FILTER and not running.started:
                        race.cancel_scope.cancel()
                    return
                race.cancel_scope.cancel()

            async def sharkd() -> None:
                await running.done.wait()
                race.cancel_scope.cancel()

            race.start_soon(tshark)
            race.start_soon(sharkd)
        if page is None and failure is not None and not running.started and not running.done.is_set():
            raise failure
        return page

    async def _rows(self, numbers: list[int], deadline: float) -> list[dict[str, Any]]:
        """The packet-list rows of these frames from a free worker (a `frame` request each: the
        two-pass columns, "(reply in 228)" included). Waits for a free worker: when the pass holds
        the only one, the pass's own page comes first."""
        async with self.pool.use("frame columns", deadline=deadline) as worker:
            # Shielded: milliseconds of work, and a sharkd request abandoned midway costs the worker
            # (killing it is the only way to stop one) when the race's other side wins meanwhile.
            # Bounded still: a hung sharkd is given up (and killed) at the call's deadline.
            answers: list[Any] = []
            with trio.CancelScope(shield=True, deadline=min(deadline, trio.current_time() + ROWS_TIMEOUT_S)) as bound:
                answers = await worker.call_many("frame", [{"frame": n, "columns": True} for n in numbers])
            if bound.cancelled_caught:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "sharkd did not give the page's rows in time; it was "
                                 "stopped and the next call starts a fresh one")
        for answer in answers:
            if isinstance(answer, SharkdError):
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd could not give a frame's columns: "
                                 f"{answer.sharkd_message}")
        return [packet_row(answer["col"]) for answer in answers]

    def _beside_pass(self) -> bool:
        """Whether a pass leaves another loaded worker for short requests (the rows of a page)."""
        return sum(1 for w in self.pool.workers if w.ready) >= 2

    def _start_pass(self, display_filter: str, deadline: float, delay: float = 0.0) -> FilterPass:
        running = self.passes[display_filter] = FilterPass(display_filter, deadline)
        self._nursery.start_soon(self._pass, running, deadline, delay)
        return running

    async def _pass(self, running: FilterPass, deadline: float, delay: float) -> None:
        try:
            with running.scope:
                if delay:
                    self.pool.grow()
                    await trio.sleep(delay)
                self.pool.grow()  # calls arriving during the pass would queue behind it: another worker
                async with self.pool.use("filter pass", display_filter=running.display_filter,
                                         deadline=deadline, long=True) as worker:
                    running.started, running.lease = True, worker
                    self._yield(running)  # nobody waits for it (a fresh capture's first page came early)
                    self.cores.running += 1
                    try:
                        await worker.call("check", {"filter": running.display_filter})
                        counted = await worker.call("intervals", {"filter": running.display_filter,
                                                                  "interval": WHOLE})
                    except SharkdError as exc:
                        raise invalid(running.display_filter, exc) from None
                    finally:
                        self.cores.running -= 1
                    self._known(running.display_filter, int(counted.get("frames", 0)))
        except DiagdError as exc:
            running.error = exc
        finally:
            self._resume(running)
            running.lease = None
            if running.scope.cancelled_caught and running.error is None and running.waiting:
                running.error = DiagdError(ErrorCode.CANCELLED, "the filter pass was stopped")
            self.passes.pop(running.display_filter, None)
            running.done.set()
