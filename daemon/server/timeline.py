"""diagd_timeline: rows of several sources merged by wall-clock time.

A source is `{"<kind>": ref, ...}`, its kind the name of the back end that reads it: each back end
declares how (`Runtime.add_timeline_source`, see diagd.actors.timeline_source), reading through its
own tools via a `Caller`. This module parses the sources, reads them concurrently and merges; it
knows no kind, tool or option of its own beyond `offset_ms` and `label`.

Each source is read up to SOURCE_CAP rows inside the window. A source cut there makes the merge
incomplete past its last row: the answer keeps only the rows before that time (`complete_until`)
and says to call again with `start` at it, so the merged order is never wrong, only shorter.
"""

from __future__ import annotations

import datetime
import difflib
import heapq
import itertools
import math
from collections.abc import Mapping
from typing import Any

import trio

from diagd.actors import timeline_source as ts
from diagd.actors.timeline_source import MAX_EPOCH_S, Caller, Read, Source, TimelineSource, Window
from diagd.daemon.server.replies import SourceSummary, TimelineReply
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_SOURCES = 8
COMMON = ("offset_ms", "label")
# Clocks of one story are minutes apart, not ages; past this, times cannot be written as ISO 8601 at all.
MAX_OFFSET_MS = 10 * 366 * 86400 * 1000
Adapters = Mapping[str, TimelineSource]  # source kind (a back end's name) -> how it is read


def parse_time(value: Any, what: str) -> float | None:
    """Unix seconds, or an ISO 8601 time (no zone: UTC)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not (math.isfinite(value) and abs(value) <= MAX_EPOCH_S):  # NaN would silently match no row
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what}: Unix seconds up to {MAX_EPOCH_S} (year 9999)",
                             path=f"$.{what}")
        return float(value)
    if not isinstance(value, str):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what}: Unix seconds or an ISO 8601 time", path=f"$.{what}")
    try:
        parsed = datetime.datetime.fromisoformat(str(value).strip())
    except ValueError:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what}: {value!r} is neither Unix seconds nor an ISO 8601 time "
                         "(e.g. 2026-08-17T10:02:11.5Z)", path=f"$.{what}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def _example(adapters: Adapters) -> str:
    """Two sources, for a refusal, each back end's example: '[{"a": "x"}, {"b": "y", "offset_ms": -350}]'."""
    shown = [f'{{"{kind}": "{a.example}"' + (', "offset_ms": -350}' if i else "}")
             for i, (kind, a) in enumerate(list(adapters.items())[:2])]
    return f"[{', '.join(shown)}]"


def parse_sources(adapters: Adapters, raw: list[Any]) -> list[Source]:
    if not raw or len(raw) > MAX_SOURCES:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sources: 1 to {MAX_SOURCES} sources, e.g. {_example(adapters)}",
                         path="$.sources")
    kinds = tuple(adapters)
    sources: list[Source] = []
    for i, item in enumerate(raw):
        path = f"$.sources[{i}]"
        if not isinstance(item, dict):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: a source is an object such as "
                             f"{{\"{kinds[0] if kinds else 'KIND'}\": ...}}", path=path)
        named = [k for k in kinds if k in item]
        if len(named) != 1:
            close = sorted({m for key in item for m in difflib.get_close_matches(key, kinds, n=1)})
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: name exactly one of {', '.join(kinds)} "
                             f"(got {', '.join(map(str, item)) or 'none'})", path=path, did_you_mean=close)
        kind = named[0]
        adapter = adapters[kind]
        allowed = (kind, *adapter.options, *COMMON)
        for key in item:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=2)
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: {key!r} is not an option of a {kind} source "
                                 f"(options: {', '.join(allowed)})", path=f"{path}.{key}", did_you_mean=close)
        ref = item[kind]
        if not isinstance(ref, str) or not ref:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}.{kind}: a non-empty string", path=f"{path}.{kind}")
        shift = item.get("offset_ms", 0)
        if (isinstance(shift, bool) or not isinstance(shift, int | float) or not math.isfinite(shift)
                or abs(shift) > MAX_OFFSET_MS):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}.offset_ms: a number of milliseconds, at most "
                             f"{MAX_OFFSET_MS} either way (ten years)", path=f"{path}.offset_ms")
        options = adapter.parse_options(item, path)
        label = item.get("label") or f"{kind}:{adapter.label(ref)}"
        sources.append(Source(kind, ref, str(label), shift / 1000, options))
    labels = [s.label for s in sources]
    if len(set(labels)) != len(labels):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "two sources have the same label: give each a distinct 'label'",
                         labels=labels)
    return sources


