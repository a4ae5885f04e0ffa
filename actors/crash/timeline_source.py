"""crash's diagd_timeline adapter: a session's kernel log (`log` and `log -T`) as timeline rows.

`log` gives each record's seconds since boot, `log -T` crash's boot date; both are read through
run_crash_command and paged with get_command_output.
"""

from __future__ import annotations

import calendar
import re
import time

from diagd.actors import timeline_source as ts
from diagd.actors.timeline_source import Caller, Read, Source, TimelineSource, Window
from diagd.protocol import utc

PAGE = 500  # run_crash_command max_lines and get_command_output limit at most (crash MAX_PAGE_LINES)

_UPTIME = re.compile(r"^\[\s*(\d+)\.(\d+)\] ?(.*)$", re.S)
_CTIME = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d) (\S+) (\d{4})\] ?(.*)$", re.S)


async def _lines(call: Caller, session: str, command: str) -> tuple[list[str], bool]:
    """All lines of a crash command's output, up to SOURCE_CAP (True: there were more)."""
    cap = ts.SOURCE_CAP
    first = await call("run_crash_command", {"command": command, "session_id": session, "max_lines": PAGE})
    lines = first["output"].split("\n") if first["output"] else []
    lines = lines[:first.get("lines_returned", len(lines))]
    total = first["total_lines"]
    while len(lines) < min(total, cap):
        page = await call("get_command_output", {"command_id": first["command_id"], "offset": len(lines),
                                                 "limit": min(PAGE, cap - len(lines))})
        more = page["output"].split("\n") if page["output"] else []
        if not more:
            break
        lines += more
    return lines[:cap], total > cap


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


async def read(call: Caller, source: Source, window: Window) -> Read:
    relative, cut = await _lines(call, source.ref, "log")
    ctime, _ = await _lines(call, source.ref, "log -T")
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
            out.rows.append(ts.row(source, boot + uptime, line=n, uptime=uptime, text=text))
    out.cut = cut and not ended
    out.note = (f"times are crash's boot date {utc.iso(boot)} (whole seconds, from `log -T`) + seconds since boot"
                + ("" if out.rows else "; no kernel log line in the window"))
    return out


SOURCE = TimelineSource(read, rows="the kernel log", names="id", example="s1")
