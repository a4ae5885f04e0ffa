"""A loaded capture's text search reading its frames from sharkd: the two-pass trees of a page read
in pipelined batches, rendered as `tshark -V` prints them and matched, within the call's time.

Beside it may run the rule-out pass of text.py (a single tshark pass ruling out frames that cannot
hold a literal); the scan first reads a probe of the page and then waits for that pass or stops it.
"""

from __future__ import annotations

import functools
import math
import re
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from diagd.actors._user_regex import Matcher
from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import SearchMatch
from diagd.actors.pcap.engine.session import CaptureSession
from diagd.actors.pcap.messages import TextSearch
from diagd.actors.pcap.shark import single_pass_text
from diagd.actors.pcap.shark import tree as tree_mod

# Frames fetched per sharkd batch at most: pipelined, so sharkd dissects while this process decodes,
# and few enough that the call's time budget is checked every few tens of milliseconds.
SCAN_BATCH = 25


@dataclass
class Scan:
    """How far a text search got."""

    matches: list[SearchMatch] = field(default_factory=list)
    used: int = 0  # snippet characters returned
    scanned: int = 0  # frames searched to their end
    without_layers: int = 0
    stopped: str | None = None
    skipped: set[int] = field(default_factory=set)  # frames ruled out: not read from sharkd
    pass_ruled_out: bool = False  # a single pass ruled out frames of the page (the reply says how many it skipped)


# The pass runs beside sharkd's reads, not before them: on a page where most frames hold the
# literal (dense user-plane traffic: TCP in GTP-U) it rules out few and costs as much as sharkd's
# trees of the whole page (measured on 200 such frames: the pass ~90 ms, sharkd's trees ~120 ms,
# one after the other 0.25 s for the peer's 0.16 s). While the pass runs the scan reads a probe of
# PROBE_FRAMES frames spread over the page from sharkd (_probe: the first alone, then PROBE_BATCH at
# a time; a pass that ends meanwhile is taken at once); when at least DENSE of them hold the query
# the pass is stopped and every frame is read, else the scan waits for the pass and reads only the
# frames it did not rule out. A frame read before the pass ended is searched in its two-pass text.
PROBE_FRAMES = 10
PROBE_BATCH = 5
DENSE = 0.5


class Beside:
    """The rule-out pass of a loaded capture's search, run beside the scan: `ruled_out` fills when it
    ends (`done`); the scan stops it (`scope`) once it is no longer worth waiting for."""

    def __init__(self) -> None:
        self.ruled_out: dict[int, int] = {}
        self.done = trio.Event()
        self.scope = trio.CancelScope()
        self.probed = self.held = 0  # frames the scan read from sharkd meanwhile, of them holding the query

    async def run(self, rule_out: Callable[[], Awaitable[dict[int, int]]]) -> None:
        """Run the pass (`rule_out`: the frames it rules out, each with its arrival time in ns)."""
        try:
            with self.scope:
                self.ruled_out.update(await rule_out())
        finally:
            self.done.set()

    def decided(self, probe: int) -> bool:
        """Whether the rest of a probe of `probe` frames could not change the outcome."""
        need = DENSE * probe
        return self.held >= need or self.held + (probe - self.probed) < need

    async def wait_or_stop(self) -> None:
        """Once the probe is read (or decided, or the pass has ended): a sparse page waits for the
        pass, a dense one (or one without a probe: the call's time is up) stops it."""
        if not self.done.is_set() and self.held < DENSE * self.probed:
            await self.done.wait()
        self.scope.cancel()


async def scan(capture: CaptureSession, request: Request, m: TextSearch, numbers: Sequence[int], canonical: set[str],
                matcher: Matcher, ruled_out: dict[int, int], beside: Beside | None = None) -> Scan:
    """Search the page's frames' two-pass text read from sharkd, except frames `ruled_out` (they
    count as searched, without a match; their arrival time keeps the next frame's time delta).
    `beside`: the rule-out pass still running, which fills `ruled_out` when it ends: the scan first
    reads a probe of the page's frames meanwhile (_probe), then waits for it or stops it."""
    scan = Scan()
    candidates = list(numbers[m.offset:] if m.limit is None else numbers[m.offset:m.offset + m.limit])
    previous_ns = None
    if m.offset and candidates:  # the frame displayed before the first one searched
        previous_ns = tree_mod.epoch_ns((await capture.tree(request, numbers[m.offset - 1], keep=False))["tree"])
    fetched: dict[int, dict[str, Any]] = {}  # trees read, not searched yet
    per_frame_s = math.inf
    if beside is not None:
        per_frame_s = await _probe(capture, request, m, candidates, matcher, beside, fetched)
        await beside.wait_or_stop()
    failed: Exception | None = None
    async with trio.open_nursery() as nursery:
        try:
            await _scan_batches(m, scan, candidates, canonical, matcher, ruled_out, fetched, capture, request,
                                nursery, previous_ns, per_frame_s)
        except Exception as exc:  # raised below as it is, not in the nursery's exception group
            failed = exc
    if failed is not None:
        raise failed
    if scan.stopped is None and m.offset + scan.scanned < len(numbers):
        scan.stopped = "limit"
    return scan


