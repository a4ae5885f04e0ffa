"""Frames as the text `tshark -V` prints: pcap_frame_detail's trees and pcap_text_search's scan.

`detail` shapes trees the actor fetched (with the field catalogue); `text_search` reads frame trees
through the session's `tree` (session.py) as it scans, so that it can stop when the call's time is up.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, field
from typing import Any

import trio

from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.base import Request
from diagd.actors.pcap import tree as tree_mod
from diagd.actors.pcap.messages import Detail, TextSearch
from diagd.actors.pcap.session import CaptureSession
from diagd.actors.pcap.wireshark import Catalogue
from diagd.protocol.errors import DiagdError, ErrorCode


def displayed(tree: list[tree_mod.Node], previous_ns: int | None) -> list[tree_mod.Node]:
    """The frame's tree as `tshark -Y` shows it when the frame displayed before it arrived at
    `previous_ns` (None: it is the first one displayed)."""
    now = tree_mod.epoch_ns(tree)
    delta = now - previous_ns if now is not None and previous_ns is not None else 0
    return tree_mod.with_displayed_delta(tree, delta)


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


def detail(cat: Catalogue, message: Detail, answers: dict[int, dict[str, Any]]) -> dict[str, Any]:
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
    trees = {n: displayed(answers[n]["tree"], epochs[i - 1] if i else None) for i, n in enumerate(ordered)}
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


@dataclass
class _Scan:
    """How far a text search got."""

    matches: list[dict[str, Any]] = field(default_factory=list)
    used: int = 0  # snippet characters returned
    scanned: int = 0  # frames searched to their end
    without_layers: int = 0
    stopped: str | None = None


async def text_search(capture: CaptureSession, request: Request, message: TextSearch) -> dict[str, Any]:
    """Search every frame matching the filter (from `offset`, at most `limit` when given) in the
    text `tshark -Y <filter> -V` prints, until done or until `stop_at` (trio time, set by the
    handler inside the call's timeout). A search cut short says how far it got and why."""
    m = message
    pattern = await compile_in_thread(m.query, literal=not m.is_regex, case_sensitive=m.case_sensitive)
    numbers = await capture.matching(request, m.display_filter)
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
    scan = await _scan(capture, request, m, numbers, canonical, Matcher(pattern, m.budget_s, unit="frame"))
    return _search_result(m, numbers, scan, bool(canonical))


async def _scan(capture: CaptureSession, request: Request, m: TextSearch, numbers: list[int], canonical: set[str],
                matcher: Matcher) -> _Scan:
    scan = _Scan()
    candidates = numbers[m.offset:] if m.limit is None else numbers[m.offset:m.offset + m.limit]
    previous_ns = None
    if m.offset and candidates:  # the frame displayed before the first one searched
        previous_ns = tree_mod.epoch_ns((await capture.tree(request, numbers[m.offset - 1], keep=False))["tree"])
    for number in candidates:
        if m.stop_at is not None and trio.current_time() >= m.stop_at:
            scan.stopped = "time_budget"
            break
        answer = await capture.tree(request, number, keep=False)
        nodes = displayed(answer["tree"], previous_ns)
        previous_ns = tree_mod.epoch_ns(answer["tree"])
        if canonical and m.restrict_layers:
            nodes = tree_mod.protocol_nodes(nodes, canonical)
            if not nodes:
                scan.without_layers += 1
        text = tree_mod.render(nodes, sources=tree_mod.frame_sources(answer))
        spans = await matcher.run(functools.partial(matcher.spans, text, number, m.max_matches - len(scan.matches)))
        _take_matches(m, scan, number, text, spans)
        if scan.stopped:
            break  # this frame may hold more matches: it does not count as searched
        scan.scanned += 1
    if scan.stopped is None and m.offset + scan.scanned < len(numbers):
        scan.stopped = "limit"
    return scan


def _take_matches(m: TextSearch, scan: _Scan, number: int, text: str, spans: list[tuple[int, int]]) -> None:
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


def _search_result(m: TextSearch, numbers: list[int], scan: _Scan, by_layers: bool) -> dict[str, Any]:
    offset, scanned, stopped = m.offset, scan.scanned, scan.stopped
    searched = numbers[offset:offset + scanned]
    result: dict[str, Any] = {
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
        why = {"time_budget": "the call's time budget was spent",
               "limit": f"limit={m.limit} frames were searched",
               "max_matches": f"max_matches={m.max_matches} matches were found",
               "max_bytes": f"the snippets reached max_bytes={m.max_bytes}"}[stopped]
        result["note"] = (f"INCOMPLETE: searched {scanned} of the {len(numbers) - offset} frames matching the "
                          f"filter from offset {offset} ({len(numbers)} in all), then stopped because {why}; "
                          f"frames not searched may match. Continue with offset={offset + scanned}.")
    elif offset:
        result["note"] = f"searched every frame from offset {offset}; the {offset} frames before it were skipped"
    return result
