"""The index's columns: what each frame's row holds and the tshark field it is read from.

This is the index's interchange format (docs/pcap-index.md): any Parquet reader gets the same rows.
Bump SCHEMA_VERSION when a column changes meaning; an index of another version is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# 2: every occurrence read (layers.parquet, conversations, endpoints); SCTP ports. 3: lists, rel_ns, expert.
# 4: file_off (a capture of chosen frames is cut from the file: index/narrow.py). 5: the frames table a folder of
# files (frames/*.parquet), closed as the build goes: a building index answers from the frames it has closed.
SCHEMA_VERSION = 5

Kind = Literal["int64", "float64", "string"]


@dataclass(frozen=True)
class Column:
    name: str
    field: str  # the tshark field (`-e`) that fills it
    kind: Kind
    about: str
    many: bool = False  # every occurrence, in tree order (a list of `kind`); else the field occurs once

    @property
    def parquet_type(self) -> str:
        return f"list<{self.kind}>" if self.many else self.kind


# The packet list first, exactly as pcap_frames_by_filter shows it (shark/rows.py: the default columns),
# then the fields answers group and filter by.
COLUMNS: tuple[Column, ...] = (
    Column("number", "_ws.col.No.", "int64", "frame number, 1.. in file order"),
    Column("time_relative", "_ws.col.Time", "float64", "seconds since the first frame (the Time column)"),
    Column("src", "_ws.col.Source", "string", "the Source column"),
    Column("dst", "_ws.col.Destination", "string", "the Destination column"),
    Column("protocol", "_ws.col.Protocol", "string", "the Protocol column"),
    Column("length", "_ws.col.Length", "int64", "the Length column (bytes on the wire)"),
    Column("info", "_ws.col.Info", "string", "the Info column, two-pass (links to later frames resolved)"),
    Column("time_epoch", "frame.time_epoch", "string", "arrival time, Unix seconds as tshark prints them (exact)"),
    Column("rel_ns", "frame.time_relative", "int64", "nanoseconds since the first frame (exact at any resolution)"),
    Column("cap_len", "frame.cap_len", "int64", "bytes captured"),
    Column("file_off", "frame.file_off", "int64", "where the frame's record starts in the file (bytes)"),
    Column("protocols", "frame.protocols", "string", "the frame's protocol layers, colon-separated"),
    Column("expert_severities", "_ws.expert.severity", "int64", "each expert item's severity (8388608: Error)",
           many=True),
    Column("ip_src", "ip.src", "string", "IPv4 sources, outer first", many=True),
    Column("ip_dst", "ip.dst", "string", "IPv4 destinations, outer first", many=True),
    Column("ipv6_src", "ipv6.src", "string", "IPv6 sources, outer first", many=True),
    Column("ipv6_dst", "ipv6.dst", "string", "IPv6 destinations, outer first", many=True),
    Column("tcp_stream", "tcp.stream", "int64", "Wireshark's TCP stream indexes", many=True),
    Column("udp_stream", "udp.stream", "int64", "Wireshark's UDP stream indexes", many=True),
    Column("src_port", "tcp.srcport", "int64", "TCP source ports", many=True),
    Column("dst_port", "tcp.dstport", "int64", "TCP destination ports", many=True),
    Column("udp_src_port", "udp.srcport", "int64", "UDP source ports", many=True),
    Column("udp_dst_port", "udp.dstport", "int64", "UDP destination ports", many=True),
    Column("sctp_src_port", "sctp.srcport", "int64", "SCTP source ports", many=True),
    Column("sctp_dst_port", "sctp.dstport", "int64", "SCTP destination ports", many=True),
    Column("sctp_chunk_types", "sctp.chunk_type", "int64", "SCTP chunk types (0: DATA, 3: SACK...)", many=True),
)

# The packet-list columns in shark/rows.py's DEFAULT_COLUMNS order.
PACKET_LIST = ("number", "time_relative", "src", "dst", "protocol", "length", "info")


def by_field(field: str) -> Column | None:
    """The column a tshark field fills (None: not in the index)."""
    return next((col for col in COLUMNS if col.field == field), None)


def column(name: str) -> Column:
    for col in COLUMNS:
        if col.name == name:
            return col
    raise KeyError(name)
