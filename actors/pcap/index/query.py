"""Answers from an index: SQL (DuckDB) over its Parquet file, each a few milliseconds at any depth.

Every function opens its own in-memory DuckDB connection (no state between calls, nothing written
beside the index) and is blocking: the actor runs it in a worker thread. Frame numbers are dense
(1..frames), so a page at any offset reads only the row groups holding it (Parquet's min/max).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors.pcap.index import tables
from diagd.actors.pcap.index.schema import PACKET_LIST, Column
from diagd.actors.pcap.index.stitch import SEAMS_FILE
from diagd.actors.pcap.index.tables import (
    CONVERSATIONS_FILE,
    ENDPOINTS_FILE,
    files_holding,
    frame_files,
    frames_table,
    quoted,
    seconds,
)
from diagd.protocol.errors import DiagdError, ErrorCode

MEMORY_LIMIT = "256MB"  # DuckDB's limit per query (a page or a summary needs far less): bounded whatever the index


@contextmanager
def _connect() -> Iterator[Any]:
    """A connection for one answer; DuckDB's failures as coded errors (an index whose files went away
    meanwhile, a query past its memory), never an internal error."""
    import duckdb

    try:
        # No spilling: DuckDB's temp directory defaults to `.tmp` in the working directory (the daemon's
        # is `/`); no progress bar on the daemon's stdout.
        with duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "threads": 1, "temp_directory": ""}) as con:
            con.execute("PRAGMA disable_progress_bar")
            yield con
    except duckdb.IOException as exc:
        raise DiagdError(ErrorCode.NOT_FOUND, "the capture's index went away while it was read (evicted or "
                                              f"removed); pcap_index builds it again: {str(exc)[:200]}") from None
    except duckdb.OutOfMemoryException:
        raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE, f"the question needs more than the index's query memory "
                                                     f"({MEMORY_LIMIT}): ask for fewer or smaller fields") from None


def _table(index: Path, name: str) -> str:
    return f"read_parquet({quoted(index / name)})"


def _frames(index: Path, lo: int | None = None, hi: int | None = None) -> str:
    """The frames table: its files in frame order, each named (never a glob DuckDB would expand in the
    state directory's own path); of a build still running, the files it has closed. With `lo`..`hi`, only
    the files holding the frames so numbered (a deep page opens one file, not every file's footer)."""
    files = frame_files(index)
    if lo is not None and hi is not None and files:
        files = files_holding(files, lo, hi)
    if not files:
        raise DiagdError(ErrorCode.NOT_FOUND, "the capture's index went away while it was read (evicted or "
                                              "removed); pcap_index builds it again")
    return frames_table(files)


# An empty text cell is stored as null (as an absent field is); the packet list shows it as "".
_LISTED = ", ".join(f"coalesce({c}, '')" if c in {"src", "dst", "protocol", "info"} else c for c in PACKET_LIST)


def _rows(got: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [dict(zip(PACKET_LIST, (*row[:6], row[6].strip()), strict=True)) for row in got]


def page(index: Path, offset: int, limit: int) -> list[dict[str, Any]]:
    """Packet-list rows offset+1 .. offset+limit, as shark/rows.packet_row gives them."""
    with _connect() as con:
        got = con.execute(f"SELECT {_LISTED} FROM {_frames(index, offset + 1, offset + limit)} "
                          "WHERE number > ? AND number <= ? ORDER BY number", [offset, offset + limit]).fetchall()
    return _rows(got)


def _paged(con: Any, index: Path, selected: str, where: str, order: str, offset: int, limit: int
           ) -> list[tuple[Any, ...]]:
    """A page of the frames meeting `where` in `order`: their numbers first (a deep offset then orders
    numbers only: bounded memory at any depth, where ordering whole rows held every row before it), then
    those frames' `selected` columns (the first must be `number`), in that order."""
    numbers = [n for (n,) in con.execute(f"SELECT number FROM {_frames(index)} WHERE {where} ORDER BY {order} "
                                         f"LIMIT {int(limit)} OFFSET {int(offset)}").fetchall()]
    return _of(con, index, selected, numbers)


def summary(index: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The frame count, first and last arrival time (Unix seconds, tshark's text), and the protocols
    in the order they first appear (by frame, then layer): kept in meta.json by the build; an index
    built before it kept them reads them from its frames (tables.summary)."""
    count = int(meta.get("frames") or 0)
    kept = meta.get("summary")
    if not isinstance(kept, dict):
        with _connect() as con:
            kept = tables.summary(con, _frames(index), count)
    return {"frames": count, "first_epoch": kept["first_epoch"], "last_epoch": kept["last_epoch"],
            "protocols": list(kept["protocols"])}


def _endpoint(addr: str, port: int | None) -> str:
    return f"{addr}:{port}" if port is not None else addr


def _filter(net: str, layer: str, ends: list[tuple[str, int | None]]) -> str:
    """The display filter Wireshark gives a conversation or endpoint row (get_conversation_filter)."""
    parts = []
    for addr, port in ends:
        parts.append(f"{net}.addr=={addr}")
        if port is not None:
            parts.append(f"{layer}.port=={port}")
    return " && ".join(parts)


def conversations(index: Path, layer: str, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """How many `layer` conversations (tables.py) there are, and rows offset+1..offset+limit of them
    as the conversation tap lists them: by bytes, then frames, most first; ties in the order the tap
    first saw them."""
    with _connect() as con:
        total = _count(con, index, CONVERSATIONS_FILE, layer)
        got = _table_page(con, index, CONVERSATIONS_FILE, layer, offset, limit,
                          "net, a_addr, a_port, b_addr, b_port, frames, bytes, a_to_b_frames, a_to_b_bytes, "
                          f"b_to_a_frames, b_to_a_bytes, start_ns, stop_ns, "
                          f"{_seam_frames(con, index, CONVERSATIONS_FILE)}")
    rows = []
    for net, a, a_port, b, b_port, frames, size, ab_f, ab_b, ba_f, ba_b, start, stop, seams in got:
        first_s, last_s = seconds(start), seconds(stop)
        rows.append({"a": _endpoint(a, a_port), "b": _endpoint(b, b_port), "frames": frames, "bytes": int(size),
                     "a_to_b_frames": ab_f, "a_to_b_bytes": int(ab_b), "b_to_a_frames": ba_f,
                     "b_to_a_bytes": int(ba_b), "rel_start_s": first_s, "duration_s": round(last_s - first_s, 9),
                     "filter": _filter(net, layer, [(a, a_port), (b, b_port)])} | _provisional(seams))
    return total, rows


def _table_page(con: Any, index: Path, name: str, layer: str, offset: int, limit: int, selected: str
                ) -> list[tuple[Any, ...]]:
    """Rows offset+1..offset+limit of a conversation or endpoint table's `layer` rows in the taps' order
    (bytes, then frames, most first; ties as first seen: `first` is unique): the keys are ordered first
    (a deep page holds only them before it, not whole rows), then those rows read, in that order."""
    firsts = [first for (first,) in con.execute(
        f"SELECT first FROM {_table(index, name)} WHERE layer = ? ORDER BY bytes DESC, frames DESC, first "
        "LIMIT ? OFFSET ?", [layer, limit, offset]).fetchall()]
    if not firsts:
        return []
    found = {row[0]: row[1:] for row in con.execute(
        f"SELECT first, {selected} FROM {_table(index, name)} WHERE layer = ? "
        "AND first IN (SELECT unnest(?::BIGINT[]))", [layer, firsts]).fetchall()}
    return [found[first] for first in firsts]


def _count(con: Any, index: Path, name: str, layer: str) -> int:
    (total,) = con.execute(f"SELECT count(*) FROM {_table(index, name)} WHERE layer = ?", [layer]).fetchone() or (0,)
    return int(total)


def _seam_frames(con: Any, index: Path, name: str) -> str:
    """The table's seam_frames column, or 0 in an index built before it had one."""
    names = [row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {_table(index, name)}").fetchall()]
    return "seam_frames" if "seam_frames" in names else "0"


def _provisional(seams: int) -> dict[str, Any]:
    return {"seam_frames": seams, "provisional": True} if seams else {}


def endpoints(index: Path, layer: str, offset: int, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """How many `layer` endpoints there are, and rows offset+1..offset+limit of them as the endpoint
    tap lists them (by bytes, then frames; ties as first seen)."""
    with _connect() as con:
        total = _count(con, index, ENDPOINTS_FILE, layer)
        got = _table_page(con, index, ENDPOINTS_FILE, layer, offset, limit,
                          "net, addr, port, frames, bytes, tx_frames, tx_bytes, rx_frames, rx_bytes, "
                          f"{_seam_frames(con, index, ENDPOINTS_FILE)}")
    return total, [{"address": _endpoint(addr, port), "frames": frames, "bytes": int(size), "tx_frames": tx_f,
                    "tx_bytes": int(tx_b), "rx_frames": rx_f, "rx_bytes": int(rx_b),
                    "filter": _filter(net, layer, [(addr, port)])} | _provisional(seams)
                   for net, addr, port, frames, size, tx_f, tx_b, rx_f, rx_b, seams in got]


def _cell(col: Column, value: Any) -> Any:
    """A stored value as `tshark -T fields` prints it (answers.timeline_row): text, a list for a field
    that occurs several times, None when absent."""
    if value is None:
        return None
    if col.many:
        texts = [str(v) for v in value]
        return None if not texts else texts[0] if len(texts) == 1 else texts
    return str(value)


def sort_order(col: Column) -> str | None:
    """SQL ordering as shark/rows.sort_key orders a field's values (numbers by value, a field of many
    by its first, absent last, ties in frame order), for a column whose values are all numbers; None:
    sorted in Python (sort_key), within the caller's row limit."""
    if col.kind == "int64":
        value = f"{col.name}[1]" if col.many else col.name
    elif col.field == "frame.time_epoch":
        value = f"CAST({col.name} AS DOUBLE)"
    else:
        return None
    return f"{value} NULLS LAST, number"


BLOCK = 65_536  # frames per block of a dense match's counts (a row group of the frames table)


@dataclass(frozen=True)
class Matches:
    """The frames meeting a condition, kept for the pages of one question: when few, their numbers
    (an Arrow array: 8 bytes a frame; a page is a slice); when many, how many fall in each block of
    BLOCK frames (a few bytes a block, whatever matches): a page is then read from the blocks holding it."""

    total: int
    numbers: Any = None
    blocks: tuple[int, ...] = ()  # the blocks holding matches, in order (numbers None)
    before: tuple[int, ...] = ()  # matches before each of those blocks

    def window(self, offset: int, limit: int) -> tuple[int, int, int] | None:
        """The frame numbers lo..hi holding matches offset+1..offset+limit, and how many matches in
        lo..hi come before them; None: past the last match."""
        if offset >= self.total or limit <= 0:
            return None
        first = bisect.bisect_right(self.before, offset) - 1
        last = bisect.bisect_left(self.before, offset + limit) - 1
        return self.blocks[first] * BLOCK + 1, (self.blocks[last] + 1) * BLOCK, offset - self.before[first]


def matching(index: Path, where: str, kept: int) -> Matches:
    """The frames meeting `where`: their numbers when at most `kept` match, else their count per block
    (one pass over the index each way; at most kept + 1 numbers are ever held)."""
    import pyarrow.compute as pc

    with _connect() as con:
        # A relation, not a DB-API result: its Arrow table is the rows themselves, not a copy of them.
        numbers = con.sql(f"SELECT number FROM {_frames(index)} WHERE {where} LIMIT {int(kept) + 1}"
                          ).to_arrow_table().column(0).combine_chunks()
        if len(numbers) <= kept:
            # In frame order (a scan without ORDER BY may yield its row groups in any order).
            return Matches(len(numbers), numbers=pc.take(numbers, pc.sort_indices(numbers)))
        got = con.execute(f"SELECT (number - 1) // {BLOCK} AS block, count(*) FROM {_frames(index)} "
                          f"WHERE {where} GROUP BY block ORDER BY block").fetchall()
    before = list(itertools.accumulate((int(n) for _, n in got), initial=0))
    return Matches(before[-1], blocks=tuple(int(b) for b, _ in got), before=tuple(before[:-1]))


@dataclass(frozen=True)
class IoPage:
    """Intervals offset..offset+limit-1 of tshark's io,stat over the frames meeting a condition."""

    intervals: int  # how many the tap prints: 0 .. the last frame's (every frame's, matching or not)
    frames: int  # matching frames, all intervals
    bytes: int
    rows: list[dict[str, Any]]


def io_page(index: Path, where: str, interval_ms: int, offset: int, limit: int) -> IoPage:
    """Frames and bytes per interval as tshark 4.0's io,stat tap bins them (answers/stats._io gives the
    rules, from sharkd's frames): relative times rounded to whole microseconds; frames read in file order,
    a matching one counted in the tap's current interval, which only moves forward (a frame earlier than
    it counts there); intervals up to the last frame's, matching or not. One streamed pass, a block of
    frames at a time: bounded memory at any size."""
    import pyarrow as pa
    import pyarrow.compute as pc

    frames = size = 0
    last, current, expected = -1, 0, 1
    shown: dict[int, list[int]] = {}
    with _connect() as con:
        # A single table's scan, projection and WHERE keep the file's row order (DuckDB's order preservation).
        reader = con.sql(f"SELECT number, {_interval(int(interval_ms) * 1000)}, coalesce(length, 0), "
                         f"coalesce(({where}), FALSE) FROM {_frames(index)}").to_arrow_reader(BLOCK)
        for number, at, length, meets in (batch.columns for batch in reader):
            if len(number) and (number[0].as_py() != expected or number[-1].as_py() != expected + len(number) - 1):
                raise DiagdError(ErrorCode.INTERNAL_ERROR, "the index's frames were not read in frame order")
            expected += len(number)
            last = max(last, pc.max(at).as_py() if len(at) else -1)
            at, length = pc.filter(at, meets), pc.filter(length, meets)
            if not len(at):
                continue
            # The interval each matching frame is counted in: the furthest reached so far (from 0).
            counted = pc.cumulative_max(at, start=current)
            current = counted[-1].as_py()
            frames += len(at)
            size += pc.sum(length).as_py()
            paged = pc.and_(pc.greater_equal(counted, offset), pc.less(counted, offset + limit))
            by_interval = pa.table({"n": pc.filter(counted, paged), "bytes": pc.filter(length, paged)}).group_by(
                "n").aggregate([("bytes", "count"), ("bytes", "sum")])
            for n, count, total in zip(*(col.to_pylist() for col in by_interval.columns), strict=True):
                kept = shown.setdefault(n, [0, 0])
                kept[0] += count
                kept[1] += total
    rows = [{"interval": n, "start_s": n * interval_ms / 1000, "frames": shown.get(n, [0, 0])[0],
             "bytes": shown.get(n, [0, 0])[1]} for n in range(offset, min(offset + limit, last + 1))]
    return IoPage(last + 1, frames, size, rows)


def _interval(step_us: int) -> str:
    """The io,stat interval of a frame's relative time (rel_ns) as SQL: whole microseconds as the tap
    rounds them, secs * 10^6 + (nsecs + 500) / 1000 in C's division (DuckDB's // and % on integers
    truncate toward zero, as C's do; answers/stats._microseconds reads sharkd's text so), then the
    interval counted from 0, rounding down (a time before the first frame's is in interval -1 or before)."""
    # A frame without a time (a pcapng simple packet block) counts at 0, as answers/stats._io reads its empty text.
    us = ("((coalesce(rel_ns, 0) // 1000000000) * 1000000 + (coalesce(rel_ns, 0) % 1000000000 + 500) // 1000)")
    return (f"CASE WHEN {us} < 0 AND {us} % {step_us} != 0 THEN {us} // {step_us} - 1 "
            f"ELSE {us} // {step_us} END")


def latest_epoch(index: Path, meta: dict[str, Any]) -> float:
    """The latest arrival time of any frame (Unix seconds): sharkd's `analyse` says it as `last`, the
    capture's end a request's response timer is measured to (the last frame's may be earlier). Kept in
    meta.json by the build (tables.summary); an index built before it reads it from its frames."""
    kept = meta.get("summary")
    if isinstance(kept, dict) and kept.get("latest_epoch") is not None:
        return float(kept["latest_epoch"])
    with _connect() as con:
        got = con.execute(f"SELECT max(CAST(time_epoch AS DOUBLE)) FROM {_frames(index)}").fetchall()[0][0]
    return float(got or 0.0)


def every_match(index: Path, where: str) -> list[int]:
    """The numbers of every frame meeting `where`, in frame order (for a caller that needs them all)."""
    with _connect() as con:
        return [int(n) for (n,) in con.execute(
            f"SELECT number FROM {_frames(index)} WHERE {where} ORDER BY number").fetchall()]


def matched_rows(index: Path, where: str, matches: Matches, offset: int, limit: int, selected: str = "number"
                 ) -> list[tuple[Any, ...]]:
    """The `selected` columns (the first `number`) of matches offset+1..offset+limit, in frame order:
    from the numbers kept, or read straight from the blocks holding them (one query)."""
    with _connect() as con:
        if matches.numbers is not None:
            return _of(con, index, selected, list(matches.numbers[offset:offset + limit].to_pylist()))
        window = matches.window(offset, limit)
        if window is None:
            return []
        lo, hi, skip = window
        return list(con.execute(
            f"SELECT {selected} FROM {_frames(index, lo, hi)} WHERE ({where}) AND number BETWEEN ? AND ? "
            f"ORDER BY number LIMIT {int(limit)} OFFSET {int(skip)}", [lo, hi]).fetchall())


def listed_page(index: Path, where: str, matches: Matches, offset: int, limit: int) -> list[dict[str, Any]]:
    """The packet-list rows of matches offset+1..offset+limit."""
    return _rows(matched_rows(index, where, matches, offset, limit, _LISTED))


def timeline_page(index: Path, fields: list[tuple[str, Column]], where: str, matches: Matches, offset: int,
                  limit: int) -> list[dict[str, Any]]:
    """The timeline rows (values of `fields`) of matches offset+1..offset+limit."""
    return _timeline_rows(fields, matched_rows(index, where, matches, offset, limit, _selected(fields)))


def meeting(index: Path, where: str, numbers: list[int]) -> set[int]:
    """Which of these frames meet `where`."""
    if not numbers:
        return set()
    with _connect() as con:
        return {int(n) for (n,) in con.execute(
            f"SELECT number FROM {_frames(index, min(numbers), max(numbers))} WHERE number BETWEEN ? AND ? "
            f"AND number IN (SELECT unnest(?::BIGINT[])) AND ({where})",
            [min(numbers), max(numbers), numbers]).fetchall()}


def _selected(fields: list[tuple[str, Column]]) -> str:
    return ", ".join(["number", *(col.name for _, col in fields)])


def _of(con: Any, index: Path, selected: str, numbers: list[int]) -> list[tuple[Any, ...]]:
    """These frames' `selected` columns (the first `number`), in this order; only the row groups holding
    them are read (Parquet's min/max of `number`)."""
    if not numbers:
        return []
    found = {row[0]: row for row in con.execute(
        f"SELECT {selected} FROM {_frames(index, min(numbers), max(numbers))} WHERE number BETWEEN ? AND ? "
        "AND list_contains(?, number)",
        [min(numbers), max(numbers), numbers]).fetchall()}
    if len(found) < len(set(numbers)):  # its files changed since the numbers were read (a build's, failing)
        raise DiagdError(ErrorCode.NOT_FOUND, "the capture's index changed while it was read; pcap_index says "
                                              "how it stands")
    return [found[n] for n in numbers]


def _timeline_rows(fields: list[tuple[str, Column]], got: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    rows = []
    for number, *values in got:
        row: dict[str, Any] = {"frame.number": int(number)}
        for (field, col), value in zip(fields, values, strict=True):
            row[field] = _cell(col, value)
        rows.append(row)
    return rows


def timeline(index: Path, fields: list[tuple[str, Column]], where: str, offset: int, limit: int,
             sort_by: Column | None, max_sorted: int) -> tuple[int, list[dict[str, Any]]]:
    """The frames meeting `where` (filters.to_sql's condition), with the values of `fields` ((tshark
    field, its column)): how many, and the page, in frame order or by `sort_by`'s values (sort_order);
    a sort the SQL cannot make gives every row (at most `max_sorted`, else none) for the caller to
    sort and page."""
    selected = _selected(fields)
    order = "number" if sort_by is None else sort_order(sort_by)
    with _connect() as con:
        (total,) = con.execute(f"SELECT count(*) FROM {_frames(index)} WHERE {where}").fetchone() or (0,)
        if order is None and total > max_sorted:
            return total, []
        if order is None:  # every row (at most max_sorted), for the caller to sort
            got = con.execute(f"SELECT {selected} FROM {_frames(index)} WHERE {where} ORDER BY number").fetchall()
        else:
            got = _paged(con, index, selected, where, order, offset, limit)
    return int(total), _timeline_rows(fields, got)


# A frame's IPv4 and IPv6 (source, destination) pairs, layer by layer, as text; and its innermost of each.
_PAIRS = ("list_concat("
          "list_transform(range(1, len(coalesce(ip_src, [])) + 1), lambda i: ip_src[i] || ' ' || ip_dst[i]), "
          "list_transform(range(1, len(coalesce(ipv6_src, [])) + 1), lambda i: ipv6_src[i] || ' ' || ipv6_dst[i]))")
_INNERMOST = ("list_concat("
              "CASE WHEN len(coalesce(ip_src, [])) > 0 THEN [ip_src[-1] || ' ' || ip_dst[-1]] ELSE [] END, "
              "CASE WHEN len(coalesce(ipv6_src, [])) > 0 THEN [ipv6_src[-1] || ' ' || ipv6_dst[-1]] ELSE [] END)")


def records_carrying(index: Path, layers: tuple[str, ...], outside: str | None = None) -> list[tuple[int, int]]:
    """(number, file offset), in frame order, of every frame the dissection of these layers may depend
    on: each frame holding one (with `outside`, a protocol such as `gtp`: not inside it, a tunnel's
    payload not counting); each frame of a TCP stream one of those rides (segments reassembled,
    HTTP/2's header compression, from the stream's start); each frame between the IP ends that carry
    one (an IP fragment holds no layer above IP; the frame reassembling it does): the innermost IP
    layer's (met by any of a frame's), so that a tunnel's other traffic between the same outer ends is
    left out, and for a frame
    that ends at its IP layer (a fragment: nothing above IP but data) any of its IP layers' (a tunnel's
    outer packet fragmented: its first fragment shows the outer ends only); and each frame without an IP
    layer (a lower layer's fragment, such as 802.11's, holds no IP header). The streams and ends are
    looked up in hash sets (Arrow's is_in), a block of frames at a time: the ends of tens of thousands of
    DNS clients cost one pass, not a list scan per frame."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert outside is None or outside.isidentifier(), outside
    above = f"split_part(protocols, ':{outside}:', 1)" if outside else "protocols"
    holding = f"len(list_intersect(string_split({above}, ':'), {list(layers)!r})) > 0"
    found: list[tuple[int, int]] = []

    def both_ways(pairs: list[str] | None) -> Any:
        kept = [p for p in pairs or [] if p is not None]
        return pa.array(sorted({*kept, *(" ".join(reversed(p.split(" "))) for p in kept)}), pa.string())

    def meeting(lists: Any, wanted: Any, rows: int) -> Any:
        """Which of `rows` rows hold a value of `wanted` in their list."""
        met = pc.is_in(pc.list_flatten(lists), value_set=wanted)
        hit = pc.unique(pc.filter(pc.list_parent_indices(lists), met))
        return pc.is_in(pa.array(range(rows), pa.int64()), value_set=hit)

    def distinct(con: Any, values: str) -> list[Any]:
        """The distinct values of a list column over the frames holding a layer (a hash of them: not one
        list of every frame's, which a million DNS frames' IP ends would not fit in the query memory)."""
        return [value for (value,) in con.execute(
            f"SELECT DISTINCT v FROM (SELECT unnest({values}) AS v FROM {_frames(index)} WHERE {holding}) "
            "WHERE v IS NOT NULL").fetchall()]

    with _connect() as con:
        inner_ends, any_ends = both_ways(distinct(con, _INNERMOST)), both_ways(distinct(con, _PAIRS))
        rode = pa.array(distinct(con, "coalesce(tcp_stream, [])"), pa.int64())
        # A single table's scan, projection and WHERE keep the file's row order (DuckDB's order preservation).
        reader = con.sql(f"SELECT number, file_off, {holding}, coalesce(tcp_stream, []), {_PAIRS}, "
                         f"coalesce(regexp_matches(protocols, '(^|:)(ip|ipv6)(:ipv6\\.fraghdr)?(:data)?$'), FALSE) "
                         f"FROM {_frames(index)}").to_arrow_reader(BLOCK)
        for number, file_off, holds, tcp_streams, pairs, at_ip in (batch.columns for batch in reader):
            rows = len(number)
            chosen = pc.or_(pc.fill_null(holds, False), pc.equal(pc.list_value_length(pairs), 0))
            if len(rode):
                chosen = pc.or_(chosen, meeting(tcp_streams, rode, rows))
            if len(inner_ends):
                chosen = pc.or_(chosen, meeting(pairs, inner_ends, rows))
            if len(any_ends):
                chosen = pc.or_(chosen, pc.and_(at_ip, meeting(pairs, any_ends, rows)))
            picked = pa.table({"n": number, "o": file_off}).filter(chosen)
            found.extend(zip(picked.column(0).to_pylist(), picked.column(1).to_pylist(), strict=True))
    return found


def differing_layers(index: Path, numbers: list[int], protocols: list[str], first: int = 5) -> list[int]:
    """The first few of these frames whose layers (frame.protocols, as another read printed them) are
    not the index's: a read of a cut that dissected them otherwise. A chunked index's seam frames are
    not held to it (their rows may differ from one pass over the whole file: stitch.py)."""
    import pyarrow as pa

    if not numbers:
        return []
    read = pa.table({"number": pa.array(numbers, pa.int64()), "protocols": pa.array(protocols, pa.string())})
    seams = (f"AND f.number NOT IN (SELECT number FROM {_table(index, SEAMS_FILE)})"
             if (index / SEAMS_FILE).is_file() else "")
    with _connect() as con:
        con.register("read", read)
        return [int(n) for (n,) in con.execute(
            f"SELECT f.number FROM {_frames(index)} f JOIN read r ON f.number = r.number "
            f"WHERE f.number BETWEEN ? AND ? AND f.protocols IS DISTINCT FROM r.protocols {seams} "
            f"ORDER BY f.number LIMIT {int(first)}", [min(numbers), max(numbers)]).fetchall()]


def seams(index: Path, numbers: list[int]) -> dict[int, str]:
    """Which of these frames are seam frames of a chunked build, and why (stitch.py; {}: none, or the
    index was built in one pass)."""
    path = index / SEAMS_FILE
    if not numbers or not path.is_file():
        return {}
    with _connect() as con:
        got = con.execute(f"SELECT number, why FROM {_table(index, SEAMS_FILE)} WHERE number IN "
                          "(SELECT unnest(?::BIGINT[]))", [numbers]).fetchall()
    return {int(number): str(why) for number, why in got}


def chunked(meta: dict[str, Any]) -> dict[str, Any] | None:
    """How a chunked build read the capture (None: in one pass), as answers say it."""
    runs = meta.get("chunks")
    if not runs:
        return None
    return {"chunks": len(runs), "chunk_mb": round((meta.get("chunk_bytes") or 0) / 2**20),
            "seam_frames": meta.get("seam_frames"), "setups_not_replayed": meta.get("setups_not_replayed") or 0}


SEAM_NOTE = ("the capture was indexed in {chunks} chunks of about {chunk_mb} MB (one tshark pass each: its memory "
             "grows with what it reads); {listed} seam frames: their conversation (or IP packet) has frames in "
             "another chunk, so the columns each lists in `provisional` may differ from one pass over the whole "
             "file (a link, reassembly, TCP analysis); every other row is exact")

# The columns of a seam frame that do not depend on other frames (its number, times, lengths, where its
# record is); the rest may: a packet reassembled only in one pass over the whole file has more layers
# (addresses, ports, streams), another Source and Destination, Protocol and Info.
PER_FRAME = frozenset({"number", "time_relative", "length", "time_epoch", "rel_ns", "cap_len", "file_off"})
# A seam frame's packet-list columns that may differ.
SEAM_COLUMNS = ["dst", "info", "protocol", "src"]

FILTER_SEAM_NOTE = ("filtered on an index read in {chunks} chunks: which frames match is decided on their rows, and "
                    "the capture's {seam_frames} seam frames' rows may differ from one pass over the whole file "
                    "(their streams, layers, Info): one may match here and not there, or the other way")


def filter_note(meta: dict[str, Any]) -> str | None:
    """Why a filtered answer of a chunked index with seam frames may differ (None: it may not)."""
    how = chunked(meta)
    return FILTER_SEAM_NOTE.format(**how) if how and how["seam_frames"] else None
