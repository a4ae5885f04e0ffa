"""pcap_text_search's scan on a fake capture under virtual time: it searches every frame when the
time allows, and when the call's time runs out it stops and says so (how far, why, where to go on).
No sharkd: the capture session's frame source is replaced by synthetic trees that each take 1 s to fetch."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

from diagd.actors import _user_regex
from diagd.actors._subprocess import Head
from diagd.actors.base import Request
from diagd.actors.pcap.actor import PcapActor
from diagd.actors.pcap.answers import text as text_mod
from diagd.actors.pcap.answers import text_scan
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.pool import CaptureState
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.messages import TextSearch
from diagd.actors.pcap.shark import tree as tree_mod
from diagd.protocol.errors import DiagdError, ErrorCode

FRAMES = 20


@pytest.fixture(autouse=True)
def matching_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's regex work runs on the event loop here, not in a worker thread: with a thread the
    autojump clock (threshold 0) would jump to the call's deadline while the loop waits for it, a race
    with real time. The matching itself is the same code; only the hop is gone."""
    async def inline(fn: Callable[[], Any]) -> Any:
        await trio.lowlevel.checkpoint()
        return fn()

    monkeypatch.setattr(_user_regex, "in_thread", inline)


def frame_tree(number: int, protocol: str = "Some Protocol") -> list[dict[str, Any]]:
    epoch = f"{1000 + number}.000000{number:03d}"
    return [
        {"l": f"Frame {number}: 60 bytes on wire", "t": "proto", "f": "frame", "n": [
            {"l": f"Epoch Time: {epoch} seconds", "f": f"frame.time_epoch == {epoch}"},
            {"l": "Time delta from previous displayed frame: 1.000000001 seconds",
             "f": "frame.time_delta_displayed == 1.000000001", "g": True},
        ]},
        {"l": protocol, "t": "proto", "f": "someproto", "n": [
            {"l": "needle here" if number in (3, 17) else "hay", "f": "someproto.text == \"x\""},
        ]},
    ]


class FakeCapture(CaptureSession):
    """A capture session with its sharkd calls replaced: frame trees arrive one virtual second apart."""

    protocol = "Some Protocol"  # a layer single_pass_text never measured: no frame is ruled out

    def __init__(self) -> None:
        spec = CaptureSpec(path=Path("/nonexistent.pcap"), identity="0:0:0:0", decode_as=(), preferences=(), size=0)
        super().__init__(spec)
        self.fetched: list[int] = []
        self.passes: list[list[str]] = []

        async def run_head(argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                           records: str | None = None) -> Head:
            """A single pass (the rule-out's of a loaded capture): the -V text of the frame set asked, at
            once (these tests time sharkd's trees)."""
            self.passes.append(argv)
            await trio.lowlevel.checkpoint()
            numbers = re.search(r"frame\.number in \{([^}]*)\}", argv[argv.index("-Y") + 1])
            assert numbers is not None and limit is not None
            shown = [n for part in numbers.group(1).split(",")
                     for n in (range(int(part.split("..")[0]), int(part.split("..")[-1]) + 1))][:limit]
            lines = [line for n in shown
                     for line in (*tree_mod.render(frame_tree(n, self.protocol), sources=None).split("\n"), "")]
            return Head([], False, 0, "", "\n".join(lines))

        self.run_head = run_head

    @property
    def frame_count(self) -> int:
        return FRAMES

    async def matching(self, request: Request, display_filter: str) -> list[int]:
        return list(range(1, FRAMES + 1))

    async def trees_of(self, request: Request, numbers: Sequence[int], *, keep: bool = True) -> list[dict[str, Any]]:
        for number in numbers:
            if number not in self.trees:
                await trio.sleep(1)
                self.fetched.append(number)
                self.trees[number] = {"tree": frame_tree(number, self.protocol), "bytes": ""}
        return [self.trees[number] for number in numbers]


