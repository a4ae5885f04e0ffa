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

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FRAMES_DIR = "frames"  # the frames table: a folder of Parquet files in frame order (build.py writes them)
FRAMES_GLOB = "*.parquet"  # its closed files (the one being written ends `.writing`)
LAYERS_FILE = "layers.parquet"
CONVERSATIONS_FILE = "conversations.parquet"
ENDPOINTS_FILE = "endpoints.parquet"

NETWORK = ("ip", "ipv6")
ICMP = ("icmp", "icmpv6")  # what follows is the packet an ICMP error quotes (pinfo in_error_pkt): not tapped
# Other dissectors that quote a packet (in_error_pkt): PPP LCP Protocol-Reject, NHRP, SCCP UDTS, CLNP.
QUOTERS = ("lcp", "nhrp", "sccp", "clnp")
ERROR_SEVERITY = 8388608  # _ws.expert.severity of an Error (PI_ERROR)
TRANSPORT = ("udp", "tcp", "sctp")
PROTOCOLS = (*NETWORK, *TRANSPORT)
# Wireshark keys UDP and TCP conversations by stream index too (add_conversation_table_data_with_conv_id).
STREAMED = ("udp", "tcp")
# Per protocol: the frames-table columns holding every occurrence of its source, destination, stream.
FIELDS = {"ip": ("ip_src", "ip_dst", None), "ipv6": ("ipv6_src", "ipv6_dst", None),
          "udp": ("udp_src_port", "udp_dst_port", "udp_stream"),
          "tcp": ("src_port", "dst_port", "tcp_stream"), "sctp": ("sctp_src_port", "sctp_dst_port", None)}
# The frames-table columns of many occurrences a frame's layer rows are read from.
LAYERED = (*sorted({c for f in FIELDS.values() for c in f if c is not None}), "sctp_chunk_types")
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
    """frame.time_relative's text (seconds since the first frame, to the nanosecond) in nanoseconds."""
    sign = -1 if text.startswith("-") else 1
    whole, _, fraction = text.lstrip("-").partition(".")
    return sign * (int(whole or "0") * 1_000_000_000 + int((fraction + "000000000")[:9]))


def seconds(ns: int) -> float:
    """Nanoseconds as the nearest float to their exact decimal: what sharkd's taps print (`%.9f` of
    nstime_to_sec), so a time from the index and one from sharkd are the same number."""
    whole, fraction = divmod(abs(ns), 1_000_000_000)
    return float(f"{'-' if ns < 0 else ''}{whole}.{fraction:09d}")


def _doubtful(layers: list[str], severities: list[int]) -> str | None:
    """Why no tap count of this frame can be read off its fields (None: it can). Each is a case where a
    dissector adds a layer's fields and then does not (or not as they say) queue its tap: an error in
    a network or transport layer (a bogus header ends the dissection before the tap), a routing header
    (the tap takes the final destination), a packet quoted by something other than an ICMP error,
    a layer after an ICMP layer that it does not quote (two packets in one frame)."""
    named = [x for x in layers if not x.startswith("_ws.")]
    last = named[-1] if named else ""
    if max(severities, default=0) >= ERROR_SEVERITY and (last in PROTOCOLS or last.startswith("ipv6.")):
        return "an error in a network or transport layer"
    if "ipv6.routing" in layers:
        return "an IPv6 routing header"
    for i, layer in enumerate(layers):
        if layer in QUOTERS and any(x in NETWORK for x in layers[i + 1:]):
            return f"a packet quoted by {layer}"
        if layer in ICMP:
            after = next((j for j in range(i + 1, len(layers)) if layers[j] in NETWORK), None)
            if after is not None and after != i + 1:  # an error's quoted packet starts right after it
                return "a packet after an ICMP message that does not quote it"
    return None


@dataclass(frozen=True)
class Stack:
    """What frame_layers reads off a frame.protocols text alone, the same for every frame of that stack."""

    steps: tuple[tuple[int, str, int, bool], ...]  # each tapped layer: depth, name, occurrence, quoted by ICMP
    counts: tuple[tuple[str, int], ...]  # occurrences of each tapped protocol's fields the stack holds
    structural: bool  # doubtful whatever the frame's expert items (_doubtful)
    error_sensitive: bool  # doubtful when the frame has an Error (its last layer a network or transport one)
    sctp: bool


