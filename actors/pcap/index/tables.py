"""The index's derived tables: each frame's transport layers (layers.parquet) and, from them, the
conversations and endpoints Wireshark's conversation taps count (conversations.parquet, endpoints.parquet).

Wireshark 4.0's `ip`, `ipv6`, `udp`, `tcp` and `sctp` taps run once per layer a frame holds (an IP
packet tunnelled in GTP-U is counted twice: outer and inner), each with the addresses of the network
layer below it (pinfo's src/dst when the layer was dissected), the frame's length on the wire and its
time since the first frame. A conversation is keyed by its two ends (either way round) and, for UDP
and TCP, by Wireshark's stream index; its A end is the source of its first tap call, A-to-B frames are
those whose source is A; its start and stop are the least and greatest times seen (epan/conversation_table.c).
An endpoint is an address (with its port for a transport), counted as sender and as receiver.

tshark prints every occurrence of a field in tree order (`-E occurrence=a`), and `frame.protocols`
names the layers in the same order, so the k-th `udp` layer is the k-th `udp.srcport`, and its network
ends are those of the nearest `ip`/`ipv6` layer before it. The layers an ICMP error quotes are
dissected but not counted by the taps (no tap counts what an error packet quotes). A frame whose
counts disagree (a layer without its field: a bogus header) cannot be aligned: it is counted in
`meta.json` (`unaligned`), and the tables of those protocols are not answered from the index (the
caller is told why; sharkd answers).

This module imports nothing of diagd: the builder (build.py, a script of its own) loads it by path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

LAYERS_FILE = "layers.parquet"
CONVERSATIONS_FILE = "conversations.parquet"
ENDPOINTS_FILE = "endpoints.parquet"

NETWORK = ("ip", "ipv6")
ICMP = ("icmp", "icmpv6")  # what follows is the packet an ICMP error quotes (pinfo in_error_pkt): not tapped
TRANSPORT = ("udp", "tcp", "sctp")
PROTOCOLS = (*NETWORK, *TRANSPORT)
# Wireshark keys UDP and TCP conversations by stream index too (add_conversation_table_data_with_conv_id).
STREAMED = ("udp", "tcp")
# Per protocol: the frames-table columns holding every occurrence of its source, destination, stream.
FIELDS = {"ip": ("ip_src", "ip_dst", None), "ipv6": ("ipv6_src", "ipv6_dst", None),
          "udp": ("udp_src_port", "udp_dst_port", "udp_stream"),
          "tcp": ("src_port", "dst_port", "tcp_stream"), "sctp": ("sctp_src_port", "sctp_dst_port", None)}
LAYERED = tuple(sorted({c for f in FIELDS.values() for c in f if c is not None}))
KEPT_UNALIGNED = 5
AGGREGATOR = ","  # tshark's separator between occurrences (-E aggregator): no address or port holds one

LAYER_COLUMNS = (("number", "int64", "the frame"),
                 ("depth", "int64", "the layer's place in frame.protocols, 0.."),
                 ("layer", "string", "ip, ipv6, udp, tcp or sctp"),
                 ("net", "string", "the network layer below a transport (ip or ipv6); a network layer's own name"),
                 ("src", "string", "source address (of the network layer below, for a transport)"),
                 ("dst", "string", "destination address"),
                 ("src_port", "int64", "source port (a transport's; null for ip/ipv6)"),
                 ("dst_port", "int64", "destination port"),
                 ("stream", "int64", "Wireshark's stream index (udp, tcp; else null)"),
                 ("length", "int64", "the frame's length on the wire"),
                 ("rel_ns", "int64", "the frame's time since the first frame, in nanoseconds"))


def rel_ns(text: str) -> int:
    """The Time column's text (seconds since the first frame, exact digits) in nanoseconds."""
    sign = -1 if text.startswith("-") else 1
    whole, _, fraction = text.lstrip("-").partition(".")
    return sign * (int(whole or "0") * 1_000_000_000 + int((fraction + "000000000")[:9]))


def seconds(ns: int) -> float:
    """Nanoseconds as the nearest float to their exact decimal: what sharkd's taps print (`%.9f` of
    nstime_to_sec), so a time from the index and one from sharkd are the same number."""
    whole, fraction = divmod(abs(ns), 1_000_000_000)
    return float(f"{'-' if ns < 0 else ''}{whole}.{fraction:09d}")


def frame_layers(number: int, protocols: str, cells: dict[str, list[Any]], length: int, rel: int
                 ) -> tuple[list[tuple[Any, ...]], set[str]]:
    """One frame's layer rows (LAYER_COLUMNS order) and the protocols whose fields it cannot align."""
    rows: list[tuple[Any, ...]] = []
    seen = dict.fromkeys(PROTOCOLS, 0)
    below: tuple[str, str, str] | None = None  # the nearest network layer: (name, src, dst)
    broken: set[str] = set()
    quoted = False  # below an ICMP layer: the packet an error quotes, which no tap counts
    for depth, layer in enumerate(protocols.split(":")):
        if layer in ICMP:
            quoted = True
        if layer not in seen:
            continue
        k = seen[layer]
        seen[layer] += 1
        src_col, dst_col, stream_col = FIELDS[layer]
        srcs, dsts = cells[src_col], cells[dst_col]
        if k >= len(srcs) or k >= len(dsts):
            broken.add(layer)
            continue
        if layer in NETWORK:
            below = (layer, srcs[k], dsts[k])
            if not quoted:
                rows.append((number, depth, layer, layer, srcs[k], dsts[k], None, None, None, length, rel))
            continue
        streams = cells[stream_col] if stream_col else []
        if below is None or (stream_col and k >= len(streams)):
            broken.add(layer)
            continue
        if quoted:
            continue
        rows.append((number, depth, layer, below[0], below[1], below[2], int(srcs[k]), int(dsts[k]),
                     int(streams[k]) if stream_col else None, length, rel))
    for layer, count in seen.items():
        src_col, dst_col, stream_col = FIELDS[layer]
        if any(len(cells[c]) != count for c in (src_col, dst_col, stream_col) if c is not None):
            broken.add(layer)
    if broken & set(NETWORK):
        broken |= set(TRANSPORT)  # a transport's ends are its network layer's
    return rows, broken


