"""serial's diagd_timeline adapter: a port's raw log, read through get_log, as timeline rows."""

from __future__ import annotations

from diagd.actors import timeline_source as ts
from diagd.actors.timeline_source import Caller, Read, Source, TimelineSource, Window

PAGE = 1000  # get_log's maximum limit


async def read(call: Caller, source: Source, window: Window) -> Read:
    out, offset, port = Read(), 0, source.ref
    while True:
        page = await call("get_log", {"port": port, "offset": offset, "limit": PAGE})
        for rec in page["records"]:
            t = float(rec["ts"]) + source.shift_s
            if window.past(t):
                return out  # the log is in time order: nothing later can fall in the window
            if not window.holds(t):
                continue
            if len(out.rows) >= ts.SOURCE_CAP:
                out.cut = True
                return out
            info = {k: rec[k] for k in ("dir", "data", "format", "bytes", "event", "info") if k in rec}
            out.rows.append(ts.row(source, float(rec["ts"]), record=rec["i"], **info))
        if page["next_offset"] is None:
            if not out.rows:
                out.note = f"no record of {page['log_file']} in the window"
            return out
        offset = page["next_offset"]


SOURCE = TimelineSource(read, rows="serial packets", names="port", example="/dev/ttyUSB2")
