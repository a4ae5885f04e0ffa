"""The pcap concurrency core on a scripted sharkd (tests/support/fake_sharkd.py) under trio's MockClock:
the worker pool (a second worker for a busy capture, trees served beside a pass), the first-page race
(tshark vs sharkd's pass), BUSY with retry_after_s, cancellation, and eviction under max_loaded
(captures.py: a capture in use is never evicted). The end-to-end tests against real sharkd stay
(tests/e2e/test_pcap_workers.py, test_pcap_first_page.py, test_pcap_eviction.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.actors.base import Request
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.captures import Evict, LoadedCaptures
from diagd.actors.pcap.engine.passes import YIELD_MAX_S, CaptureWorkers, Cores
from diagd.actors.pcap.engine.pool import BUSY_MARGIN_S, PASS_MARGIN_LOADS, CaptureState, WorkerPool, WorkerState
from diagd.actors.pcap.engine.session import CONVERSATION_TAPS, CaptureSession
from diagd.actors.pcap.shark.sharkd import SharkdError
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.fake_sharkd import Script

NGAP = (("ngap", "FT_PROTOCOL", "ngap"),)  # Catalogue.kinds of "ngap": raceable
SPEC = CaptureSpec(path=Path("/captures/fake.pcap"), identity="1:2:3:4", decode_as=(), preferences=(), size=10**6)


@asynccontextmanager
async def capture(script: Script, *, max_workers: int = 2, cores: int = 2, headroom: int | None = None,
                  head_start_s: float = 0.0, after_head_start: Callable[[], None] = lambda: None
                  ) -> AsyncIterator[CaptureWorkers]:
    """One capture's pool and passes on the fake, loading its first worker."""
    async with trio.open_nursery() as nursery:
        pool = WorkerPool(nursery, SPEC, Path("/nonexistent"), max_workers=max_workers, headroom=lambda: headroom,
                          launch=script.launch, cores=cores)
        workers = CaptureWorkers(nursery, pool, ["tshark", "-2", "-r", str(SPEC.path)], cores=Cores(cores),
                                 early_numbers=script.early_numbers, early_rows=script.early_rows,
                                 head_start_s=head_start_s, after_head_start=after_head_start)
        workers.start()
        yield workers
        await workers.close()
        nursery.cancel_scope.cancel()


async def loaded(workers: CaptureWorkers) -> None:
    await workers.call("status", None, display_filter=None, deadline=math.inf)


async def test_the_capture_loads_and_its_state_shows_in_its_repr(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(load_s=5)
    async with capture(script) as workers:
        assert workers.state is CaptureState.LOADING and "LOADING" in repr(workers.pool)
        await loaded(workers)
        assert trio.current_time() == pytest.approx(5, abs=0.1)
        assert workers.state is CaptureState.READY and workers.facts.frame_count == script.frames
        assert [w.state for w in workers.pool.workers] == [WorkerState.IDLE]
        assert repr(workers.pool) == "<WorkerPool [READY, workers: 1, busy: 0] fake.pcap>"
        assert workers.statistics()["workers"][0]["state"] == "idle"


async def test_a_failed_load_is_reported_and_the_next_call_loads_anew(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(fail_load=True)
    async with capture(script) as workers:
        with pytest.raises(DiagdError) as failed:
            await loaded(workers)
        assert failed.value.code is ErrorCode.INVALID_ARGUMENT and "no capture" in failed.value.message
        script.fail_load = False
        await loaded(workers)  # a fresh worker for this call
        assert workers.state is CaptureState.READY and len(script.launched) == 2


async def test_a_tree_passes_a_filter_pass_on_a_second_worker(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"sip": [5, 6]}, pass_s=30)
    finished: list[str] = []
    async with capture(script) as workers:
        await loaded(workers)

        async def filter_pass() -> None:
            page = await workers.page("sip", 0, 20, math.inf)  # not raceable (no kinds): sharkd's pass
            assert (page.total, page.exact, page.served_by) == (2, True, "sharkd")
            finished.append("filter")

        async def tree() -> None:
            await trio.sleep(1)
            await workers.call("frame", {"frame": 7}, display_filter=None, deadline=math.inf)
            finished.append("tree")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(filter_pass)
            nursery.start_soon(tree)
        assert finished == ["tree", "filter"]
        assert len(workers.pool.workers) == 2 and workers.pool.grown == 1
        assert workers.pool.holders("sip")  # the pass left its bitmap: the next page is quick
        before = trio.current_time()
        await workers.page("sip", 0, 20, math.inf)
        assert trio.current_time() - before < 1


async def test_no_second_worker_beyond_the_memory_headroom(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"sip": [5]}, rss_bytes=100 * 2**20)
    async with capture(script, headroom=10 * 2**20) as workers:
        await loaded(workers)
        await workers.page("sip", 0, 20, math.inf)
        assert len(workers.pool.workers) == 1 and workers.pool.grown == 0