def stack_of(protocols: str) -> Stack:
    layers = protocols.split(":")
    named = [x for x in layers if not x.startswith("_ws.")]
    last = named[-1] if named else ""
    seen = dict.fromkeys(PROTOCOLS, 0)
    steps: list[tuple[int, str, int, bool]] = []
    quoted = False  # the packet an ICMP error quotes, which no tap counts (right after its ICMP layer)
    for depth, layer in enumerate(layers):
        if layer in ICMP:
            quoted = True
        if layer in seen:
            steps.append((depth, layer, seen[layer], quoted))
            seen[layer] += 1
    return Stack(tuple(steps), tuple(seen.items()), _doubtful(layers, []) is not None,
                 last in PROTOCOLS or last.startswith("ipv6."), "sctp" in layers)


def frame_layers(number: int, protocols: str, cells: dict[str, list[Any]], length: int, rel: int | None,
                 severities: list[int] | None = None, occurrences: list[int] | None = None,
                 stacks: dict[str, Stack] | None = None, hidden: list[tuple[tuple[Any, ...], int]] | None = None
                 ) -> tuple[list[tuple[Any, ...]], set[str]]:
    """One frame's layer rows (LAYER_COLUMNS order) and the protocols whose fields it cannot align;
    `occurrences` gets, per row, which occurrence of its protocol's fields it was read from; `stacks`
    keeps what each frame.protocols text says (stack_of) for the next frames of a build; `hidden` gets
    the transport layers an ICMP error quotes, no tap's but with stream numbers: (row, occurrence)."""
    stack = stacks.get(protocols) if stacks is not None else None
    if stack is None:
        stack = stack_of(protocols)
        if stacks is not None:
            stacks[protocols] = stack
    worst = max(severities or [0])
    if rel is None or stack.structural or (stack.error_sensitive and worst >= ERROR_SEVERITY):
        return [], set(PROTOCOLS)
    rows: list[tuple[Any, ...]] = []
    below: tuple[str, str, str] | None = None  # the nearest network layer: (name, src, dst)
    broken: set[str] = set()
    if stack.sctp and (worst >= ERROR_SEVERITY or not cells.get("sctp_chunk_types")):
        # SCTP queues its tap after its chunks: an error in them (an NGAP dissector's exception) or no
        # chunk at all, and it does not count the packet.
        broken.add("sctp")
    for depth, layer, k, quoted in stack.steps:
        src_col, dst_col, stream_col = FIELDS[layer]
        srcs, dsts = cells[src_col], cells[dst_col]
        if k >= len(srcs) or k >= len(dsts):
            broken.add(layer)
            continue
        if layer in NETWORK:
            below = (layer, srcs[k], dsts[k])
            if not quoted:
                rows.append((number, depth, layer, layer, srcs[k], dsts[k], None, None, None, length, rel))
                if occurrences is not None:
                    occurrences.append(k)
            continue
        streams = cells[stream_col] if stream_col else []
        if below is None or (stream_col and k >= len(streams)):
            broken.add(layer)
            continue
        row = (number, depth, layer, below[0], below[1], below[2], int(srcs[k]), int(dsts[k]),
               int(streams[k]) if stream_col else None, length, rel)
        if quoted:
            if hidden is not None:
                hidden.append((row, k))
            continue
        rows.append(row)
        if occurrences is not None:
            occurrences.append(k)
    for layer, count in stack.counts:
        src_col, dst_col, stream_col = FIELDS[layer]
        if len(cells[src_col]) != count or len(cells[dst_col]) != count or (
                stream_col is not None and len(cells[stream_col]) != count):
            broken.add(layer)
    if broken & set(NETWORK):
        broken |= set(TRANSPORT)  # a transport's ends are its network layer's
    return rows, broken


