"""A call waiting for a capture to load reports how far sharkd has read the file: in bytes of the file's
size, increasing, at most every LOAD_PROGRESS_S on the Trio clock (MockClock here, the scripted sharkd
of tests/support/fake_sharkd.py), and "capture loaded" only when it did; a capture over the memory
budget starts no sharkd. The real daemon, sharkd and
MCP client: tests/e2e/test_pcap_load_progress.py."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.actors.base import Request
from diagd.actors.pcap.engine.passes import CaptureWorkers, Cores
from diagd.actors.pcap.engine.pool import WorkerPool, estimated_rss
from diagd.actors.pcap.engine.session import LOAD_PROGRESS_S, CaptureSession
from diagd.actors.pcap.shark.tshark import CaptureFacts
from diagd.protocol.errors import DiagdError
from tests.actors.pcap.test_pool_fake import SPEC, capture
from tests.support.fake_sharkd import Script

Report = tuple[float, float, float | None, str | None]  # (when, progress, total, message)


def recording() -> tuple[Request, list[Report]]:
    seen: list[Report] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((trio.current_time(), done, total, message))

    return Request(object(), progress), seen


def session_on(workers: CaptureWorkers, monkeypatch: pytest.MonkeyPatch, position: Callable[[], int | None]
               ) -> CaptureSession:
    session = CaptureSession(SPEC)
    session.workers = workers  # started by `capture` (no catalogue needed: load_progress never reads it)
    async def read_position() -> int | None:  # in the loop: a thread's real time would run MockClock away
        return position()

    monkeypatch.setattr(session, "read_position", read_position)
    return session


def check_reports(seen: list[Report]) -> None:
    """Strictly increasing (MCP), every total the file's size; the reports of how far the read is spaced
    by at least LOAD_PROGRESS_S ("capture loaded" comes when it happens)."""
    assert all(total == SPEC.size for _, _, total, _ in seen), seen
    done = [d for _, d, _, _ in seen]
    assert done == sorted(set(done)), seen
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(r for r in seen if r[3] != "capture loaded")]
    assert all(gap >= LOAD_PROGRESS_S - 1e-9 for gap in gaps), gaps


async def test_a_wait_for_the_load_reports_bytes_read_at_a_bounded_rate(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(load_s=5)
    reads = itertools.count(0, 40_000)  # sharkd reads on, faster than the reports: each look is higher
    async with capture(script) as workers:
        session = session_on(workers, monkeypatch, lambda: next(reads))
        request, seen = recording()
        async with session.load_progress(request):
            await workers.call("status", None, display_filter=None, deadline=math.inf)
    check_reports(seen)
    assert seen[0][0] == 0.0 and seen[0][1] == 0  # at once, not after the first interval
    # Five seconds of load: one report per interval and the last one, not one per look or per checkpoint.
    assert 5 / LOAD_PROGRESS_S <= len(seen) <= 5 / LOAD_PROGRESS_S + 2, seen
    assert seen[-1][1:] == (SPEC.size, SPEC.size, "capture loaded")
    assert all(m and m.startswith("loading fake.pcap: ") and m.endswith(" MB read") for *_, m in seen[:-1])


async def test_a_stalled_read_is_not_repeated_and_the_end_of_the_file_says_sharkd_is_finishing(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    positions = iter([1000, 1000, 1000, SPEC.size])

    def position() -> int | None:
        return next(positions, SPEC.size)

    async with capture(Script(load_s=5)) as workers:
        session = session_on(workers, monkeypatch, position)
        request, seen = recording()
        async with session.load_progress(request):
            await workers.call("status", None, display_filter=None, deadline=math.inf)
    check_reports(seen)
    assert [(d, m) for _, d, _, m in seen] == [
        (1000, "loading fake.pcap: 0.0 of 1.0 MB read"),
        (SPEC.size - 1, "loading fake.pcap: all 1.0 MB read, sharkd finishing"),  # "all" means loaded
        (SPEC.size, "capture loaded")]


async def test_two_waits_of_one_call_stay_increasing_and_spaced(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = itertools.count(0, 100)
    async with capture(Script(load_s=5)) as workers:
        session = session_on(workers, monkeypatch, lambda: next(reads) // 300 * 300)  # 0, 0, 0, 300, ...
        request, seen = recording()
        async with session.load_progress(request):  # a first page from tshark: a short wait
            await trio.sleep(0.1)
        async with session.load_progress(request):  # then the loaded worker's answer
            await workers.call("status", None, display_filter=None, deadline=math.inf)
    check_reports(seen)
    assert seen[0][:2] == (0.0, 0) and seen[1][0] >= LOAD_PROGRESS_S and seen[-1][3] == "capture loaded"


async def test_a_failed_load_is_not_reported_as_loaded(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    async with capture(Script(load_s=2, fail_load=True)) as workers:
        session = session_on(workers, monkeypatch, lambda: 500)
        request, seen = recording()
        with pytest.raises(DiagdError):
            async with session.load_progress(request):
                await workers.call("status", None, display_filter=None, deadline=math.inf)
    check_reports(seen)
    assert seen and all(m != "capture loaded" for *_, m in seen)


async def test_the_frames_read_are_estimated_from_the_bytes_once_capinfos_has_counted_them(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = CaptureFacts("pcapng", "ether", 81_400, "38.2", None, None)
    positions = iter([250_000, 500_000])
    async with capture(Script(load_s=1)) as workers:
        session = session_on(workers, monkeypatch, lambda: next(positions, 500_000))
        monkeypatch.setattr(session.wireshark.capinfos, "known_facts",
                            lambda identity: counted if identity == SPEC.identity else None)
        request, seen = recording()
        async with session.load_progress(request):
            await workers.call("status", None, display_filter=None, deadline=math.inf)
    check_reports(seen)
    assert [m for *_, m in seen] == ["loading fake.pcap: ~20,350 of 81,400 frames, 0.2 of 1.0 MB read",
                                     "loading fake.pcap: ~40,700 of 81,400 frames, 0.5 of 1.0 MB read",
                                     "capture loaded"]


async def test_a_capture_over_the_budget_starts_no_sharkd_and_a_call_needing_one_is_told_at_once(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(load_s=5)
    session = CaptureSession(SPEC, memory_budget=estimated_rss(SPEC.size) - 1)
    refusal = session.too_big()
    assert refusal is not None and "would not fit [pcap] max_memory_mb=" in refusal.message
    assert CaptureSession(SPEC, memory_budget=estimated_rss(SPEC.size)).too_big() is None  # it fits: loaded
    async with trio.open_nursery() as nursery:
        pool = WorkerPool(nursery, SPEC, Path("/nonexistent"), max_workers=2, headroom=lambda: None,
                          launch=script.launch, cores=2)
        pool.refused = refusal
        workers = CaptureWorkers(nursery, pool, ["tshark", "-2", "-r", str(SPEC.path)], cores=Cores(2),
                                 early_numbers=script.early_numbers, early_rows=script.early_rows)
        workers.start()
        session.workers = workers
        request, seen = recording()
        with pytest.raises(DiagdError) as told:
            async with session.load_progress(request):
                await workers.call("status", None, display_filter=None, deadline=math.inf)
        assert told.value is refusal and trio.current_time() == 0  # not after a wait
        assert workers.loading and session.tshark_only is refusal and script.launched == [] and seen == []
        nursery.cancel_scope.cancel()