async def test_tshark_wins_the_first_page_and_the_pass_gives_the_exact_total(
        autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, pass_s=30, early_s=0.2)
    async with capture(script) as workers:
        await loaded(workers)
        started = trio.current_time()
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)
        assert trio.current_time() - started < 1  # not the 30 s pass
        assert page.exact is False and page.total == 21 and [r["number"] for r in page.rows] == list(range(1, 21))
        assert "first page found by tshark" in page.served_by
        await trio.sleep(60)  # the pass went on (on the other worker) and left the exact total
        again = await workers.page("ngap", 0, 20, math.inf, NGAP)
        assert (again.total, again.exact, again.served_by) == (499, True, "sharkd")


async def test_a_fresh_capture_answers_from_a_single_pass_marked_then_exact_from_sharkd(
        autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, load_s=30, pass_s=10, early_s=0.2)
    async with capture(script) as workers:
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)  # nothing loaded: no worker waited for
        assert trio.current_time() < 1 and workers.state is CaptureState.LOADING
        assert (page.total, page.exact, page.rows_exact) == (21, False, False)
        assert page.served_by == "tshark (single pass while sharkd loads)"
        assert [r["number"] for r in page.rows] == list(range(1, 21))
        assert [r.get("provisional") for r in page.rows[:2]] == [["info"], None]
        everything = await workers.page("", 0, 5, math.inf, ())  # all frames: a single pass too
        assert everything.rows_exact is False and everything.exact is False and trio.current_time() < 1
        again = await workers.page("ngap", 0, 20, math.inf, NGAP)  # the repeat: sharkd's exact page
        assert (again.total, again.exact, again.rows_exact, again.served_by) == (499, True, True, "sharkd")
        assert trio.current_time() >= 30
        unsafe = await workers.page("sip", 0, 20, math.inf, None)  # names not known safe: never a single pass
        assert unsafe.served_by == "sharkd"


def load_started_at(script: Script) -> list[float]:
    """When each worker began reading the file (its `load` request)."""
    return [t for line, t in zip(script.log, script.started_at, strict=True) if line.endswith(" load")]


async def test_a_big_fresh_capture_loads_once_the_first_page_is_found(autojump_clock: trio.testing.MockClock) -> None:
    """The head start: sharkd is started (and reads the file) only when the early pass has its page,
    and the background reads (after_head_start) begin then, once."""
    script = Script(matches={"ngap": list(range(1, 500))}, load_s=30, early_s=0.2)
    began: list[float] = []
    async with capture(script, head_start_s=0.5, after_head_start=lambda: began.append(trio.current_time())) as workers:
        await trio.sleep(0.1)
        assert script.launched == [] and load_started_at(script) == []  # not started yet
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)  # its early pass: 0.1 s to 0.3 s
        assert page.served_by == "tshark (single pass while sharkd loads)"
        await trio.sleep(0.01)
        assert load_started_at(script) == [pytest.approx(0.3)] and began == [pytest.approx(0.3)]
        await loaded(workers)
        assert trio.current_time() == pytest.approx(30.3, abs=0.05)
        assert workers.statistics()["workers"][0]["load_s"] == pytest.approx(30, abs=0.05)  # the hold left out
        assert began == [pytest.approx(0.3)]


async def test_the_head_start_ends_in_time_or_when_a_call_needs_sharkd(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, load_s=30, early_s=5)
    async with capture(script, head_start_s=0.5) as workers:
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)  # a slow early pass: the load begins at 0.5 s
        assert trio.current_time() == pytest.approx(5) and page.exact is False
        assert load_started_at(script) == [pytest.approx(0.5)]
    script = Script(load_s=30)
    async with capture(script, head_start_s=0.5) as workers:
        opened = trio.current_time()
        await trio.sleep(0.1)
        await loaded(workers)  # a call that needs sharkd ends it at once
        assert load_started_at(script) == [pytest.approx(opened + 0.1)]
    script = Script(load_s=30)
    async with capture(script) as workers:  # a small capture: no head start
        opened = trio.current_time()
        await loaded(workers)
        assert load_started_at(script) == [opened]