async def build(call: Caller, adapters: Adapters, raw_sources: list[Any], *, start: Any, end: Any, limit: int,
                offset: int) -> TimelineReply:
    """The merged answer of diagd_timeline; `adapters`: the source kinds the back ends declared."""
    sources = parse_sources(adapters, raw_sources)
    window = Window(parse_time(start, "start"), parse_time(end, "end"))
    reads: list[Read | None] = [None] * len(sources)
    failed: list[DiagdError] = []

    async def one(i: int, source: Source) -> None:
        try:
            reads[i] = await adapters[source.kind].read(call, source, window)
        except DiagdError as exc:  # name the source: the agent sees which one failed
            failed.append(DiagdError(exc.code, f"source {source.label}: {exc.message}", source=source.label,
                                     **exc.details))

    async with trio.open_nursery() as nursery:
        for i, source in enumerate(sources):
            nursery.start_soon(one, i, source)
    # The first coded failure, as itself: not raised from the tasks, where the nursery would make it a
    # group (and Python 3.11.2's `except*` a group again, whatever it raised: gh-103590, fixed in 3.11.4).
    if failed:
        raise failed[0]
    done = [r for r in reads if r is not None]
    # Past the first cut source's last row the merge may miss its rows: stop there.
    cut_at = min((max(row["t"] for row in r.rows) for r in done if r.cut and r.rows), default=None)
    # A merge, not a sort: each source keeps the order it gives where its clock steps back (a kernel log's
    # records are in sequence order; printk stamps them with per-CPU clocks); ties go to the earlier source.
    merged = list(heapq.merge(*(r.rows for r in done), key=lambda row: row["t"]))
    if cut_at is not None:
        before = [row for row in merged if row["t"] < cut_at]
        merged = before or [row for row in merged if row["t"] <= cut_at]
    page = merged[offset:offset + limit]
    summary: list[SourceSummary] = []
    for source, read in zip(sources, done, strict=True):
        entry: SourceSummary = {"source": source.label, "kind": source.kind, "rows": len(read.rows),
                                 "offset_ms": source.shift_s * 1000, "cut": read.cut}
        if read.cut:
            entry["cut_at"] = read.rows[-1]["t"] if read.rows else None
            entry["why"] = f"read up to {ts.SOURCE_CAP} rows per call"
        steps_back = sum(1 for a, b in itertools.pairwise(read.rows) if b["t"] < a["t"])
        if steps_back:
            entry["steps_back"] = steps_back
        if read.note:
            entry["note"] = read.note
        summary.append(entry)
    answer: TimelineReply = {
        "rows": page, "returned": len(page), "total": len(merged), "offset": offset,
        "next_offset": offset + len(page) if offset + len(page) < len(merged) else None,
        "span": {"first": min(merged, key=lambda row: row["t"])["time"],
                 "last": max(merged, key=lambda row: row["t"])["time"]} if merged else None,
        "sources": summary,
    }
    if cut_at is not None:
        answer["complete_until"] = cut_at
        answer["hint"] = (f"a source was cut at {ts.SOURCE_CAP} rows: rows are complete up to t={cut_at}; call again "
                          f"with start={cut_at} (or narrow the window or a capture's filter) for the rest")
    elif not merged:
        answer["hint"] = "no row in the window from any source (see each source's note)"
    return answer