def batch_layers(numbers: Sequence[int], protocols: Sequence[str | None], lengths: Sequence[int],
                 times: Sequence[str], cells: dict[str, Sequence[list[Any] | None]],
                 unaligned: dict[str, list[int]]) -> Iterator[tuple[Any, ...]]:
    """The layer rows of a block of frames; frames that cannot be aligned counted in `unaligned`
    (per protocol: [how many, the first KEPT_UNALIGNED of them...])."""
    for i, number in enumerate(numbers):
        stack = protocols[i]
        if not stack:
            continue
        rows, broken = frame_layers(number, stack, {c: cells[c][i] or [] for c in LAYERED}, lengths[i],
                                    rel_ns(times[i]))
        for layer in broken:
            noted = unaligned.setdefault(layer, [0])
            noted[0] += 1
            if len(noted) <= KEPT_UNALIGNED:
                noted.append(number)
        yield from rows


# The aggregation (DuckDB, over layers.parquet at the end of a build). `seq` orders tap calls as tshark
# made them: by frame, then by layer.
_TAPS = """
    SELECT *, number * 1024 + depth AS seq,
           src || '/' || coalesce(CAST(src_port AS VARCHAR), '') AS s_end,
           dst || '/' || coalesce(CAST(dst_port AS VARCHAR), '') AS d_end
    FROM read_parquet({layers})"""

CONVERSATIONS_SQL = """
WITH t AS ({taps}),
k AS (SELECT *, least(s_end, d_end) AS k1, greatest(s_end, d_end) AS k2,
             CASE WHEN layer IN ('udp', 'tcp') THEN stream ELSE -1 END AS conv_id FROM t),
g AS (SELECT layer, k1, k2, conv_id, arg_min(s_end, seq) AS a_end, min(seq) AS first FROM k GROUP BY ALL)
SELECT k.layer, arg_min(k.net, k.seq) AS net, arg_min(k.src, k.seq) AS a_addr, arg_min(k.src_port, k.seq) AS a_port,
       arg_min(k.dst, k.seq) AS b_addr, arg_min(k.dst_port, k.seq) AS b_port, k.conv_id,
       count(*) AS frames, sum(k.length) AS bytes,
       count(*) FILTER (WHERE k.s_end = g.a_end) AS a_to_b_frames,
       coalesce(sum(k.length) FILTER (WHERE k.s_end = g.a_end), 0) AS a_to_b_bytes,
       count(*) FILTER (WHERE k.s_end <> g.a_end) AS b_to_a_frames,
       coalesce(sum(k.length) FILTER (WHERE k.s_end <> g.a_end), 0) AS b_to_a_bytes,
       min(k.rel_ns) AS start_ns, max(k.rel_ns) AS stop_ns, min(g.first) AS first
FROM k JOIN g USING (layer, k1, k2, conv_id)
GROUP BY k.layer, k.k1, k.k2, k.conv_id
ORDER BY k.layer, first"""

ENDPOINTS_SQL = """
WITH t AS ({taps}),
e AS (SELECT layer, net, src AS addr, src_port AS port, 1 AS tx, length, seq * 2 AS o FROM t
      UNION ALL SELECT layer, net, dst, dst_port, 0, length, seq * 2 + 1 FROM t)
SELECT layer, arg_min(net, o) AS net, addr, port, count(*) AS frames, sum(length) AS bytes,
       count(*) FILTER (WHERE tx = 1) AS tx_frames, coalesce(sum(length) FILTER (WHERE tx = 1), 0) AS tx_bytes,
       count(*) FILTER (WHERE tx = 0) AS rx_frames, coalesce(sum(length) FILTER (WHERE tx = 0), 0) AS rx_bytes,
       min(o) AS first
FROM e GROUP BY layer, addr, port ORDER BY layer, first"""


def quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def write_tables(folder: Path, memory_limit: str = "512MB") -> None:
    """conversations.parquet and endpoints.parquet from folder/layers.parquet (DuckDB; spills into the
    build's own folder, never the daemon's working directory)."""
    import duckdb

    taps = _TAPS.format(layers=quoted(folder / LAYERS_FILE))
    spill = folder / ".spill"
    with duckdb.connect(config={"memory_limit": memory_limit, "threads": 2,
                                "temp_directory": str(spill)}) as con:
        for sql, name in ((CONVERSATIONS_SQL, CONVERSATIONS_FILE), (ENDPOINTS_SQL, ENDPOINTS_FILE)):
            con.execute(f"COPY ({sql.format(taps=taps)}) TO {quoted(folder / name)} "
                        "(FORMAT parquet, COMPRESSION zstd)")
    if spill.exists():
        for leftover in spill.iterdir():
            leftover.unlink()
        spill.rmdir()