async def test_a_first_answer_can_hold_the_head_start_until_its_reply_is_on_its_way(
        autojump_clock: trio.testing.MockClock) -> None:
    """end_head_start_after: the background reads begin that much later (a text search's answer, whose
    reply of hundreds of matches then has the cores), or sooner when a call needs sharkd."""
    script = Script(load_s=30)
    async with capture(script, head_start_s=0.5) as workers:
        opened = trio.current_time()
        workers.end_head_start_after(0.1)
        await trio.sleep(0.05)
        assert load_started_at(script) == []
        await trio.sleep(0.1)
        assert load_started_at(script) == [pytest.approx(opened + 0.1)]
    script = Script(load_s=30)
    async with capture(script, head_start_s=0.5) as workers:
        opened = trio.current_time()
        workers.end_head_start_after(0.3)
        await trio.sleep(0.05)
        await loaded(workers)  # a call that needs sharkd ends it at once
        assert load_started_at(script) == [pytest.approx(opened + 0.05)]


async def test_a_load_nobody_waited_for_fails_and_the_next_call_loads_anew(
        autojump_clock: trio.testing.MockClock) -> None:
    """The first page came from tshark while sharkd loaded; then the loading sharkd was killed (or
    crashed, or could not read the file). No call saw that load: the next one starts a fresh worker
    and meets any lasting error itself, rather than inheriting a failure it never caused."""
    script = Script(matches={"ngap": list(range(1, 500))}, load_s=30, die_in_load=True)
    async with capture(script) as workers:
        early = await workers.page("ngap", 0, 20, math.inf, NGAP)
        assert early.served_by == "tshark (single pass while sharkd loads)"
        await trio.sleep(31)  # the load dies with nobody waiting
        assert workers.pool.workers == [] and workers.state is CaptureState.STOPPED
        script.die_in_load = False
        again = await workers.page("ngap", 0, 20, math.inf, NGAP)
        assert (again.total, again.exact, again.served_by) == (499, True, "sharkd") and len(script.launched) == 2

        workers.pool.begin()  # a load nobody waits for fails on a lasting error ...
        script.fail_load = True
        await trio.sleep(31)
        script.launched[1].alive = False
        with pytest.raises(DiagdError) as failed:  # ... which the call that loads again is told
            await loaded(workers)
        assert failed.value.code is ErrorCode.INVALID_ARGUMENT and len(script.launched) == 4


async def test_sharkd_wins_when_tshark_is_slower_than_the_pass(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": [3, 4]}, pass_s=2, early_s=50)
    async with capture(script, cores=4) as workers:  # a free core: tshark races beside the pass
        await loaded(workers)
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)
        assert (page.total, page.exact, page.served_by) == (2, True, "sharkd")
        assert trio.current_time() < 5 + 2 + 1  # the load, the pass and the rows: tshark was stopped


async def test_a_call_that_cannot_get_a_worker_in_time_is_busy_with_retry_after(
        autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"sip": [1]}, pass_s=100)
    async with capture(script, max_workers=1) as workers:
        await loaded(workers)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.page, "sip", 0, 20, math.inf)
            await trio.sleep(10)
            deadline = trio.current_time() + 5
            with pytest.raises(DiagdError) as busy:
                await workers.call("frame", {"frame": 1}, display_filter=None, deadline=deadline)
            assert busy.value.code is ErrorCode.BUSY
            assert busy.value.details["retry_after_s"] >= 1 and "filter pass" in busy.value.message
            assert trio.current_time() == pytest.approx(deadline - 1)  # refused 1 s before its deadline, not at it
            nursery.cancel_scope.cancel()


async def test_a_cancelled_caller_leaves_the_pass_running_and_the_worker_alive(
        autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"sip": [1, 2, 3]}, pass_s=30)
    async with capture(script, max_workers=1) as workers:
        await loaded(workers)
        with trio.move_on_after(3):  # the client gives up mid-pass
            await workers.page("sip", 0, 20, math.inf)
        assert workers.passes["sip"].started and all(s.alive for s in script.launched)
        await trio.sleep(40)
        assert workers.totals["sip"] == 3 and not workers.passes  # done for the next call
        assert all(s.alive for s in script.launched)