class _Read:
    """One batch of sharkd trees asked ahead of the scan: read to its end whatever happens (a sharkd
    left mid-request is killed), taken by the scan when it gets there."""

    def __init__(self, capture: CaptureSession, request: Request, nursery: trio.Nursery, batch: list[int]) -> None:
        self.batch = batch
        self.asked_at = trio.current_time()
        self._done = trio.Event()
        self._trees: list[dict[str, Any]] = []
        self._error: Exception | None = None
        nursery.start_soon(self._read, capture, request)

    async def _read(self, capture: CaptureSession, request: Request) -> None:
        try:
            self._trees = await capture.trees_of(request, self.batch, keep=False)
        except Exception as exc:  # the scan's when it takes the batch (a batch never taken: nobody's)
            self._error = exc
        finally:
            self._done.set()

    async def take(self) -> list[dict[str, Any]]:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._trees


def _free_workers(capture: CaptureSession) -> int:
    """The capture's sharkd workers loaded and free now."""
    return capture.workers.pool.free_count() if capture.workers is not None else 0


def _next_batch(m: TextSearch, candidates: list[int], start: int, ruled_out: dict[int, int],
                fetched: dict[int, dict[str, Any]], per_frame_s: float, now: float) -> tuple[int, list[int]]:
    """(end, frames to read) of the scan's batch from `start`: as many frames as the time left is
    expected to read (one before any was timed), so the budget is kept as closely as frame by frame."""
    size = SCAN_BATCH
    if m.stop_at is not None and per_frame_s > 0:
        size = max(1, min(SCAN_BATCH, int((m.stop_at - now) / per_frame_s)))
    batch: list[int] = []
    end = start
    while end < len(candidates) and len(batch) < size:
        if candidates[end] not in ruled_out and candidates[end] not in fetched:
            batch.append(candidates[end])
        end += 1
    return end, batch


async def _scan_batches(m: TextSearch, scan: Scan, candidates: list[int], canonical: set[str], matcher: Matcher,
                        ruled_out: dict[int, int], fetched: dict[int, dict[str, Any]], capture: CaptureSession,
                        request: Request, nursery: trio.Nursery, previous_ns: int | None, per_frame_s: float) -> None:
    """_scan's batches, each one's trees asked while the one before it is searched (so sharkd
    dissects while this process renders and matches); two ahead where a second worker is free."""
    start = planned_to = 0
    ahead: deque[tuple[int, _Read | None]] = deque()  # (end, its read) of the batches planned
    while start < len(candidates):
        now = trio.current_time()
        if m.stop_at is not None and now >= m.stop_at:
            scan.stopped = "time_budget"
            break
        # The batches ahead: one, or two when a worker is free for the second (taking a free one
        # starts no worker: a pool grows only for a call that would wait).
        depth = 2 if _free_workers(capture) >= (1 if ahead else 2) else 1
        while planned_to < len(candidates) and len(ahead) < depth:
            end, batch = _next_batch(m, candidates, planned_to, ruled_out, fetched, per_frame_s, now)
            ahead.append((end, _Read(capture, request, nursery, batch) if batch else None))
            planned_to = end
        end, read = ahead.popleft()
        if read is not None:
            fetched.update(zip(read.batch, await read.take(), strict=True))
            per_frame_s = (trio.current_time() - read.asked_at) / len(read.batch)
        chunk = candidates[start:end]
        start = end
        now = trio.current_time()
        if planned_to < len(candidates) and not ahead and (m.stop_at is None or now < m.stop_at):
            end, batch = _next_batch(m, candidates, planned_to, ruled_out, fetched, per_frame_s, now)
            ahead.append((end, _Read(capture, request, nursery, batch) if batch else None))
            planned_to = end
        texts = []
        for number in chunk:
            answer = fetched.pop(number, None)
            if answer is None:  # ruled out
                texts.append("")
                previous_ns = ruled_out[number]
                scan.skipped.add(number)
                continue
            nodes = tree_mod.displayed(answer["tree"], previous_ns)
            previous_ns = tree_mod.epoch_ns(answer["tree"])
            if canonical and m.restrict_layers:
                nodes = tree_mod.protocol_nodes(nodes, canonical)
                if not nodes:
                    scan.without_layers += 1
            texts.append(tree_mod.render(nodes, sources=tree_mod.frame_sources(answer)))
        left = m.max_matches - len(scan.matches)
        found = await matcher.run(functools.partial(spans_of, matcher, chunk, texts, left))
        if not take_frames(m, scan, chunk, texts, found):
            break