def search_args(**extra: Any) -> dict[str, Any]:
    return {"display_filter": "", "query": "needle", "is_regex": False, "case_sensitive": False, "budget_s": 5.0,
            "layers": (), "restrict_layers": True, "limit": None, "offset": 0, "max_matches": 50,
            "snippet_context_chars": 10, "max_bytes": 200000, **extra}


@asynccontextmanager
async def no_passes() -> AsyncIterator[None]:
    """CaptureWorkers.foreground of a stand-in pool: no background pass to stop."""
    yield


async def ask(actor: FakeCapture, **extra: Any) -> dict[str, Any]:
    pcap = PcapActor("fake", actor.spec)
    pcap.session = actor  # the actor's handler, on the fake session
    return await pcap.handle(Request(TextSearch(**search_args(**extra))))


async def test_every_frame_is_searched_when_time_allows(autojump_clock: trio.testing.MockClock) -> None:
    actor = FakeCapture()
    result = await ask(actor, stop_at=trio.current_time() + 3600)
    assert result["complete"] is True and result["stopped_because"] is None and "note" not in result
    assert result["frames_scanned"] == result["frames_total"] == FRAMES
    assert [m["frame_number"] for m in result["matches"]] == [3, 17]
    assert result["next_offset"] is None and result["has_more"] is False
    assert result["searched_frames"] == [1, FRAMES]


async def test_a_spent_time_budget_stops_the_scan_and_says_how_far_it_got(
        autojump_clock: trio.testing.MockClock) -> None:
    actor = FakeCapture()
    start = trio.current_time()
    result = await ask(actor, stop_at=start + 5.5)
    # Frames 1..6 are fetched by t=6 (the 6th started at t=5 < 5.5); the 7th would start past the budget.
    assert result["complete"] is False and result["stopped_because"] == "time_budget"
    assert result["frames_scanned"] == 6 and result["frames_total"] == FRAMES
    assert actor.fetched == list(range(1, 7)) and trio.current_time() - start == pytest.approx(6)  # none read ahead
    assert result["searched_frames"] == [1, 6] and result["next_offset"] == 6 and result["has_more"] is True
    assert [m["frame_number"] for m in result["matches"]] == [3]
    assert result["note"].startswith("INCOMPLETE: searched 6 of the 20 frames")
    assert "offset=6" in result["note"]
    # Cut short by time, the answer is not cached: the same question searches again.
    again = await ask(actor, stop_at=trio.current_time() + 3600)
    assert again["cached"] is False and again["complete"] is True
    assert [m["frame_number"] for m in again["matches"]] == [3, 17]
    # A complete answer is cached whatever moment the call had to stop by.
    third = await ask(actor, stop_at=trio.current_time() + 7200)
    assert third["cached"] is True


async def test_a_frame_sharkd_cannot_read_fails_the_search_with_its_own_error(
        autojump_clock: trio.testing.MockClock) -> None:
    """sharkd's error on a batch read ahead reaches the caller as it is, not in an exception group."""
    actor = FakeCapture()
    read = actor.trees_of

    async def failing(request: Request, numbers: Sequence[int], *, keep: bool = True) -> list[dict[str, Any]]:
        if 7 in numbers:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "sharkd died")
        return await read(request, numbers, keep=keep)

    actor.trees_of = failing  # type: ignore[method-assign]
    with pytest.raises(DiagdError, match="sharkd died"):
        await ask(actor, stop_at=trio.current_time() + 3600)


