"""bpftrace's diagd_timeline adapter: an execution's output lines, read through get_result with their times."""

from __future__ import annotations

from diagd.actors import timeline_source as ts
from diagd.actors.timeline_source import Caller, Read, Source, TimelineSource, Window


async def read(call: Caller, source: Source, window: Window) -> Read:
    out, offset = Read(), 0
    while True:
        page = await call("get_result", {"execution_id": source.ref, "offset": offset, "limit": 10000,
                                         "times": True})
        times = page.get("line_ts")
        if times is None:
            out.note = ("this execution's lines were recorded without their times (a run from before diagd kept "
                        "them): it cannot be placed on the timeline")
            return out
        for i, (line, t_own) in enumerate(zip(page["output"], times, strict=True), start=offset):
            t = t_own + source.shift_s
            if window.past(t):
                return out
            if not window.holds(t):
                continue
            if len(out.rows) >= ts.SOURCE_CAP:
                out.cut = True
                return out
            out.rows.append(ts.row(source, t_own, line=i, output=line))
        if not page["has_more"]:
            if not out.rows:
                out.note = f"no output line in the window (status {page['status']})"
            return out
        offset = page["next_offset"]


SOURCE = TimelineSource(read, rows="bpftrace lines", names="id", example="bt-1")
