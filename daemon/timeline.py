"""diagd_timeline: rows of several sources merged by wall-clock time.

A source is a capture (pcap_timeline rows), a serial port's raw log (get_log records), a bpftrace
execution's output lines (get_result with each line's arrival time) or a crash session's kernel log
(`log` for the seconds since boot, `log -T` for crash's boot date). Back ends know nothing of each
other, so this module reads each one through its own tools, by name, via a `Caller`, and merges.

Each source is read up to SOURCE_CAP rows inside the window. A source cut there makes the merge
incomplete past its last row: the answer keeps only the rows before that time (`complete_until`)
and says to call again with `start` at it, so the merged order is never wrong, only shorter.
"""

from __future__ import annotations

import calendar
import datetime
import difflib
import math
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import trio

from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

SOURCE_CAP = 5000  # rows read per source and call
MAX_SOURCES = 8
KINDS = ("pcap", "serial", "bpftrace", "crash")
OPTIONS = {"pcap": ("filter", "fields", "decode_as"), "serial": (), "bpftrace": (), "crash": ()}
COMMON = ("offset_ms", "label")
DEFAULT_FIELDS = ("_ws.col.Protocol", "_ws.col.Info")
SERIAL_PAGE = 1000  # get_log's maximum limit
# Clocks of one story are minutes apart, not ages; past these, times cannot be written as ISO 8601 at all.
MAX_OFFSET_MS = 10 * 366 * 86400 * 1000
MAX_EPOCH_S = 253402300799  # 9999-12-31T23:59:59Z
CRASH_PAGE = 500  # run_crash_command max_lines and get_command_output limit at most (crash MAX_PAGE_LINES)

# A tool call by name: its result, or the DiagdError it answered.
Caller = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@dataclass
class Source:
    kind: str
    ref: str  # capture path, port, execution id or session id
    label: str
    shift_s: float
    options: dict[str, Any]


