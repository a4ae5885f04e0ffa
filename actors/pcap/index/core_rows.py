"""The PFCP and SBI rows the NGAP procedures view links to PDU session establishments (ngap/core_links.py),
read from an indexed capture without loading it: the same `tshark -T fields` two-pass read the loaded
capture makes of the whole file (answers.core_rows), made over a cut of the frames carrying PFCP,
HTTP/2, HTTP (SSDP) or JSON and what their dissection depends on (cut_columns.py: their TCP streams whole,
from the start HTTP/2's header compression needs; their IP ends' other frames and fragments).

HTTP inside GTP-U (users' traffic, no SBI) chooses no frame: its rows, which core_links skips, may be missing
from these. Frame numbers are the whole capture's: the row's own and the links to a response (pfcp.response_in,
http.response_in). tcp.stream is the cut's own numbering, which core_links uses only to tell connections
apart (a connection is cut whole). Times are Unix times, the same in the cut. Each row's layers must be
the index's: a frame the cut dissected otherwise, a cut tshark cannot read within its memory bound, or a
file that cannot be cut, and the loaded capture answers instead (a coded error saying `index_unanswered`).
"""

from __future__ import annotations

from pathlib import Path

from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import cut_columns
from diagd.protocol.errors import DiagdError, ErrorCode

# The layers every row of ngap.CORE_FILTER carries one of: HTTP/1.1 is `http`, or `ssdp` over UDP (the HTTP
# dissector under SSDP's name: http.request with no `http` layer); SBI's JSON rides HTTP/2.
LAYERS = ("pfcp", "http2", "http", "ssdp", "json")
# Fields holding frame numbers: the cut's, turned into the whole capture's.
NUMBERED = ("pfcp.response_in", "http.response_in")
MAX_ROWS = 1_000_000  # rows held for linking (as the loaded capture's are)
# A layer inside GTP-U does not choose a frame: the users' own HTTP in an N3 tunnel is no SBI, and
# core_links.core_messages skips a row of it (gtp.teid) whether it is read or not; on an N2-in-N3 capture
# its flows were most of the cut.
TUNNEL = "gtp"


async def core_rows(capture: Path, index: Path, frames: int, argv: list[str]) -> list[dict[str, str]]:
    """ngap.CORE_FIELDS of every frame of `capture` (its index at `index`, `frames` frames; `argv`: its
    own two-pass tshark command) meeting ngap.CORE_FILTER, occurrences joined by commas, in frame order."""
    rows: list[dict[str, str]] = []
    wanted = cut_columns.Fields(tuple(name for name in ngap.CORE_FIELDS if name != "frame.number"), NUMBERED)

    def take(number: int, row: dict[str, str]) -> None:
        rows.append({name: str(number) if name == "frame.number" else row[name] for name in ngap.CORE_FIELDS})

    try:
        await cut_columns.read(capture, index, frames, argv, ngap.CORE_FILTER, wanted, LAYERS, take,
                               purpose="read the PFCP and SBI frames", max_frames=MAX_ROWS, outside=TUNNEL)
    except DiagdError as exc:  # a file not cut, the memory bound, frames read otherwise, too many
        raise DiagdError(ErrorCode.NOT_FOUND, f"the PFCP and SBI rows are not read from the index: {exc.message}",
                         index_unanswered=True) from None
    return rows