def batch_layers(numbers: Sequence[int], protocols: Sequence[str | None], lengths: Sequence[int],
                 times: Sequence[int | None], severities: Sequence[list[int] | None],
                 cells: dict[str, Sequence[list[Any] | None]], unaligned: dict[str, list[int]],
                 occurrences: list[int] | None = None, stacks: dict[str, Stack] | None = None,
                 hidden: list[tuple[tuple[Any, ...], int]] | None = None,
                 noted_as: Callable[[int], int | None] | None = None) -> Iterator[tuple[Any, ...]]:
    """The layer rows of a block of frames; frames that cannot be aligned counted in `unaligned`
    (per protocol: [how many, the first KEPT_UNALIGNED of them...]), by the number `noted_as` gives a
    frame (a chunk's pass: the whole file's; None: a frame counted in another chunk, not again);
    `occurrences` and `stacks` as frame_layers'; `hidden` too."""
    for i, number in enumerate(numbers):
        stack = protocols[i]
        if not stack:
            continue
        rows, broken = frame_layers(number, stack, {c: cells[c][i] or [] for c in LAYERED}, lengths[i],
                                    times[i], severities[i], occurrences, stacks, hidden)
        counted = number if noted_as is None else noted_as(number)
        if counted is not None:
            _note(unaligned, broken, counted)
        yield from rows


def _note(unaligned: dict[str, list[int]], broken: set[str], number: int) -> None:
    for layer in broken:
        noted = unaligned.setdefault(layer, [0])
        noted[0] += 1
        if len(noted) <= KEPT_UNALIGNED:
            noted.append(number)


# The aggregation (DuckDB, over layers.parquet at the end of a build). `seq` orders tap calls as tshark
# made them: by frame, then by layer.
_TAPS = """
    SELECT *, number * 65536 + depth AS seq,
           src || '/' || coalesce(CAST(src_port AS VARCHAR), '') AS s_end,
           dst || '/' || coalesce(CAST(dst_port AS VARCHAR), '') AS d_end,
           number IN (SELECT number FROM {seams}) AS seam
    FROM read_parquet({layers})"""
SEAMS_FILE = "seams.parquet"  # a chunked build's seam frames (stitch.py): the rows they are in are counted

# One aggregation, no join (memory): a tap call is "forward" when its source end is the lesser end
# of its conversation; A is the source of the first call, so A-to-B are the calls whose direction is
# that first call's.
CONVERSATIONS_SQL = """
WITH t AS ({taps}),
k AS (SELECT *, least(s_end, d_end) AS k1, greatest(s_end, d_end) AS k2, s_end = least(s_end, d_end) AS fwd,
             CASE WHEN layer IN ('udp', 'tcp') THEN stream ELSE -1 END AS conv_id FROM t),
g AS (SELECT layer, arg_min(net, seq) AS net, arg_min(src, seq) AS a_addr, arg_min(src_port, seq) AS a_port,
             arg_min(dst, seq) AS b_addr, arg_min(dst_port, seq) AS b_port, conv_id,
             count(*) AS frames, sum(length) AS bytes, arg_min(fwd, seq) AS a_fwd,
             count(*) FILTER (WHERE fwd) AS f_frames, coalesce(sum(length) FILTER (WHERE fwd), 0) AS f_bytes,
             count(*) FILTER (WHERE NOT fwd) AS r_frames, coalesce(sum(length) FILTER (WHERE NOT fwd), 0) AS r_bytes,
             min(rel_ns) AS start_ns, max(rel_ns) AS stop_ns, min(seq) AS first,
             count(*) FILTER (WHERE seam) AS seam_frames
      FROM k GROUP BY layer, k1, k2, conv_id)
SELECT layer, net, a_addr, a_port, b_addr, b_port, conv_id, frames, bytes,
       CASE WHEN a_fwd THEN f_frames ELSE r_frames END AS a_to_b_frames,
       CASE WHEN a_fwd THEN f_bytes ELSE r_bytes END AS a_to_b_bytes,
       CASE WHEN a_fwd THEN r_frames ELSE f_frames END AS b_to_a_frames,
       CASE WHEN a_fwd THEN r_bytes ELSE f_bytes END AS b_to_a_bytes,
       start_ns, stop_ns, first, seam_frames
FROM g ORDER BY layer, first"""

ENDPOINTS_SQL = """
WITH t AS ({taps}),
e AS (SELECT layer, net, src AS addr, src_port AS port, 1 AS tx, length, seq * 2 AS o, number, seam FROM t
      UNION ALL SELECT layer, net, dst, dst_port, 0, length, seq * 2 + 1, number, seam FROM t)
SELECT layer, arg_min(net, o) AS net, addr, port, count(*) AS frames, sum(length) AS bytes,
       count(*) FILTER (WHERE tx = 1) AS tx_frames, coalesce(sum(length) FILTER (WHERE tx = 1), 0) AS tx_bytes,
       count(*) FILTER (WHERE tx = 0) AS rx_frames, coalesce(sum(length) FILTER (WHERE tx = 0), 0) AS rx_bytes,
       min(o) AS first, count(*) FILTER (WHERE seam) AS seam_frames
FROM e GROUP BY layer, addr, port ORDER BY layer, first"""


def quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def frame_files(folder: Path) -> list[Path]:
    """The closed files of the frames table of the index (or the build) in `folder`, in frame order."""
    return sorted((folder / FRAMES_DIR).glob(FRAMES_GLOB))


def files_holding(files: Sequence[Path], lo: int, hi: int) -> list[Path]:
    """Which of the frames table's files (frame_files: each named by its first frame's number, in order)
    hold frames numbered lo..hi; the last when none does (a question past the end reads one file, and
    finds nothing)."""
    firsts = [int(f.name.split(".")[0]) for f in files]
    held = [f for i, f in enumerate(files) if firsts[i] <= hi and (i + 1 == len(files) or firsts[i + 1] > lo)]
    return held or list(files[-1:])


def frames_table(files: Sequence[Path]) -> str:
    """These files of a frames table as one table (a FROM clause): each named, never a glob DuckDB would
    expand in the state directory's own path."""
    return f"read_parquet([{', '.join(quoted(f) for f in files)}])"


def summary(con: Any, frames: str, count: int) -> dict[str, Any]:
    """What pcap_index says of the whole capture from its frames table (`frames`, a FROM clause; `count`
    frames): the first and last frame's arrival time (Unix seconds, tshark's text) and the protocols in
    the order they first appear (by frame, then layer). The build keeps it in meta.json (a daemon
    starting answers without reading the frames); an index from before reads it here, a second a few
    GB: the distinct layer stacks (a handful) with their first frame, not every frame's layers."""
    edges = dict(con.execute(f"SELECT number, time_epoch FROM {frames} WHERE number = 1 OR number = ?",
                             [count]).fetchall())
    # The latest arrival of any frame (frames out of time order: the last frame's may be earlier), where
    # sharkd's `analyse` ends the capture: a request's response timer runs to it (answers/index_srt.py).
    (latest,) = con.execute(f"SELECT max(CAST(time_epoch AS DOUBLE)) FROM {frames}").fetchone() or (None,)
    protocols: dict[str, None] = {}
    for (stack,) in con.execute(f"SELECT protocols FROM {frames} WHERE protocols IS NOT NULL "
                                "GROUP BY protocols ORDER BY min(number)").fetchall():
        protocols.update(dict.fromkeys(stack.split(":")))
    return {"first_epoch": edges.get(1), "last_epoch": edges.get(count), "latest_epoch": latest,
            "protocols": list(protocols)}


def write_tables(folder: Path, memory_limit: str = "640MB") -> str | None:
    """conversations.parquet and endpoints.parquet from folder/layers.parquet (DuckDB, spilling into the
    build's own folder, never the daemon's working directory); why they could not be written (None:
    they were). Without them the index still pages and the tables go to sharkd."""
    import duckdb

    seams = (f"read_parquet({quoted(folder / SEAMS_FILE)})" if (folder / SEAMS_FILE).is_file()
             else "(SELECT NULL::BIGINT AS number WHERE false)")
    taps = _TAPS.format(layers=quoted(folder / LAYERS_FILE), seams=seams)
    spill = folder / ".spill"
    try:
        with duckdb.connect(config={"memory_limit": memory_limit, "threads": 2, "temp_directory": str(spill)}) as con:
            con.execute("PRAGMA disable_progress_bar")
            for sql, name in ((CONVERSATIONS_SQL, CONVERSATIONS_FILE), (ENDPOINTS_SQL, ENDPOINTS_FILE)):
                con.execute(f"COPY ({sql.format(taps=taps)}) TO {quoted(folder / name)} "
                            "(FORMAT parquet, COMPRESSION zstd)")
    except duckdb.Error as exc:
        for name in (CONVERSATIONS_FILE, ENDPOINTS_FILE):
            (folder / name).unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        if spill.exists():
            for leftover in spill.iterdir():
                leftover.unlink()
            spill.rmdir()
    return None
