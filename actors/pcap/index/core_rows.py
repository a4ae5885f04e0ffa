"""The PFCP and SBI rows the NGAP procedures view links to PDU session establishments (ngap/core_links.py),
read from an indexed capture without loading it: the same `tshark -T fields` two-pass read the loaded
capture makes of the whole file (answers.core_rows), made over a cut of the frames carrying PFCP,
HTTP/2, HTTP (SSDP) or JSON and what their dissection depends on (query.records_carrying: their TCP streams
whole, from the start HTTP/2's header compression needs; their IP ends' other frames and fragments).

Frame numbers are the whole capture's: the row's own and the links to a response (pfcp.response_in,
http.response_in). tcp.stream is the cut's own numbering, which core_links uses only to tell connections
apart (a connection is cut whole). Times are Unix times, the same in the cut. Each row's layers must be
the index's (query.differing_layers): a frame the cut dissected otherwise, a cut tshark cannot read within
its memory bound, or a file that cannot be cut, and the loaded capture answers instead (Unanswered).
"""

from __future__ import annotations

from pathlib import Path

import trio

from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import narrow, query, workspace
from diagd.actors.pcap.shark.tshark import AGGREGATOR, fields_argv
from diagd.protocol.errors import DiagdError

# The layers every row of ngap.CORE_FILTER carries one of: HTTP/1.1 is `http`, or `ssdp` over UDP (the HTTP
# dissector under SSDP's name: http.request with no `http` layer); SBI's JSON rides HTTP/2.
LAYERS = ("pfcp", "http2", "http", "ssdp", "json")
# Fields holding frame numbers: the cut's, turned into the whole capture's.
NUMBERED = ("frame.number", "pfcp.response_in", "http.response_in")


class Unanswered(Exception):
    """Why the rows are not read from the index (the loaded capture's read answers)."""


async def core_rows(capture: Path, index: Path, frames: int, argv: list[str]) -> list[dict[str, str]]:
    """ngap.CORE_FIELDS of every frame of `capture` (its index at `index`, `frames` frames; `argv`: its
    own two-pass tshark command) meeting ngap.CORE_FILTER, occurrences joined by commas, in frame order."""
    records = await trio.to_thread.run_sync(query.records_carrying, index, LAYERS)
    numbers = [number for number, _ in records]
    fields = (*ngap.CORE_FIELDS, "frame.protocols")
    rows: list[dict[str, str]] = []
    layers: list[str] = []

    def take(line: str) -> None:
        row = dict(zip(fields, line.rstrip("\n").replace(AGGREGATOR, ",").split("\t"), strict=False))
        for name in NUMBERED:
            if row.get(name):
                row[name] = ",".join(str(numbers[int(n) - 1]) for n in row[name].split(","))
        layers.append(row.pop("frame.protocols", ""))
        rows.append(row)

    try:
        async with workspace.cut_beside(capture, index, [off for _, off in records], frames) as cut:
            done = await workspace.bounded_head(fields_argv(workspace.reading(argv, cut), ngap.CORE_FILTER, fields),
                                                len(records), "read the PFCP and SBI frames", None,
                                                max_line=1 << 30, on_line=take)
    except narrow.Uncuttable as exc:
        raise Unanswered(str(exc)) from None
    except DiagdError as exc:  # the memory bound, or no prlimit to hold it
        raise Unanswered(exc.message) from None
    if done.returncode != 0:
        raise Unanswered(f"tshark over the frames cut failed: {done.stderr[-500:]}")
    read = [int(row["frame.number"]) for row in rows]
    differing = await trio.to_thread.run_sync(query.differing_layers, index, read, layers)
    if differing:
        raise Unanswered(f"frames cut from the capture dissected otherwise than in the whole file (first: "
                         f"{', '.join(map(str, differing))})")
    return rows