@dataclass
class Read:
    """What one source gave: its rows (times already shifted) and whether it was cut at the cap."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    cut: bool = False
    note: str | None = None


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


def parse_sources(raw: list[Any]) -> list[Source]:
    if not raw or len(raw) > MAX_SOURCES:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sources: 1 to {MAX_SOURCES} sources, e.g. "
                         '[{"pcap": "core.pcap"}, {"serial": "/dev/ttyUSB2", "offset_ms": -350}]', path="$.sources")
    sources: list[Source] = []
    for i, item in enumerate(raw):
        path = f"$.sources[{i}]"
        if not isinstance(item, dict):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: a source is an object such as {{\"pcap\": PATH}}",
                             path=path)
        kinds = [k for k in KINDS if k in item]
        if len(kinds) != 1:
            close = sorted({m for key in item for m in difflib.get_close_matches(key, KINDS, n=1)})
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: name exactly one of {', '.join(KINDS)} "
                             f"(got {', '.join(map(str, item)) or 'none'})", path=path, did_you_mean=close)
        kind = kinds[0]
        allowed = (kind, *OPTIONS[kind], *COMMON)
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
        fields = item.get("fields", list(DEFAULT_FIELDS))
        if kind == "pcap" and not (isinstance(fields, list) and fields and all(isinstance(f, str) for f in fields)):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}.fields: a non-empty list of field names",
                             path=f"{path}.fields")
        if kind == "pcap" and "filter" in item:
            _check_filter_stands_alone(item["filter"], f"{path}.filter")
        label = item.get("label") or f"{kind}:{PurePath(ref).name if kind == 'pcap' else ref}"
        options = {k: item[k] for k in OPTIONS[kind] if k in item}
        if kind == "pcap":
            options["fields"] = fields
        sources.append(Source(kind, ref, str(label), shift / 1000, options))
    labels = [s.label for s in sources]
    if len(set(labels)) != len(labels):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "two sources have the same label: give each a distinct 'label'",
                         labels=labels)
    return sources


def _check_filter_stands_alone(text: Any, path: str) -> None:
    """A capture's filter is joined with the time window as `(filter) && window`: one that closes the
    parenthesis itself (`a) || (1`) would take the window's frames out of the `&&` and spend the source's
    row cap on frames outside it. Its parentheses, outside string literals, must balance."""
    if not isinstance(text, str):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: a display filter string", path=path)
    depth, quoted, escaped = 0, False, False
    for char in text:
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
            continue
        if char == '"':
            quoted = True
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            break
    if depth != 0 or quoted:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: unbalanced parentheses or quotes in {text[:200]!r}",
                         path=path)


class Window:
    """The merged time range asked for (shifted time); each source sees it in its own clock."""

    def __init__(self, start: float | None, end: float | None) -> None:
        if start is not None and end is not None and end < start:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "end is before start", start=start, end=end)
        self.start, self.end = start, end

    def holds(self, t: float) -> bool:
        return (self.start is None or t >= self.start) and (self.end is None or t <= self.end)

    def past(self, t: float) -> bool:
        return self.end is not None and t > self.end


def _row(source: Source, t_own: float, **info: Any) -> dict[str, Any]:
    micros = round((t_own + source.shift_s) * 1_000_000)
    seconds, fraction = divmod(micros, 1_000_000)
    if abs(seconds) > MAX_EPOCH_S:  # a crafted pcapng's 64-bit timestamp, shifted: no ISO time for it
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"a row's time ({micros / 1_000_000} s, offset applied) is "
                         f"beyond {MAX_EPOCH_S} s (year 9999) from 1970: check the source's clock and offset_ms",
                         t=micros / 1_000_000)
    # Rounded to the microsecond once, so `t` and `time` say the same instant (utc.iso truncates a float).
    return {"t": micros / 1_000_000, "time": f"{utc.iso(seconds)[:-1]}.{fraction:06d}Z", "source": source.label,
            **info}


async def read_pcap(call: Caller, source: Source, window: Window) -> Read:
    fields = [f for f in source.options["fields"] if f not in ("frame.number", "frame.time_epoch")]
    parts = [f"({source.options['filter']})"] if source.options.get("filter") else []
    # The window goes into the display filter (tshark skips what is outside), in the capture's own clock
    # and half a microsecond wider: rows say times rounded to the microsecond, and a time taken from a
    # row must select that row. The rounded times are checked against the window below.
    if window.start is not None:
        parts.append(f"frame.time_epoch >= {window.start - source.shift_s - 5e-7:.7f}")
    if window.end is not None:
        parts.append(f"frame.time_epoch <= {window.end - source.shift_s + 5e-7:.7f}")
    args: dict[str, Any] = {"pcap_path": source.ref, "fields": ["frame.time_epoch", *fields],
                            "display_filter": " && ".join(parts) or "frame", "limit": SOURCE_CAP}
    if "decode_as" in source.options:
        args["decode_as"] = source.options["decode_as"]
    page = await call("pcap_timeline", args)
    out = Read(cut=bool(page.get("has_more")))
    for row in page["rows"]:
        epoch = row.get("frame.time_epoch")
        if not epoch:
            continue
        shown = _row(source, float(epoch), frame=row["frame.number"], fields={f: row.get(f) for f in fields})
        if window.holds(shown["t"]):
            out.rows.append(shown)
    out.rows.sort(key=lambda r: r["t"])  # frames are in file order, which may not be time order
    if not out.rows:
        out.note = f"no frame matched {args['display_filter']!r}"
    return out


async def read_serial(call: Caller, source: Source, window: Window) -> Read:
    out, offset, port = Read(), 0, source.ref
    while True:
        page = await call("get_log", {"port": port, "offset": offset, "limit": SERIAL_PAGE})
        for rec in page["records"]:
            t = float(rec["ts"]) + source.shift_s
            if window.past(t):
                return out  # the log is in time order: nothing later can fall in the window
            if not window.holds(t):
                continue
            if len(out.rows) >= SOURCE_CAP:
                out.cut = True
                return out
            info = {k: rec[k] for k in ("dir", "data", "format", "bytes", "event", "info") if k in rec}
            out.rows.append(_row(source, float(rec["ts"]), record=rec["i"], **info))
        if page["next_offset"] is None:
            if not out.rows:
                out.note = f"no record of {page['log_file']} in the window"
            return out
        offset = page["next_offset"]


async def read_bpftrace(call: Caller, source: Source, window: Window) -> Read:
    out, offset = Read(), 0
    while True:
        page = await call("get_result", {"execution_id": source.ref, "offset": offset, "limit": 10000,
                                         "times": True})
        times = page.get("line_ts")
        if times is None:
            out.note = ("this execution's lines were recorded without their times (a run from before diagd kept "
                        "them): it cannot be placed on the timeline")
            return out
        for i, (line, ts) in enumerate(zip(page["output"], times, strict=True), start=offset):
            t = ts + source.shift_s
            if window.past(t):
                return out
            if not window.holds(t):
                continue
            if len(out.rows) >= SOURCE_CAP:
                out.cut = True
                return out
            out.rows.append(_row(source, ts, line=i, output=line))
        if not page["has_more"]:
            if not out.rows:
                out.note = f"no output line in the window (status {page['status']})"
            return out
        offset = page["next_offset"]


_UPTIME = re.compile(r"^\[\s*(\d+)\.(\d+)\] ?(.*)$", re.S)
_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d) (\S+) (\d{4})\] ?(.*)$", re.S)


async def _crash_lines(call: Caller, session: str, command: str) -> tuple[list[str], bool]:
    """All lines of a crash command's output, up to SOURCE_CAP (True: there were more)."""
    first = await call("run_crash_command", {"command": command, "session_id": session, "max_lines": CRASH_PAGE})
    lines = first["output"].split("\n") if first["output"] else []
    lines = lines[:first.get("lines_returned", len(lines))]
    total = first["total_lines"]
    while len(lines) < min(total, SOURCE_CAP):
        page = await call("get_command_output", {"command_id": first["command_id"], "offset": len(lines),
                                                 "limit": min(CRASH_PAGE, SOURCE_CAP - len(lines))})
        more = page["output"].split("\n") if page["output"] else []
        if not more:
            break
        lines += more
    return lines[:SOURCE_CAP], total > SOURCE_CAP