async def test_with_a_second_worker_free_two_batches_are_read_at_once(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan asks sharkd for the next batch while it searches the one it has; with a second
    worker free, for the next two (each read on its own worker: here trees of two batches come in
    parallel). The answer is the same."""
    monkeypatch.setattr(text_scan, "SCAN_BATCH", 5)
    one, two = FakeCapture(), FakeCapture()
    two.workers = SimpleNamespace(  # type: ignore[assignment]
        foreground=no_passes, state=CaptureState.LOADING, pool=SimpleNamespace(free_count=lambda: 2))
    start = trio.current_time()
    alone = await ask(one, stop_at=start + 3600)
    sequential = trio.current_time() - start
    start = trio.current_time()
    both = await ask(two, stop_at=start + 3600)
    assert sequential == pytest.approx(FRAMES) and trio.current_time() - start < 0.7 * FRAMES
    assert sorted(two.fetched) == list(range(1, FRAMES + 1))
    assert [m["frame_number"] for m in both["matches"]] == [m["frame_number"] for m in alone["matches"]] == [3, 17]


async def test_limit_and_max_matches_are_reported_as_incomplete(autojump_clock: trio.testing.MockClock) -> None:
    actor = FakeCapture()
    limited = await ask(actor, limit=5)
    assert limited["complete"] is False and limited["stopped_because"] == "limit"
    assert limited["frames_scanned"] == 5 and limited["next_offset"] == 5 and limited["match_count"] == 1
    rest = await ask(actor, offset=5)
    assert rest["complete"] is True and [m["frame_number"] for m in rest["matches"]] == [17]
    assert "skipped" in rest["note"]
    capped = await ask(actor, max_matches=1)
    assert capped["stopped_because"] == "max_matches" and capped["truncated"] is True
    # Frame 3 held the match that filled the cap: it is not counted as searched, the next call redoes it.
    assert capped["frames_scanned"] == 2 and capped["next_offset"] == 2


async def test_the_displayed_delta_is_the_one_tshark_prints_for_the_filtered_frames(
        autojump_clock: trio.testing.MockClock) -> None:
    actor = FakeCapture()
    found = await ask(actor, query="previous displayed frame: 1.000000001", offset=2)
    # Frame 3 follows frame 2 among the displayed frames: 1 s and 1 ns later, as its epoch times say.
    assert [m["frame_number"] for m in found["matches"]][:1] == [3]
    first = await ask(actor, query="previous displayed frame: 0.000000000")
    assert [m["frame_number"] for m in first["matches"]] == [1]  # nothing is displayed before frame 1


class PlainCapture(FakeCapture):
    """Frames of a layer the rules measured, with no line that may differ after a second pass."""

    protocol = "Domain Name System"


async def test_a_loaded_capture_reads_from_sharkd_only_frames_a_single_pass_does_not_rule_out(
        autojump_clock: trio.testing.MockClock) -> None:
    ruled = PlainCapture()
    result = await ask(ruled, limit=FRAMES, stop_at=trio.current_time() + 3600)
    # Frame 1 is read while the pass runs (the probe's first frame); then only the frames whose text
    # holds the needle.
    assert ruled.passes and ruled.fetched == [1, 3, 17]
    assert result["frames_ruled_out"] == FRAMES - 3 and result["complete"] is True
    # The same answer as reading every frame from sharkd (a fake never rules out "Some Protocol").
    everything = FakeCapture()
    plain = await ask(everything, limit=FRAMES, stop_at=trio.current_time() + 3600)
    assert everything.fetched == list(range(1, FRAMES + 1)) and "frames_ruled_out" not in plain
    assert [m["frame_number"] for m in result["matches"]] == [m["frame_number"] for m in plain["matches"]] == [3, 17]
    # Frame 3's "previous displayed" delta comes from frame 2's arrival time, read from the single pass.
    delta = await ask(PlainCapture(), query="previous displayed frame: 1.000000001", limit=FRAMES, offset=0)
    assert [m["frame_number"] for m in delta["matches"]][:2] == [2, 3]


class SlowPassCapture(PlainCapture):
    """A plain capture whose rule-out pass takes `pass_s` virtual seconds; `holding`: the frames whose
    text holds the needle (the rest hold hay)."""

    def __init__(self, pass_s: float, holding: set[int]) -> None:
        super().__init__()
        self.holding = holding
        self.stopped_passes = 0

        async def run_head(argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                           records: str | None = None) -> Head:
            self.passes.append(argv)
            try:
                await trio.sleep(pass_s)
            except trio.Cancelled:
                self.stopped_passes += 1
                raise
            numbers = re.search(r"frame\.number in \{([^}]*)\}", argv[argv.index("-Y") + 1])
            assert numbers is not None and numbers.group(1) == f"1..{FRAMES}"
            lines = [line for n in range(1, FRAMES + 1)
                     for line in (*tree_mod.render(tree(n, self.protocol, n in holding), sources=None).split("\n"), "")]
            return Head([], False, 0, "", "\n".join(lines))

        self.run_head = run_head

    async def trees_of(self, request: Request, numbers: Sequence[int], *, keep: bool = True) -> list[dict[str, Any]]:
        for number in numbers:
            if number not in self.trees:
                await trio.sleep(1)
                self.fetched.append(number)
                self.trees[number] = {"tree": tree(number, self.protocol, number in self.holding), "bytes": ""}
        return [self.trees[number] for number in numbers]


def tree(number: int, protocol: str, holding: bool) -> list[dict[str, Any]]:
    nodes = frame_tree(number, protocol)
    nodes[1]["n"][0]["l"] = "needle here" if holding else "hay"
    return nodes


async def test_a_dense_page_stops_the_rule_out_pass_and_reads_every_frame(
        autojump_clock: trio.testing.MockClock) -> None:
    """The probe (frames spread over the page, read while the pass runs) finds the needle in most
    frames: the pass would rule out few, so it is stopped and every frame is read, not waited for."""
    capture = SlowPassCapture(pass_s=100, holding=set(range(1, FRAMES + 1)) - {4})
    start = trio.current_time()
    result = await ask(capture, limit=FRAMES, stop_at=start + 3600)
    assert capture.stopped_passes == 1
    # The probe spreads over every other frame (1, 3, ..., 19); 6 of those (1 alone, then 5) already
    # hold the needle: the rest of the probe could not make the page sparse.
    probe = list(range(1, FRAMES + 1, FRAMES // text_scan.PROBE_FRAMES))[:1 + text_scan.PROBE_BATCH]
    assert capture.fetched == probe + [n for n in range(1, FRAMES + 1) if n not in probe]
    assert trio.current_time() - start == pytest.approx(FRAMES)  # each frame read once, the pass not waited for
    assert "frames_ruled_out" not in result and result["frames_scanned"] == FRAMES
    assert [m["frame_number"] for m in result["matches"]] == [n for n in range(1, FRAMES + 1) if n != 4]


async def test_a_sparse_page_waits_for_the_rule_out_pass_after_the_probe(
        autojump_clock: trio.testing.MockClock) -> None:
    """The probe finds the needle in few frames: the scan waits for the pass, then reads only the
    frames it did not rule out (frame 18 here; 3 was in the probe)."""
    capture = SlowPassCapture(pass_s=30, holding={3, 18})
    start = trio.current_time()
    result = await ask(capture, limit=FRAMES, stop_at=start + 3600)
    probe = list(range(1, FRAMES + 1, FRAMES // text_scan.PROBE_FRAMES))
    assert capture.passes and capture.stopped_passes == 0 and capture.fetched == [*probe, 18]
    assert trio.current_time() - start == pytest.approx(30 + 1)  # the pass, then frame 18
    assert result["frames_ruled_out"] == FRAMES - len(probe) - 1
    assert [m["frame_number"] for m in result["matches"]] == [3, 18]


async def test_a_literal_a_second_pass_could_add_is_read_from_sharkd_in_every_frame(
        autojump_clock: trio.testing.MockClock) -> None:
    capture = PlainCapture()
    result = await ask(capture, query="Answer In: 1", limit=FRAMES, stop_at=trio.current_time() + 3600)
    assert len(capture.fetched) == FRAMES  # a DNS line "[Answer In: 12]" may be added in any frame
    assert "frames_ruled_out" not in result


class LoadingCapture(FakeCapture):
    """A capture still loading whose single-pass tshark prints the frames' `-V` text after `pass_s`
    virtual seconds (the text search's early pass); sharkd's way is FakeCapture's."""

    def __init__(self, pass_s: float) -> None:
        super().__init__()

        async def run_head(argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                           records: str | None = None) -> Head:
            self.passes.append(argv)
            await trio.sleep(pass_s)
            assert records is not None and limit is not None
            shown = range(1, min(limit, FRAMES) + 1)
            lines = [line for n in shown for line in (*tree_mod.render(frame_tree(n), sources=None).split("\n"), "")]
            return Head([], limit < FRAMES, None, "", "\n".join(lines))

        self.run_head = run_head


async def test_a_capture_still_loading_is_searched_in_a_single_pass_with_marks(
        autojump_clock: trio.testing.MockClock) -> None:
    actor = LoadingCapture(pass_s=2)
    result = await ask(actor, limit=10, kinds=(), stop_at=trio.current_time() + 60)
    assert actor.passes and "-V" in actor.passes[0] and actor.fetched == []  # no sharkd tree was read
    assert result["served_by"] == "tshark (single pass while sharkd loads)" and result["exact"] is False
    assert result["frames_scanned"] == 10 and result["total_exact"] is False and result["total_at_least"] == 11
    assert [m["frame_number"] for m in result["matches"]] == [3]
    assert result["matches"][0]["provisional"] == ["line", "snippet"]  # "Some Protocol" was never measured
    assert result["cached"] is False and "next_offset" in result and result["next_offset"] == 10


async def test_a_fresh_captures_search_ends_the_head_start_after_its_answer(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """The capture's background reads (sharkd's load, sha256, the count) wait for the search's own
    matching, not only for its pass, and for its reply's way to the client (REPLY_HEAD_START_S): beside
    them that Python work and the reply ran at a fraction of a core."""
    actor = LoadingCapture(pass_s=2)
    order: list[str] = []
    mark = text_scan.take_frames

    def marking(*args: Any, **kwargs: Any) -> bool:
        order.append("marked")
        return mark(*args, **kwargs)

    monkeypatch.setattr(text_scan, "take_frames", marking)
    actor.workers = SimpleNamespace(  # type: ignore[assignment]
        foreground=no_passes, state=CaptureState.LOADING,
        end_head_start_after=lambda delay_s: order.append(f"head start over in {delay_s}"))
    await ask(actor, limit=10, kinds=(), stop_at=trio.current_time() + 60)
    assert order == ["marked", f"head start over in {text_mod.REPLY_HEAD_START_S}"]


async def test_a_single_pass_past_the_calls_time_gives_way_to_sharkds_search(
        autojump_clock: trio.testing.MockClock) -> None:
    actor = LoadingCapture(pass_s=100)
    result = await ask(actor, limit=10, kinds=(), stop_at=trio.current_time() + 5.5)
    assert actor.passes  # started, then stopped at the call's time
    assert "served_by" not in result and result["stopped_because"] == "time_budget"


class UncountedCapture(PlainCapture):
    """A loaded capture whose filter sharkd has not counted: its single pass prints the first frames
    of the filter (every frame matches) after `pass_s` virtual seconds, as `-V` text or as numbers."""

    def __init__(self, pass_s: float = 0.5) -> None:
        super().__init__()

        async def run_head(argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                           records: str | None = None) -> Head:
            self.passes.append(argv)
            await trio.sleep(pass_s)
            assert limit is not None
            if records is None:  # `-T fields -e frame.number`: `limit` lines (one more than the page)
                return Head([str(n) for n in range(1, min(limit, FRAMES) + 1)], limit <= FRAMES, None, "")
            shown = range(1, min(limit, FRAMES) + 1)
            lines = [line for n in shown
                     for line in (*tree_mod.render(frame_tree(n, self.protocol), sources=None).split("\n"), "")]
            return Head([], limit < FRAMES, None, "", "\n".join(lines))

        self.run_head = run_head

    @property
    def state(self) -> CaptureState:
        return CaptureState.READY  # loaded (a capture still loading searches the single pass's text)

    def counted(self, display_filter: str) -> int | None:
        return None  # sharkd has not counted it (matching() and page() still answer: sharkd's way, when taken)

    async def page(self, request: Request, display_filter: str, offset: int, limit: int,
                   kinds: Any = None) -> Any:
        rows = [{"number": n} for n in range(1, FRAMES + 1)][offset:offset + limit]
        return SimpleNamespace(exact=True, rows_exact=True, total=FRAMES, rows=rows)


async def test_a_filter_not_counted_takes_its_page_from_a_single_pass_and_rules_out_by_text(
        autojump_clock: trio.testing.MockClock) -> None:
    capture = UncountedCapture()
    first = await ask(capture, display_filter="someproto", kinds=(), limit=10, stop_at=trio.current_time() + 60)
    assert first["served_by"].startswith("tshark and sharkd") and capture.fetched == [3]  # the rest ruled out
    assert first["frames_ruled_out"] == 9 and first["frames_scanned"] == 10
    assert first["total_exact"] is False and first["total_at_least"] == first["frames_total"] == 11
    assert first["next_offset"] == 10 and "at least 11 match" in first["note"]
    # The same call again counts the filter (sharkd's way): the same matches, the exact total.
    again = await ask(capture, display_filter="someproto", kinds=(), limit=10, stop_at=trio.current_time() + 60)
    assert "served_by" not in again and again["frames_total"] == FRAMES
    assert [m["frame_number"] for m in again["matches"]] == [m["frame_number"] for m in first["matches"]] == [3]


async def test_a_filter_not_counted_whose_first_page_found_its_frames_runs_no_pass_for_them(
        autojump_clock: trio.testing.MockClock) -> None:
    """The filter's first page came from a single pass (CaptureWorkers kept the frame numbers it found):
    the search's page is read from them, and only the rule-out pass of those frames runs, beside the scan."""
    capture, passes = UncountedCapture(), PlainCapture()
    capture.run_head = passes.run_head  # the rule-out pass's text of the frame set it is given
    capture.workers = SimpleNamespace(  # type: ignore[assignment]
        foreground=no_passes, first_numbers=lambda flt: (list(range(1, FRAMES + 1)), False),
        pool=SimpleNamespace(holders=lambda flt: [], free_count=lambda: 1))
    found = await ask(capture, display_filter="someproto", kinds=(), limit=FRAMES, stop_at=trio.current_time() + 60)
    assert len(passes.passes) == 1 and f"frame.number in {{1..{FRAMES}}}" in passes.passes[0]
    assert capture.fetched == [1, 3, 17] and found["frames_ruled_out"] == FRAMES - 3  # frame 1: the probe's
    assert found["served_by"].startswith("tshark and sharkd") and found["frames_scanned"] == FRAMES
    assert found["total_exact"] is False and found["total_at_least"] == found["frames_total"] == FRAMES + 1
    assert [m["frame_number"] for m in found["matches"]] == [3, 17]


async def test_a_regex_on_a_filter_not_counted_takes_only_frame_numbers_from_the_pass(
        autojump_clock: trio.testing.MockClock) -> None:
    capture = UncountedCapture()
    found = await ask(capture, display_filter="someproto", kinds=(), query="nee+dle", is_regex=True, limit=5,
                      stop_at=trio.current_time() + 60)
    assert "-V" not in capture.passes[0] and "frame.number" in capture.passes[0]
    assert capture.fetched == [1, 2, 3, 4, 5] and "frames_ruled_out" not in found
    assert [m["frame_number"] for m in found["matches"]] == [3] and found["total_at_least"] == 6


async def test_a_single_pass_slower_than_half_the_call_gives_way_to_sharkd(
        autojump_clock: trio.testing.MockClock) -> None:
    capture = UncountedCapture(pass_s=40)
    start = trio.current_time()
    found = await ask(capture, display_filter="someproto", kinds=(), limit=10, stop_at=start + 60)
    assert trio.current_time() - start == pytest.approx(30 + 10)  # half the time, then 10 trees of 1 s
    assert "served_by" not in found and found["frames_total"] == FRAMES and capture.fetched == list(range(1, 11))
    assert [m["frame_number"] for m in found["matches"]] == [3]