async def _probe(capture: CaptureSession, request: Request, m: TextSearch, candidates: list[int], matcher: Matcher,
                 beside: Beside, fetched: dict[int, dict[str, Any]]) -> float:
    """While the rule-out pass runs, read PROBE_FRAMES frames spread over the page (a page's frames
    are not alike: its first ones may be a few pings before the TCP traffic), the first alone and then
    PROBE_BATCH at a time, until the pass ends or the rest could not change the outcome (5 of 6 without
    the query: sparse); count those whose text holds the query (`beside`).
    The trees stay in `fetched` for the scan. Returns the seconds a frame took (inf: none read)."""
    count = min(PROBE_FRAMES, len(candidates))
    probe = list(dict.fromkeys(candidates[i * len(candidates) // count] for i in range(count))) if count else []
    at, per_frame_s = 0, math.inf
    while at < len(probe) and not beside.done.is_set() and not beside.decided(len(probe)):
        now = trio.current_time()
        if m.stop_at is not None and now >= m.stop_at:
            break
        batch = probe[at:at + (PROBE_BATCH if at else 1)]
        at += len(batch)
        trees = await capture.trees_of(request, batch, keep=False)
        per_frame_s = (trio.current_time() - now) / len(batch)
        fetched.update(zip(batch, trees, strict=True))
        # Their "previous displayed" delta aside (the scan renders them in order): a count only.
        texts = [tree_mod.render(tree["tree"], sources=tree_mod.frame_sources(tree)) for tree in trees]
        found = await matcher.run(functools.partial(spans_of, matcher, batch, texts, 1))
        beside.probed += len(batch)
        beside.held += sum(1 for spans in found if spans)
    return per_frame_s


def take_frames(m: TextSearch, scan: Scan, numbers: list[int], texts: list[str],
                 found: list[list[tuple[int, int]]], *, marked: bool = False) -> bool:
    """Take the frames' matches in order; False once the scan stopped (max_matches, max_bytes: that
    frame may hold more matches, so it does not count as searched). `marked`: text of a single pass,
    each match marked with what a second pass may change (single_pass_text)."""
    for number, text, spans in zip(numbers, texts, found, strict=True):
        before = len(scan.matches)
        _take_matches(m, scan, number, text, spans)
        if marked and len(scan.matches) > before:
            lines = single_pass_text.Lines(text)
            for match, (start, end) in zip(scan.matches[before:], spans, strict=False):
                on_line = lines.may_differ(start) or lines.may_differ(max(start, end - 1))
                match["provisional"] = ["line", "snippet"] if on_line else ["snippet"]
        if scan.stopped:
            return False
        scan.scanned += 1
    return True


def spans_of(matcher: Matcher, numbers: list[int], texts: list[str], limit: int) -> list[list[tuple[int, int]]]:
    """Each text's first `limit` matches (one thread hop for a whole batch)."""
    return [matcher.spans(text, number, limit) for number, text in zip(numbers, texts, strict=True)]


def _take_matches(m: TextSearch, scan: Scan, number: int, text: str, spans: list[tuple[int, int]]) -> None:
    for m_start, m_end in spans:
        start, end = max(0, m_start - m.snippet_context_chars), min(len(text), m_end + m.snippet_context_chars)
        line_start = text.rfind("\n", 0, m_start) + 1
        line_end = text.find("\n", m_end)
        snippet = re.sub(r"\n[ ]+", "\n", text[start:end])  # indentation costs tokens, not meaning
        scan.used += len(snippet)
        scan.matches.append({"frame_number": number, "match": text[m_start:m_end],
                             "line": text[line_start:line_end if line_end >= 0 else None].strip(),
                             "snippet": snippet})
        if len(scan.matches) >= m.max_matches or scan.used >= m.max_bytes:
            scan.stopped = "max_matches" if len(scan.matches) >= m.max_matches else "max_bytes"
            return