def boot_epoch(relative: list[str], ctime: list[str]) -> int | None:
    """crash's boot date (Unix s): `log -T` prints boot_date.tv_sec + whole seconds since boot, so
    each pair of lines gives it exactly; None if the two outputs do not pair up."""
    found: set[int] = set()
    for rel, wall in zip(relative, ctime, strict=False):
        r, w = _UPTIME.match(rel), _CTIME.match(wall)
        if r is None or w is None:
            continue
        if r[3] != w[4]:
            return None
        stamp = time.strptime(f"{w[1]} {w[3]}", "%a %b %d %H:%M:%S %Y")
        # crash prints the daemon's local time (its TZ); UTC is the usual case.
        wall_s = calendar.timegm(stamp) if w[2] in ("UTC", "GMT") else int(time.mktime(stamp))
        found.add(wall_s - int(r[1]))
    return found.pop() if len(found) == 1 else None


async def read_crash(call: Caller, source: Source, window: Window) -> Read:
    relative, cut = await _crash_lines(call, source.ref, "log")
    ctime, _ = await _crash_lines(call, source.ref, "log -T")
    boot = boot_epoch(relative, ctime)
    out = Read(cut=False)
    if boot is None:
        out.note = "the kernel log's boot time is not derivable (log and log -T do not pair up): no rows"
        return out
    uptime: float | None = None
    ended = False  # the window ended before the lines read did
    for n, line in enumerate(relative):
        if m := _UPTIME.match(line):
            uptime, text = float(f"{m[1]}.{m[2]}"), m[3]
        else:
            text = line  # a continuation line: the time of the record it belongs to
        if uptime is None:
            continue
        t = boot + uptime + source.shift_s
        if window.past(t):
            ended = True
            break
        if window.holds(t):
            out.rows.append(_row(source, boot + uptime, line=n, uptime=uptime, text=text))
    out.cut = cut and not ended
    out.note = (f"times are crash's boot date {utc.iso(boot)} (whole seconds, from `log -T`) + seconds since boot"
                + ("" if out.rows else "; no kernel log line in the window"))
    return out


READERS = {"pcap": read_pcap, "serial": read_serial, "bpftrace": read_bpftrace, "crash": read_crash}


async def build(call: Caller, raw_sources: list[Any], *, start: Any, end: Any, limit: int, offset: int
                ) -> dict[str, Any]:
    sources = parse_sources(raw_sources)
    window = Window(parse_time(start, "start"), parse_time(end, "end"))
    reads: list[Read | None] = [None] * len(sources)

    async def one(i: int, source: Source) -> None:
        try:
            reads[i] = await READERS[source.kind](call, source, window)
        except DiagdError as exc:  # name the source: the agent sees which one failed
            raise DiagdError(exc.code, f"source {source.label}: {exc.message}", source=source.label,
                             **exc.details) from None

    try:
        async with trio.open_nursery() as nursery:
            for i, source in enumerate(sources):
                nursery.start_soon(one, i, source)
    except* DiagdError as group:  # the first coded failure, as itself (not a group the registry cannot read)
        first = group.exceptions[0]
        raise (first if isinstance(first, DiagdError) else DiagdError(ErrorCode.INTERNAL_ERROR, str(first))) from None
    done = [r for r in reads if r is not None]
    # Past the first cut source's last row the merge may miss its rows: stop there.
    cut_at = min((r.rows[-1]["t"] for r in done if r.cut and r.rows), default=None)
    merged = sorted((row for r in done for row in r.rows), key=lambda row: row["t"])  # stable: source order on ties
    if cut_at is not None:
        before = [row for row in merged if row["t"] < cut_at]
        merged = before or [row for row in merged if row["t"] <= cut_at]
    page = merged[offset:offset + limit]
    summary = []
    for source, read in zip(sources, done, strict=True):
        entry: dict[str, Any] = {"source": source.label, "kind": source.kind, "rows": len(read.rows),
                                 "offset_ms": source.shift_s * 1000, "cut": read.cut}
        if read.cut:
            entry["cut_at"] = read.rows[-1]["t"] if read.rows else None
            entry["why"] = f"read up to {SOURCE_CAP} rows per call"
        if read.note:
            entry["note"] = read.note
        summary.append(entry)
    answer: dict[str, Any] = {
        "rows": page, "returned": len(page), "total": len(merged), "offset": offset,
        "next_offset": offset + len(page) if offset + len(page) < len(merged) else None,
        "span": {"first": merged[0]["time"], "last": merged[-1]["time"]} if merged else None,
        "sources": summary,
    }
    if cut_at is not None:
        answer["complete_until"] = cut_at
        answer["hint"] = (f"a source was cut at {SOURCE_CAP} rows: rows are complete up to t={cut_at}; call again "
                          f"with start={cut_at} (or narrow the window or a capture's filter) for the rest")
    elif not merged:
        answer["hint"] = "no row in the window from any source (see each source's note)"
    return answer
