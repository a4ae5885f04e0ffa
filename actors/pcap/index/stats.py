"""pcap_stats from a capture's index: a page of a conversation or endpoint table (the build's tables.py)
or of I/O intervals (every frame's time and length), paged where the rows are kept, never read whole.
Each answer says how many rows there are (`total`) and, empty, why."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from diagd.actors.pcap.answer_types import IndexSummary, StatsAnswer
from diagd.actors.pcap.index import filters, query
from diagd.actors.pcap.index.store import Stored
from diagd.actors.pcap.messages import IndexStats


async def table(stored: Stored, paged: IndexStats, summary: Callable[[], Awaitable[IndexSummary]]) -> StatsAnswer:
    """A page of the conversations or endpoints of one protocol; `summary` says, when there are none,
    whether the protocol is in the capture at all."""
    message = paged.question
    layer = message.protocol or "ip"
    read = query.conversations if message.kind == "conversations" else query.endpoints
    total, rows = await trio.to_thread.run_sync(read, stored.path, layer, paged.offset, paged.limit)
    tap = "conv" if message.kind == "conversations" else "endpoints"
    result: StatsAnswer = {"method": f"index: every {layer} layer of tshark's two-pass read, counted as "
                                     f"tshark -z {tap},{layer} counts them", "rows": rows, "total": total}
    if (how := query.chunked(stored.meta)) is not None and how["seam_frames"]:
        result["method"] += (f"; read in {how['chunks']} chunks: a row counting any of the capture's "
                             f"{how['seam_frames']} seam frames (a conversation across a chunk's start) says "
                             "`provisional` and how many (`seam_frames`): one pass over the whole file may "
                             "count them otherwise, or find layers in them (an IP packet reassembled) that "
                             "this table lacks; every other row is exact")
    if not total:
        present = layer in (await summary())["protocols"]
        result["reason"] = (f"every {layer} layer of this capture is inside an ICMP error (what an error "
                            "quotes is not counted)" if present else f"protocol {layer} is not in this capture")
    return result


async def io(stored: Stored, paged: IndexStats) -> StatsAnswer:
    """A page of I/O intervals (query.io_page): each frame's time and length are its own, exact in any
    build; which frames a filter matches may differ on a chunked index's seam frames (said)."""
    message = paged.question
    interval = message.interval_ms or 1000
    where = filters.to_sql(message.display_filter)
    if where is None:
        raise ValueError(f"not a filter the index answers: {message.display_filter!r}")  # IndexActor.answers
    got = await trio.to_thread.run_sync(query.io_page, stored.path, where, interval, paged.offset, paged.limit)
    result: StatsAnswer = {"method": "index: every frame's relative time (rel_ns) and length, binned as tshark's "
                                     "io,stat bins them", "interval_ms": interval, "rows": got.rows,
                           "frames": got.frames, "bytes": got.bytes, "total": got.intervals}
    if message.display_filter and (note := query.filter_note(stored.meta)):
        result["method"] += f"; {note}"
    if not got.frames:
        result["reason"] = message.why_empty(())
    return result
