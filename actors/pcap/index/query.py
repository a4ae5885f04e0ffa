"""Answers from an index: SQL (DuckDB) over its Parquet file, each a few milliseconds at any depth.

Every function opens its own in-memory DuckDB connection (no state between calls, nothing written
beside the index) and is blocking: the actor runs it in a worker thread. Frame numbers are dense
(1..frames), so a page at any offset reads only the row groups holding it (Parquet's min/max).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diagd.actors.pcap.index.build import FRAMES_FILE
from diagd.actors.pcap.index.schema import PACKET_LIST

MEMORY_LIMIT = "256MB"  # DuckDB's limit per query (a page or a summary needs far less): bounded whatever the index


def _connect() -> Any:
    import duckdb

    # No spilling: DuckDB's temp directory defaults to `.tmp` in the working directory (the daemon's is `/`).
    con = duckdb.connect(config={"memory_limit": MEMORY_LIMIT, "threads": 1, "temp_directory": ""})
    return con


def _frames(index: Path) -> str:
    path = str(index / FRAMES_FILE).replace("'", "''")
    return f"read_parquet('{path}')"


def page(index: Path, offset: int, limit: int) -> list[dict[str, Any]]:
    """Packet-list rows offset+1 .. offset+limit, as shark/rows.packet_row gives them."""
    # An empty text cell is stored as null (as an absent field is); the packet list shows it as "".
    texts = {"src", "dst", "protocol", "info"}
    selected = ", ".join(f"coalesce({c}, '')" if c in texts else c for c in PACKET_LIST)
    with _connect() as con:
        got = con.execute(f"SELECT {selected} FROM {_frames(index)} "
                          "WHERE number > ? AND number <= ? ORDER BY number", [offset, offset + limit]).fetchall()
    return [dict(zip(PACKET_LIST, (*row[:6], row[6].strip()), strict=True)) for row in got]


def summary(index: Path) -> dict[str, Any]:
    """The frame count, first and last arrival time (Unix seconds, tshark's text), and the protocols
    in the order they first appear (by frame, then layer)."""
    with _connect() as con:
        count, first, last = con.execute(
            f"SELECT count(*), arg_min(time_epoch, number), arg_max(time_epoch, number) FROM {_frames(index)}"
        ).fetchone() or (0, None, None)
        protocols = [p for (p,) in con.execute(
            f"SELECT layer FROM (SELECT number, unnest(string_split(protocols, ':')) AS layer, "
            f"unnest(range(len(string_split(protocols, ':')))) AS depth FROM {_frames(index)}) "
            "GROUP BY layer ORDER BY min(number * 4096 + depth)").fetchall()]
    return {"frames": count, "first_epoch": first, "last_epoch": last, "protocols": protocols}
