"""Frames as the text `tshark -V` prints: pcap_frame_detail's trees and pcap_text_search's scan.

`detail` shapes trees the actor fetched (with the field catalogue); `text_search` reads frame trees
through the session's `tree` (session.py) as it scans, so that it can stop when the call's time is up.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from collections.abc import Sequence
from typing import Any, overload

import structlog
import trio

from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.base import Request
from diagd.actors.pcap.answer_types import DetailAnswer, DetailFrame, SearchAnswer
from diagd.actors.pcap.answers import text_scan
from diagd.actors.pcap.answers.text_scan import Scan, spans_of
from diagd.actors.pcap.engine.passes import REPLY_HEAD_START_S
from diagd.actors.pcap.engine.pool import CaptureState
from diagd.actors.pcap.engine.session import MAX_FILTER_CHARS, CaptureSession, check_length
from diagd.actors.pcap.messages import Detail, TextSearch
from diagd.actors.pcap.shark import single_pass_text
from diagd.actors.pcap.shark import tree as tree_mod
from diagd.actors.pcap.shark.single_pass_text import FrameText
from diagd.actors.pcap.shark.wireshark import Catalogue
from diagd.actors.pcap.warm import first_page
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")


def resolve_layers(cat: Catalogue, layers: tuple[str, ...]) -> dict[str, str | None]:
    """Each requested layer -> its protocol filter name (either spelling), or None when Wireshark
    has no such protocol."""
    return {name: cat.resolve_layer(name) for name in layers}


def layer_error(unknown: list[str], present: list[str], where: str, **details: Any) -> DiagdError:
    close = {name: difflib.get_close_matches(name.lower().replace("_", "-"), present, n=3, cutoff=0.5)
             for name in unknown}
    return DiagdError(ErrorCode.INVALID_ARGUMENT,
                      f"layer(s) {', '.join(map(repr, unknown))} not in {where}; its layers are: "
                      f"{', '.join(present) or 'none'}", layers_present=present, did_you_mean=close, **details)


def detail(cat: Catalogue, message: Detail, answers: dict[int, dict[str, Any]]) -> DetailAnswer:
    """The text of `message`'s frames from their trees (`answers`: frame number -> sharkd's answer,
    fetched by the actor) and the field catalogue: it shapes them, fetching nothing."""
    frame_numbers, layers, restrict_layers, max_bytes = (message.frame_numbers, message.layers,
                                                     message.restrict_layers, message.max_bytes)
    verbosity = message.verbosity
    full = verbosity == "full"
    # The text is what `tshark -Y "frame.number in {...}" -V` prints: those frames are the
    # displayed ones, so each one's "previous displayed frame" is the one before it among them.
    ordered = sorted(set(frame_numbers))
    epochs = [tree_mod.epoch_ns(answers[n]["tree"]) for n in ordered]
    trees = {n: tree_mod.displayed(answers[n]["tree"], epochs[i - 1] if i else None) for i, n in enumerate(ordered)}
    present = {n: tree_mod.layer_names(trees[n]) for n in ordered}
    wanted = resolve_layers(cat, layers)
    anywhere = {layer for names in present.values() for layer in names}
    unknown = [name for name, proto in wanted.items() if proto is None or proto not in anywhere]
    if unknown:
        # A layer no requested frame has would give empty text: say so, and what is there.
        first = ordered[0]
        where = f"frame {first}" if len(ordered) == 1 else f"frames {', '.join(map(str, ordered))}"
        by_frame = {"layers_by_frame": {str(n): present[n] for n in ordered}} if len(ordered) > 1 else {}
        raise layer_error(unknown, present[first] if len(ordered) == 1 else sorted(anywhere), where,
                               **by_frame)
    canonical = {proto for proto in wanted.values() if proto is not None}
    frames: list[DetailFrame] = []
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
        entry: _ShownFrame = {"frame_number": number, "protocols": tree_mod.top_protocols(trees[number]),
                                 "layers_found": None, "text": text, "truncated": truncated}
        if canonical:
            entry["layers_found"] = [str(n["f"]) for n in tree_mod.protocol_nodes(trees[number], canonical)]
            missing = [name for name, proto in wanted.items() if proto not in present[number]]
            if missing:
                entry["layers_missing"] = missing
                entry["layers_present"] = present[number]
        frames.append(entry)
    return {"frames": frames, "truncated": any(f["truncated"] for f in frames),
            "layers_resolved": {k: v for k, v in wanted.items() if v != k} or None}


class _ShownFrame(DetailFrame, total=False):
    """A frame's text, and which asked layers it lacks (pcap_frame_detail's rows name more than DetailFrame)."""

    layers_missing: list[str]
    layers_present: list[str]


# A search without `limit` asks for every frame: on a capture still loading it waits for sharkd's
# load (a fraction of a second up to a few MB), except on a bigger one, where it searches the first
# EARLY_SEARCH_FRAMES frames of a single pass first and says where to go on.
EARLY_SEARCH_FRAMES = 500
EARLY_SEARCH_MIN_BYTES = 8 * 2**20
async def text_search(capture: CaptureSession, request: Request, message: TextSearch) -> SearchAnswer:
    """Search every frame matching the filter (from `offset`, at most `limit` when given) in the
    text `tshark -Y <filter> -V` prints, until done or until `stop_at` (trio time, set by the
    handler inside the call's timeout). A search cut short says how far it got and why."""
    m = message
    pattern = await compile_in_thread(m.query, literal=not m.is_regex, case_sensitive=m.case_sensitive)
    if not m.layers and capture.state is CaptureState.LOADING and (
            m.limit is not None or capture.spec.size > EARLY_SEARCH_MIN_BYTES) and first_page.loading_safe(
            m.display_filter, m.offset, m.limit or EARLY_SEARCH_FRAMES, m.kinds):
        # Bounded by the call's time: a filter matching only far into a big file reads it to there;
        # past the time, the search goes sharkd's way, which says how far it got.
        with trio.move_on_at(m.stop_at if m.stop_at is not None else math.inf):
            return await _search_while_loading(capture, m, Matcher(pattern, m.budget_s, unit="frame"))
    if (not m.layers and m.limit is not None and capture.state is not CaptureState.LOADING
            and first_page.loading_safe(m.display_filter, m.offset, m.limit, m.kinds)
            and capture.first_before_count("search", m.display_filter)):
        # A filter sharkd has not counted (a new filter's first page came from a single pass; its
        # sharkd pass may still run): the page's frames come from a single pass too.
        before_count = await _search_before_count(capture, request, m, Matcher(pattern, m.budget_s, unit="frame"))
        if before_count is not None:
            return before_count
    numbers = await _numbers(capture, request, m)
    wanted: dict[str, str | None] = {}
    if m.layers:
        assert capture.cat is not None  # loaded when the session started
        wanted = resolve_layers(capture.cat, m.layers)
    if wanted:
        in_capture = list((await capture.analysed(request)).get("protocols", []))
        unknown = [name for name, proto in wanted.items() if proto is None or proto not in in_capture]
        if unknown:
            raise layer_error(unknown, in_capture, "this capture")
    canonical = {proto for proto in wanted.values() if proto is not None}
    matcher = Matcher(pattern, m.budget_s, unit="frame")
    scan = await _scan_ruling_out(capture, request, m, numbers, canonical, matcher, rule_out=not wanted)
    result = _search_result(m, numbers, scan, bool(canonical))
    if scan.pass_ruled_out:
        result["frames_ruled_out"] = _count_ruled_out(m, numbers, scan)
    return result


# A search for a literal on a loaded capture first reads the page's frames from one single tshark
# pass (warm: tens of milliseconds for hundreds of frames) and rules out each frame whose
# single-pass text does not hold the literal and cannot gain it in a second pass
# (single_pass_text.cannot_gain); only the others are read from sharkd as two-pass trees (~2 ms
# each). The pass also dissects, without printing, every frame before the page: worth it while
# that costs less than half of what sharkd would (measured: ~12 us a frame passed over, ~2 ms a
# tree), so the page's last frame must be within RULE_OUT_REACH_PER_FRAME frames per page frame.
RULE_OUT_MIN_FRAMES = 20
RULE_OUT_MAX_FRAMES = 1000
RULE_OUT_REACH_PER_FRAME = 80
_EPOCH = re.compile(r"^    Epoch Time: (\d+\.\d+) seconds$", re.MULTILINE)


def _rule_out_set(capture: CaptureSession, m: TextSearch, numbers: Sequence[int]) -> tuple[str, int, int] | None:
    """(the pass's display filter, frames it shows, frames of the page) where ruling out applies and
    may pay; else None."""
    page = list(numbers[m.offset:] if m.limit is None else numbers[m.offset:m.offset + m.limit])
    if (not _literal(m) or not RULE_OUT_MIN_FRAMES <= len(page) <= RULE_OUT_MAX_FRAMES
            or page[-1] > RULE_OUT_REACH_PER_FRAME * len(page)):
        return None
    # The frame shown before the page too, so that each page frame's "previous displayed" is sharkd's.
    shown = list(numbers[max(0, m.offset - 1):m.offset + len(page)])
    # And the frame after the page, whose first line stops the pass (else it would read to the end).
    after = [shown[-1] + 1] if shown[-1] < capture.frame_count else []
    frame_set = f"frame.number in {{{_ranges(shown + after)}}}"
    if len(frame_set) > MAX_FILTER_CHARS:
        return None
    return frame_set, len(shown), len(page)


async def _scan_ruling_out(capture: CaptureSession, request: Request, m: TextSearch, numbers: Sequence[int],
                           canonical: set[str], matcher: Matcher, *, rule_out: bool) -> Scan:
    """`_scan`, with the rule-out pass beside it where that applies (`rule_out` and _rule_out_set)."""
    if not rule_out or _rule_out_set(capture, m, numbers) is None:
        return await text_scan.scan(capture, request, m, numbers, canonical, matcher, {})
    failed: Exception | None = None
    async with trio.open_nursery() as nursery:
        beside = text_scan.Beside()
        nursery.start_soon(beside.run, functools.partial(_rule_out, capture, m, numbers, matcher))
        try:
            scan = await text_scan.scan(capture, request, m, numbers, canonical, matcher, beside.ruled_out, beside)
        except Exception as exc:  # raised below as it is, not in the nursery's exception group
            failed = exc
        beside.scope.cancel()  # a pass still running is not needed any more
    if failed is not None:
        raise failed
    scan.pass_ruled_out = bool(beside.ruled_out)
    return scan


async def _rule_out(capture: CaptureSession, m: TextSearch, numbers: Sequence[int], matcher: Matcher) -> dict[int, int]:
    """Frames of the page that cannot hold the query (a literal), each with its arrival time (ns,
    the next frame's "previous displayed" time): {} where the way does not apply or does not pay."""
    found = _rule_out_set(capture, m, numbers)
    if found is None:
        return {}
    frame_set, shown_count, page_count = found
    shown = list(numbers[max(0, m.offset - 1):m.offset + page_count])
    assert len(shown) == shown_count
    with trio.move_on_at(_half_left(m)):
        try:
            frames, _ = await first_page.early_text(capture.cold_argv(), frame_set, len(shown), run=capture.run_head)
        except DiagdError as exc:  # the pass failed (tshark killed, the file replaced): sharkd's way
            log.warning("single pass to rule out frames failed", why=exc.message)
            return {}
        if [frame.number for frame in frames] != shown:  # the frames sharkd's filter matched, or not at all
            log.warning("single pass printed other frames than sharkd's page", filter=m.display_filter)
            return {}
        return await _ruled_out(m, frames[len(shown) - page_count:], matcher)
    return {}


async def _ruled_out(m: TextSearch, page: list[FrameText], matcher: Matcher) -> dict[int, int]:
    """Of the page's frames (their single-pass text), those ruled out: plain, no layer that may gain
    the literal, arrival time read, and without the literal; each with its arrival time (ns)."""
    if not _literal(m):
        return {}
    times: dict[int, int] = {}
    may_gain = single_pass_text.layers_that_may_gain(m.query, m.case_sensitive)  # once for the page's frames
    for frame in page:
        epoch = _EPOCH.search(frame.text)
        if epoch and single_pass_text.cannot_gain(frame.text, may_gain):
            times[frame.number] = tree_mod.seconds_to_ns(epoch.group(1))
    if not times:
        return {}
    texts = {frame.number: frame.text for frame in page}
    candidates = list(times)
    found = await matcher.run(functools.partial(spans_of, matcher, candidates, [texts[n] for n in candidates], 1))
    return {number: times[number] for number, spans in zip(candidates, found, strict=True) if not spans}


def _literal(m: TextSearch) -> bool:
    """A query frames can be ruled out for: a literal within one line."""
    return not m.is_regex and "\n" not in m.query


def _count_ruled_out(m: TextSearch, numbers: Sequence[int], scan: Scan) -> int:
    """How many of the frames searched were ruled out, not read from sharkd (the reply's frames_ruled_out)."""
    return sum(1 for n in numbers[m.offset:m.offset + scan.scanned] if n in scan.skipped)


def _half_left(m: TextSearch) -> float:
    """Half the call's time left (trio time): a single pass that may pay is bounded by it."""
    return math.inf if m.stop_at is None else trio.current_time() + (m.stop_at - trio.current_time()) / 2


async def _search_before_count(capture: CaptureSession, request: Request, m: TextSearch,
                               matcher: Matcher) -> SearchAnswer | None:
    """A page of a filter sharkd has not counted: its frames (and the one before it) from one
    early-stopping single pass of the filter (single-pass safe: the frames are the two-pass ones),
    those that cannot hold the literal ruled out by their text, the rest searched in sharkd's
    two-pass trees, so every match is exact; the total is a lower bound until sharkd counts the
    filter (the same call again). None when the pass shows no frame at the offset, fails or runs past
    half the call's time: sharkd's way."""
    assert m.limit is not None
    check_length(m.display_filter)
    known = capture.workers.first_numbers(m.display_filter) if capture.workers is not None else None
    if known is not None and (known[1] or len(known[0]) >= m.offset + m.limit) and len(known[0]) > m.offset:
        # The filter's first page came from a single pass that found these frames: the page's frames
        # are known without another; the rule-out pass runs beside sharkd's reads as on a counted filter.
        found, complete = known
        window = Window(len(found) if complete else len(found) + 1, 0, found)
        scan = await _scan_ruling_out(capture, request, m, window, set(), matcher, rule_out=True)
        return _before_count_result(m, window, scan, complete)
    numbers: Window | None = None
    ruled_out: dict[int, int] = {}
    complete = False
    # The pass within half the call's time (past it, or failing, sharkd's way: it also says why a
    # filter is wrong); sharkd's reads after it are bounded by the call's own time, as always.
    with trio.move_on_at(_half_left(m)):
        try:
            if not _literal(m):  # nothing to rule out: the frame numbers are enough
                found, complete = await first_page.early_numbers(capture.cold_argv(), m.display_filter,
                                                                 m.offset + m.limit, run=capture.run_head)
            else:
                frames, complete = await first_page.early_text(capture.cold_argv(), m.display_filter,
                                                               m.offset + m.limit, run=capture.run_head)
                found = [frame.number for frame in frames]
                ruled_out = await _ruled_out(m, frames[m.offset:], matcher)
        except DiagdError as exc:
            log.warning("single pass of a filter not counted yet failed", why=exc.message)
            return None
        numbers = Window(len(found) if complete else len(found) + 1, 0, found)
    if numbers is None or len(numbers.numbers) <= m.offset:
        return None
    scan = await text_scan.scan(capture, request, m, numbers, set(), matcher, ruled_out)
    scan.pass_ruled_out = bool(ruled_out)
    return _before_count_result(m, numbers, scan, complete)


def _before_count_result(m: TextSearch, numbers: Window, scan: Scan, complete: bool) -> SearchAnswer:
    """The reply of a search whose page came from a single pass before sharkd counted the filter."""
    seen = len(numbers)
    result = _search_result(m, numbers, scan, False)
    result.update({"total_exact": complete,
                   "served_by": "tshark and sharkd (the page's frames from a single pass before sharkd's count, "
                                "their text from sharkd's two passes)"})
    if scan.pass_ruled_out:
        result["frames_ruled_out"] = _count_ruled_out(m, numbers, scan)
    if not complete:
        result["total_at_least"] = seen
        if scan.stopped:
            result["note"] = _lower_bound_note(m, scan, seen, "sharkd has not counted them yet")
    return result


def _lower_bound_note(m: TextSearch, scan: Scan, seen: int, why_bound: str, why_stopped: str | None = None) -> str:
    """The note of a search stopped before the end when the filter's total is a lower bound."""
    why_stopped = why_stopped or _WHY[scan.stopped or "limit"].format(m=m)
    return (f"INCOMPLETE: searched {scan.scanned} frames matching the filter from offset {m.offset} (at least "
            f"{seen} match; {why_bound}), then stopped because {why_stopped}; "
            f"frames not searched may match. Continue with offset={m.offset + scan.scanned}")


def _ranges(numbers: list[int]) -> str:
    """Ascending frame numbers as a display filter's set: "1,3..5,9"."""
    parts, start = [], 0
    for i in range(1, len(numbers) + 1):
        if i == len(numbers) or numbers[i] != numbers[i - 1] + 1:
            first, last = numbers[start], numbers[i - 1]
            parts.append(str(first) if first == last else f"{first}..{last}")
            start = i
    return ",".join(parts)


class Window(Sequence[int]):
    """The numbers of the frames a filter matches, known only from index `start` on (the frame
    shown before the page, and the page): len() is the filter's total; an index outside is a bug."""

    def __init__(self, total: int, start: int, numbers: list[int]) -> None:
        self.total, self.start, self.numbers = total, start, numbers

    def __len__(self) -> int:
        return self.total

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            first, stop, step = index.indices(self.total)
            if step != 1 or (first < stop and not self.start <= first <= stop <= self.start + len(self.numbers)):
                raise IndexError(f"frames {first}..{stop} are outside the window {self.start}..+{len(self.numbers)}")
            return self.numbers[first - self.start:stop - self.start] if first < stop else []
        if not self.start <= index < self.start + len(self.numbers):
            raise IndexError(f"frame {index} is outside the window {self.start}..+{len(self.numbers)}")
        return self.numbers[index - self.start]


async def _numbers(capture: CaptureSession, request: Request, m: TextSearch) -> Sequence[int]:
    """The frames the filter matches: all of them (sharkd's list, cached), or for a page of a
    filter a worker holds with its total known, only the page and the frame before it (sharkd's
    `frames` with skip and limit: milliseconds where the whole list of thousands takes ~0.25 s)."""
    cached = capture.filters.get(m.display_filter)
    if cached is not None or m.limit is None or not m.display_filter:
        return cached if cached is not None else await capture.matching(request, m.display_filter)
    start = max(0, m.offset - 1)
    page = await capture.page(request, m.display_filter, start, m.limit + m.offset - start, m.kinds)
    if not (page.exact and page.rows_exact):  # a first page answered early: its total is a lower bound
        return await capture.matching(request, m.display_filter)
    return Window(page.total, start, [int(row["number"]) for row in page.rows])


async def _search_while_loading(capture: CaptureSession, m: TextSearch, matcher: Matcher) -> SearchAnswer:
    """The search over the text of a single early-stopping tshark pass, beside the load of a fresh
    capture (the filter is single-pass safe, so the frames are the two-pass ones). Lines a second
    pass may print otherwise (single_pass_text) are marked where a match is on one; a search
    without `limit` (of a capture over 8 MiB) covers the first EARLY_SEARCH_FRAMES frames and says where to go on."""
    check_length(m.display_filter)
    limit = m.limit if m.limit is not None else EARLY_SEARCH_FRAMES
    frames, complete = await first_page.early_text(capture.cold_argv(), m.display_filter, m.offset + limit,
                                                   run=capture.run_head)
    try:
        return await _searched_while_loading(m, matcher, frames, complete, limit)
    finally:
        # Only once the answer is on its way: sharkd's load, the file's sha256 and capinfos' count (a
        # core each) took the cores this search's matching and marking and its reply's way to the
        # client need (hundreds of matches: tens of ms alone, up to three times that beside them).
        if capture.workers is not None:
            capture.workers.end_head_start_after(REPLY_HEAD_START_S)


async def _searched_while_loading(m: TextSearch, matcher: Matcher, frames: list[FrameText], complete: bool,
                                  limit: int) -> SearchAnswer:
    """_search_while_loading's answer from the single pass's frames."""
    scan = Scan()
    wanted = frames[m.offset:]
    texts = [frame.text for frame in wanted]
    numbers = [frame.number for frame in wanted]
    found = await matcher.run(functools.partial(spans_of, matcher, numbers, texts, m.max_matches))
    text_scan.take_frames(m, scan, numbers, texts, found, marked=True)
    seen = len(frames) if complete else len(frames) + 1
    if scan.stopped is None and not (complete and m.offset + scan.scanned >= len(frames)):
        scan.stopped = "limit"
    result = _search_result(m, list(range(seen)), scan, False)
    searched = numbers[:scan.scanned]
    result["searched_frames"] = [searched[0], searched[-1]] if searched else None
    result.update({"total_exact": complete, "exact": False, "served_by": "tshark (single pass while sharkd loads)"})
    if not complete:
        result["total_at_least"] = seen
        result.pop("note", None)
        if scan.stopped:
            why = None
            if scan.stopped == "limit" and m.limit is None:
                why = f"a search without limit covers the first {limit} frames while the capture loads"
            result["note"] = _lower_bound_note(m, scan, seen, "the capture is still loading", why)
    result["note"] = (f"{result['note']}. " if "note" in result else "") + (
        "Searched the text a single tshark pass prints while sharkd loads the capture: the frames are exact; "
        "a line marked provisional (and any snippet) may read otherwise after the full pass, which also adds "
        "lines that link to later frames ([Answer In: N], [Reassembled PDU in frame: N], ...); the same call "
        "once the capture is loaded searches the two-pass text.")
    return result


_WHY = {"time_budget": "the call's time budget was spent",
        "limit": "limit={m.limit} frames were searched",
        "max_matches": "max_matches={m.max_matches} matches were found",
        "max_bytes": "the snippets reached max_bytes={m.max_bytes}"}


def _search_result(m: TextSearch, numbers: Sequence[int], scan: Scan, by_layers: bool) -> SearchAnswer:
    offset, scanned, stopped = m.offset, scan.scanned, scan.stopped
    searched = numbers[offset:offset + scanned]
    result: SearchAnswer = {
        "frames_total": len(numbers), "frames_scanned": scanned, "offset": offset,
        "complete": stopped is None,
        "stopped_because": stopped,
        "searched_frames": [searched[0], searched[-1]] if searched else None,
        "next_offset": offset + scanned if stopped else None,
        "matches": scan.matches, "match_count": len(scan.matches),
        "truncated": stopped in ("max_matches", "max_bytes"),
        "has_more": stopped is not None,
    }
    if by_layers:
        result["frames_without_layers"] = scan.without_layers
    if stopped:
        why = _WHY[stopped].format(m=m)
        result["note"] = (f"INCOMPLETE: searched {scanned} of the {len(numbers) - offset} frames matching the "
                          f"filter from offset {offset} ({len(numbers)} in all), then stopped because {why}; "
                          f"frames not searched may match. Continue with offset={offset + scanned}.")
    elif not len(numbers):
        result["note"] = ("no frame matches the filter: nothing to search (pcap_frames_by_filter with it says which "
                          "of its protocols the capture has)" if m.display_filter else
                          "the capture holds no frames: nothing to search")
    elif offset >= len(numbers):
        result["note"] = (f"offset {offset} is past the last of the {len(numbers)} frames matching the filter: "
                          f"nothing to search (a search starts at an offset below {len(numbers)})")
    elif offset:
        result["note"] = f"searched every frame from offset {offset}; the {offset} frames before it were skipped"
    return result