async def test_a_pass_nobody_waits_for_before_it_starts_is_dropped(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": [1, 2]}, pass_s=30, early_s=0.1)
    async with capture(script, max_workers=1) as workers:
        await loaded(workers)
        page = await workers.page("ngap", 0, 20, math.inf, NGAP)  # tshark within its head start
        assert page.exact and page.total == 2 and "found by tshark" in page.served_by
        await trio.sleep(60)
        assert not any("intervals ngap" in line for line in script.log)  # no pass was run for it


async def test_an_invalid_filter_is_refused_by_the_pass(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(invalid={"bogus"})
    async with capture(script) as workers:
        await loaded(workers)
        with pytest.raises(DiagdError) as refused:
            await workers.page("bogus", 0, 20, math.inf)
        assert refused.value.code is ErrorCode.INVALID_FILTER


async def test_a_worker_that_dies_is_replaced_on_the_next_call(autojump_clock: trio.testing.MockClock) -> None:
    script = Script()
    async with capture(script, max_workers=1) as workers:
        await loaded(workers)
        script.launched[0].alive = False  # killed from outside
        assert workers.state is CaptureState.STOPPED
        await loaded(workers)
        assert len(script.launched) == 2 and workers.state is CaptureState.READY


# -- eviction under max_loaded (captures.py) -------------------------------------------------------


class Loaded:
    """The back end's side of LoadedCaptures: which actors run, stopped when evicted."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.stopped: list[str] = []
        self.table = LoadedCaptures()

    async def call(self, key: str, seconds: float, *, max_loaded: int = 1, call_timeout_s: float = 30) -> float:
        """One call on `key` lasting `seconds` once admitted, as PcapBackend.ask makes room for it."""
        with trio.fail_after(call_timeout_s):
            deadline = trio.current_effective_deadline()
            while (room := self.table.room_for(key, self.running, max_loaded)) is not True:
                if isinstance(room, Evict):
                    assert not self.table.in_use(room.key)
                    self.running.discard(room.key)
                    self.stopped.append(room.key)
                    self.table.evicted_now(room)
                else:
                    await self.table.wait_for_change(key, max_loaded, deadline)
            with self.table.in_call(key):
                self.running.add(key)
                await trio.sleep(seconds)
                assert key in self.running, f"{key} was evicted during its call"
                return trio.current_time()


async def test_a_capture_in_use_is_not_evicted_and_the_new_one_waits_its_turn(
        autojump_clock: trio.testing.MockClock) -> None:
    loaded = Loaded()
    ended: dict[str, float] = {}

    async def run(key: str, seconds: float, delay: float) -> None:
        await trio.sleep(delay)
        ended[key] = await loaded.call(key, seconds)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "A", 10, 0)
        nursery.start_soon(run, "B", 1, 1)
    assert ended == {"A": 10, "B": 11}  # B waited for A's call, then A (idle) was evicted
    assert loaded.stopped == ["A"] and loaded.running == {"B"}


async def test_when_every_loaded_capture_is_busy_past_the_deadline_the_call_is_busy(
        autojump_clock: trio.testing.MockClock) -> None:
    loaded = Loaded()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(loaded.call, "A", 100, call_timeout_s=200))
        await trio.sleep(5)
        with pytest.raises(DiagdError) as busy:
            await loaded.call("B", 1, max_loaded=1, call_timeout_s=10)
        assert busy.value.code is ErrorCode.BUSY
        assert "all 1 loaded captures are busy; max_loaded=1" in busy.value.message
        assert busy.value.details["retry_after_s"] == 14  # as long as A's call has run when refused
        assert trio.current_time() == pytest.approx(14)  # 1 s before its deadline
    assert loaded.stopped == [] and loaded.table.refused == 1


async def test_the_least_recently_used_idle_capture_is_evicted_first(autojump_clock: trio.testing.MockClock) -> None:
    loaded = Loaded()
    for key in ("A", "B", "C"):
        await loaded.call(key, 1, max_loaded=3)
    await loaded.call("A", 1, max_loaded=3)  # A is now the most recent
    async with trio.open_nursery() as nursery:
        # B in use: not evicted although older than A.
        nursery.start_soon(functools.partial(loaded.call, "B", 50, max_loaded=3))
        await trio.sleep(1)
        await loaded.call("D", 1, max_loaded=3)
        assert loaded.stopped == ["C"]
        await loaded.call("E", 1, max_loaded=3)
        assert loaded.stopped == ["C", "A"]
        nursery.cancel_scope.cancel()


async def test_over_memory_only_idle_captures_are_named(autojump_clock: trio.testing.MockClock) -> None:
    table = LoadedCaptures()
    for key in ("A", "B", "C"):
        with table.in_call(key):
            await trio.sleep(1)
    held = {"A": 100, "B": 100, "C": 100}
    with table.in_call("A"):
        assert [e.key for e in table.over_memory(held, 150, keep="C")] == ["B"]  # A in use, C is the caller's
    assert [e.key for e in table.over_memory(held, 50, keep="C")] == ["B", "A"]  # least recently used first


async def test_a_filter_pass_that_could_not_end_in_time_is_refused_busy_earlier(
        autojump_clock: trio.testing.MockClock) -> None:
    """A new filter waiting for the worker gives up PASS_MARGIN_LOADS loads before its deadline (its
    pass reads every frame, as the load did), not BUSY_MARGIN_S: it could not end in time."""
    script = Script(matches={"sip": [1], "dns": [2]}, pass_s=100)
    async with capture(script, max_workers=1) as workers:
        await loaded(workers)
        load_s = workers.pool.workers[0].load_s
        assert load_s > BUSY_MARGIN_S
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.page, "sip", 0, 20, math.inf)
            await trio.sleep(10)
            deadline = trio.current_time() + 30
            with pytest.raises(DiagdError) as busy:
                await workers.page("dns", 0, 20, deadline)
            assert busy.value.code is ErrorCode.BUSY
            assert trio.current_time() == pytest.approx(deadline - PASS_MARGIN_LOADS * load_s)
            nursery.cancel_scope.cancel()


async def test_pcap_info_passes_run_side_by_side_on_two_free_workers_and_once(
        autojump_clock: trio.testing.MockClock) -> None:
    """A loaded capture's first pcap_info reads it twice (sharkd's `analyse`, then the conversation
    taps): on two workers free at that moment the two passes run at once; with one, one after the
    other, and no worker is started for them; either way each runs once per capture."""
    script = Script(pass_s=10)
    async with capture(script) as workers:
        await loaded(workers)
        one = CaptureSession(SPEC)
        one.workers = workers
        started = trio.current_time()
        analysis, taps = await one.analysed_and_conversations(Request("pcap_info"))
        assert trio.current_time() - started == pytest.approx(20, abs=0.1)  # one worker: one, then the other
        assert len(workers.pool.workers) == 1 and workers.pool.grown == 0
        assert analysis["protocols"] == ["frame", "eth", "ip"]
        assert [t["tap"] for t in taps["taps"]] == [name for _, name in CONVERSATION_TAPS]
        again, asked = trio.current_time(), len(script.log)
        assert await one.analysed_and_conversations(Request("pcap_info")) == (analysis, taps)
        assert trio.current_time() == again and len(script.log) == asked  # done once per capture

        # A second worker (a filter pass while a tree was asked for grew one), both free now.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(workers.page, "sip", 0, 20, math.inf)
            await trio.sleep(1)
            await workers.call("frame", {"frame": 7}, display_filter=None, deadline=math.inf)
        assert workers.pool.free_count() == 2
        two = CaptureSession(SPEC)
        two.workers = workers
        started = trio.current_time()
        assert await two.analysed_and_conversations(Request("pcap_info")) == (analysis, taps)
        assert trio.current_time() - started == pytest.approx(10, abs=0.1)  # side by side
        ran = [entry.split()[1] for entry in script.log[-2:]]
        assert sorted(ran) == ["analyse", "tap"] and script.started_at[-1] == script.started_at[-2]


async def test_a_pcap_info_pass_that_fails_leaves_the_other_and_its_worker_alone(
        autojump_clock: trio.testing.MockClock) -> None:
    """Side by side, the conversation pass failing does not cancel `analyse` (a sharkd left mid-request
    is killed): its answer is kept, both workers stay, and the call gets the coded error itself."""
    script = Script(pass_s=10)
    async with capture(script) as workers:
        await loaded(workers)
        async with trio.open_nursery() as nursery:  # a second worker, as in the test above
            nursery.start_soon(workers.page, "sip", 0, 20, math.inf)
            await trio.sleep(1)
            await workers.call("frame", {"frame": 7}, display_filter=None, deadline=math.inf)
        assert workers.pool.free_count() == 2
        script.errors["tap"] = (-11002, "tap failed")
        session = CaptureSession(SPEC)
        session.workers = workers
        with pytest.raises(SharkdError) as failed:
            await session.analysed_and_conversations(Request("pcap_info"))
        assert failed.value.details["sharkd_method"] == "tap"
        assert session.analysis["protocols"] == ["frame", "eth", "ip"]
        assert all(w.alive for w in script.launched) and workers.pool.free_count() == 2


# -- background passes yield to calls (passes.py, YIELD_MAX_S) ---------------------------------------


async def two_workers(workers: CaptureWorkers) -> None:
    """Both workers loaded: a new filter's pass then starts at once, beside tshark's early page."""
    await loaded(workers)
    workers.pool.grow()
    while sum(1 for w in workers.pool.workers if w.ready) < 2:
        await trio.sleep(0.1)


async def early_page_with_its_pass(workers: CaptureWorkers) -> float:
    """A new filter's first page, found by tshark; its pass goes on in the background. When the pass began."""
    began = trio.current_time()
    page = await workers.page("ngap", 0, 20, math.inf, NGAP)
    assert page.exact is False and "ngap" in workers.passes and workers.passes["ngap"].started
    return began


async def pass_done(workers: CaptureWorkers) -> float:
    """When the background pass leaves the filter's exact total."""
    while "ngap" in workers.passes:
        await trio.sleep(0.01)
    assert workers.totals["ngap"] == 499
    return trio.current_time()


def paused_workers(workers: CaptureWorkers) -> list[bool]:
    return [w.paused for w in workers.pool.workers]


async def test_a_pass_nobody_waits_for_stops_while_a_call_is_under_way(
        autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, pass_s=30, early_s=0.2)
    async with capture(script) as workers:
        await two_workers(workers)
        began = await early_page_with_its_pass(workers)
        assert workers.cores.running == 1
        async with workers.foreground():  # another call of this capture, 1 s long
            assert paused_workers(workers).count(True) == 1
            assert any(w["paused"] for w in workers.statistics()["workers"])
            assert workers.cores.running == 0  # its core is the call's
            await trio.sleep(1)
        assert paused_workers(workers) == [False, False] and workers.cores.running == 1
        assert await pass_done(workers) == pytest.approx(began + 30 + 1, abs=0.1)
        assert workers.cores.running == 0


async def test_a_pass_yields_at_most_its_budget_to_calls(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, pass_s=30, early_s=0.2)
    async with capture(script) as workers:
        await two_workers(workers)
        began = await early_page_with_its_pass(workers)
        for _ in range(3):  # calls one after the other, 10 s each: the pass yields YIELD_MAX_S in all
            async with workers.foreground():
                await trio.sleep(10)
        assert await pass_done(workers) == pytest.approx(began + 30 + YIELD_MAX_S, abs=0.1)


async def test_a_call_waiting_for_the_pass_or_for_a_worker_resumes_it(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(matches={"ngap": list(range(1, 500))}, pass_s=30, early_s=0.2)
    async with capture(script) as workers:
        await two_workers(workers)
        began = await early_page_with_its_pass(workers)
        async with workers.foreground():
            await trio.sleep(1)
            again = await workers.page("ngap", 0, 20, math.inf, NGAP)  # answered early before: waits for the pass
            assert (again.total, again.exact) == (499, True)
            assert trio.current_time() == pytest.approx(began + 30 + 1, abs=0.1)

    script = Script(matches={"ngap": list(range(1, 500))}, pass_s=30, early_s=0.2)
    async with capture(script) as workers:
        await two_workers(workers)
        began = await early_page_with_its_pass(workers)
        async with workers.foreground(), trio.open_nursery() as nursery:
            # The other worker busy for 30 s, then a short request: it must wait for a worker, so the
            # paused pass goes on (else it would wait for the call it is part of).
            nursery.start_soon(functools.partial(workers.call, "analyse", None, display_filter=None,
                                                 deadline=math.inf))
            await trio.sleep(1)
            assert paused_workers(workers).count(True) == 1
            nursery.start_soon(functools.partial(workers.call, "frame", {"frame": 7}, display_filter=None,
                                                 deadline=math.inf))
            await trio.sleep(0.01)
            assert paused_workers(workers) == [False, False]
            assert await pass_done(workers) == pytest.approx(began + 30 + 1, abs=0.1)
