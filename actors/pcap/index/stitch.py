"""One capture's rows from the passes of a chunked build: frame and stream numbers as one pass gives them,
and the frames whose dissection may have needed another chunk's frames (the seams).

A capture bigger than a chunk is read by one two-pass tshark per chunk (build.py: tshark's memory grows
with what it reads, ~3 MB per MB of dense user plane). Each chunk's file is the capture's header, the
capture's first packet, then the chunk's records: every time relative to the first frame is then the
whole file's, and the first frame's row is dropped. Each pass numbers its frames and Wireshark's TCP and
UDP streams from its own start; a Stitcher renumbers them.

Stream numbers: Wireshark gives a stream its number when it opens the conversation, in the order they
open. A pass over chunk k opens, in that order, the conversations of chunk k's frames; the whole file's
pass would open only those not already open (their ends not seen in earlier chunks), and a TCP
conversation again when a SYN (without ACK) comes whose sequence number differs from the one the open
conversation's first segment that way set (epan/dissectors/packet-tcp.c, 4.0: "ports reused"). A
Stitcher keeps, per conversation's ends, the last stream opened and those first sequence numbers, and
numbers each chunk's streams, in the order the chunk's pass opened them, as the whole file's pass would.
Where that rule and the chunk's pass disagree about a conversation that spans a seam (the chunk's pass
opened a second one, or the whole file's would have), the stream is *doubted*: its frames are seam
frames, named in seams.parquet.

Seam frames (build.py writes them, with why, in seams.parquet): the frames of every TCP conversation and
SCTP association with frames in more than one chunk (reassembly, sequence analysis, the links between
frames of one conversation), IP fragments of a packet not reassembled in their chunk, and the frames of
doubted streams. Every other frame's row is what one pass over the whole file gives
(tests/e2e/test_pcap_index_chunked.py holds them to it on every corpus capture, in chunks of a few
frames).

This module imports nothing of diagd: the builder (build.py, a script of its own) loads it by path.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SYN, ACK = 0x02, 0x10
NO_BASE = -1
CHUNKS_MAX = 1 << 20  # chunks of one capture at most (128 MB each: 128 TB)
# Read by chunked passes only (appended to the index's fields; never stored): TCP's flags and raw sequence
# numbers (the stream rule above) and whether an IP packet is a fragment and was reassembled in its pass.
BUILD_FIELDS = (("tcp_flags", "tcp.flags"), ("tcp_seq_raw", "tcp.seq_raw"),
                ("ip_mf", "ip.flags.mf"), ("ip_frag_offset", "ip.frag_offset"),
                ("ip_reassembled_in", "ip.reassembled_in"), ("ip_fragment", "ip.fragment"),
                ("ipv6_more", "ipv6.fraghdr.more"), ("ipv6_frag_offset", "ipv6.fraghdr.offset"),
                ("ipv6_reassembled_in", "ipv6.reassembled.in"), ("ipv6_fragment", "ipv6.fragment"))
# Protocols whose messages set up conversations of other protocols on other ports (SDP: RTP, RTCP, T.38,
# MSRP; H.245, MGCP, RTSP, Skinny, FTP, TFTP...): their frames are replayed ahead of later chunks.
SETUP_PROTOCOLS = frozenset({"sdp", "h245", "h225", "rtsp", "ftp", "tftp", "mgcp", "megaco", "skinny", "unistim",
                             "portmap", "msrp", "h248"})
# frame.protocols of a setup frame (Stitcher.see_setups): picks them from a block.
SETUP_STACK = "(^|:)(" + "|".join(sorted(SETUP_PROTOCOLS)) + ")(:|$)"
REPLAYED = 4096  # setup frames replayed ahead of a chunk at most (the latest); more are noted in meta.json
# Frame numbers Wireshark writes into the Info column: renumbered as the whole file's.
INFO_NUMBERS = (r"(\((?:reply|request) in |\((?:Call|Reply) In |\[Reassembled in #|\[RPC (?:retransmission|duplicate) "
                r"of #|\[TCP Dup ACK )([1-9]\d*)([)\]#])")  # RE2 (Arrow's) too: no lookahead
SEAMS_FILE = "seams.parquet"  # tables.SEAMS_FILE
SEAM_COLUMNS = (("number", "int64", "the frame"),
                ("why", "string", "tcp, sctp, udp: its conversation has frames in another chunk (not a tunnel's "
                                  "UDP); icmp: its ends exchanged ICMP in another chunk; fragment: an IP fragment "
                                  "not reassembled in its chunk; arp: after the first chunk (duplicate address "
                                  "detection); doubted: its stream's number; numbering: a stream after one "
                                  "numbered without its ends"))


def _number(text: str) -> int:
    """A field's number as tshark prints it (hexadecimal for some: tcp.flags)."""
    return int(text, 16) if text.startswith("0x") else int(text)


def _true(text: str) -> bool:
    return text not in ("0", "False", "")


class _Streams:
    """One transport's stream numbers across chunks."""

    def __init__(self, syn_rule: bool) -> None:
        self.syn_rule = syn_rule
        self.opened = 0
        # Per conversation ever seen (millions in 10 GB), so kept small: ends' hash -> the last stream
        # opened * CHUNKS_MAX + the chunk it opened in; per stream and way (stream * 2 + direction), the
        # first segment's sequence number (NO_BASE: none yet), in an array.
        self.last: dict[int, int] = {}
        self.bases = array("q")
        self.doubted: set[int] = set()
        self.chunk = 0
        self.local: list[int] = []  # this chunk's stream k -> the whole file's
        self.seen_here: set[int] = set()  # ends this chunk's pass has opened a conversation of
        self.unsure = False  # a stream was numbered without its ends since the Stitcher last looked

    def begin(self, chunk: int) -> None:
        self.chunk, self.local, self.seen_here = chunk, [], set()

    def _new(self, ends: int) -> int:
        stream = self.opened
        self.opened += 1
        self.last[ends] = stream * CHUNKS_MAX + self.chunk
        self.bases.extend((NO_BASE, NO_BASE))
        return stream

    def _open(self, ends: int, direction: int, flags: int, seq: int) -> int:
        known = self.last.get(ends)
        if known is None:
            return self._new(ends)
        stream, born = divmod(known, CHUNKS_MAX)
        if self._reused(stream, direction, flags, seq):
            return self._new(ends)
        if ends in self.seen_here:
            # This pass opened another conversation of these ends where the whole file's would not: its
            # rule ran on its own first segments, not the whole file's (the conversation began before).
            if born < self.chunk:
                self.doubted.add(stream)
                return stream
            return self._new(ends)  # begun in this chunk: the same first segments, the same rule
        return stream

    def _reused(self, stream: int, direction: int, flags: int, seq: int) -> bool:
        base = self.bases[stream * 2 + direction]
        return self.syn_rule and flags & (SYN | ACK) == SYN and base != NO_BASE and seq != base

    def see(self, local: int, ends: int, direction: int, flags: int, seq: int, replayed: bool) -> None:
        """A layer of this chunk's pass: its stream `local`, its conversation's ends (hashed), which way."""
        while len(self.local) < local:  # opened by a layer no row shows (a frame that cannot be aligned)
            self._placeholder()
        if len(self.local) == local:
            if replayed:  # the capture's first frame again, ahead of the chunk: its conversation, as it is now
                known = self.last.get(ends)
                self.local.append(known // CHUNKS_MAX if known is not None else self._new(ends))
            else:
                self.local.append(self._open(ends, direction, flags, seq))
            self.seen_here.add(ends)
            if replayed:
                return
        elif replayed:
            return
        stream = self.local[local]
        if not self.syn_rule:
            return
        if self._reused(stream, direction, flags, seq) and self.last.get(ends, 0) % CHUNKS_MAX < self.chunk:
            # The whole file's pass would open a new conversation here; this one did not: the rows cannot
            # say which is which, so both are doubted, and the count goes on as the whole file's.
            self.doubted.update((stream, self._new(ends)))
            return
        if self.bases[stream * 2 + direction] == NO_BASE:
            self.bases[stream * 2 + direction] = seq if flags & SYN else (seq - 1) & 0xFFFFFFFF

    def mapping(self, highest: int) -> list[int]:
        """This chunk's streams 0..highest, numbered as in the whole file."""
        while len(self.local) <= highest:
            self._placeholder()
        return self.local

    def _placeholder(self) -> None:
        """A stream this chunk's pass opened on a layer whose ends no row shows: numbered as new. After
        the first chunk that may be wrong (the whole file's pass may have found it open), and every
        stream numbered after it with it: `unsure` says so."""
        self.local.append(self._new(hash(("unseen", self.chunk, len(self.local)))))
        if self.chunk:
            self.doubted.add(self.local[-1])
            self.unsure = True


class Stitcher:
    """Renumbers the rows of one chunk's pass after another (see the module's docstring)."""

    def __init__(self) -> None:
        self.streams = {"tcp": _Streams(syn_rule=True), "udp": _Streams(syn_rule=False)}
        self.chunk = 0
        self.before = 0  # packets before this chunk
        self.offset_shift = 0  # from a record's offset in the chunk's file to its offset in the capture
        self.replayed: list[int] = []  # the frames replayed ahead of this chunk's (their whole file's numbers)
        self.fragments: list[int] = []  # frames (the whole file's numbers) of fragments not reassembled
        self.unsure_from: int | None = None  # from this frame on, stream numbers may be off (note_unsure)
        # (number, file offset) of the latest frames that set up other conversations; how many in all.
        self.setups: deque[tuple[int, int]] = deque(maxlen=REPLAYED)
        self.setups_seen = 0

    def begin(self, chunk: int, before: int, offset_shift: int, replayed: Sequence[int] = ()) -> None:
        self.chunk, self.before, self.offset_shift, self.replayed = chunk, before, offset_shift, list(replayed)
        for streams in self.streams.values():
            streams.begin(chunk)

    def number(self, local: int) -> int:
        """The whole file's number of this chunk's frame `local` (after the first chunk, its replayed frames first)."""
        if local <= len(self.replayed):
            return self.replayed[local - 1]
        return local - len(self.replayed) + self.before

    def is_replayed(self, local: int) -> bool:
        return local <= len(self.replayed)

    def whole_number(self, local: int) -> int | None:
        """The whole file's number of this chunk's frame `local`; None for a replayed frame (another
        chunk's, told of there)."""
        return None if self.is_replayed(local) else self.number(local)

    def replay(self) -> list[tuple[int, int]]:
        """The frames that set up other conversations to replay ahead of the next chunk (SDP: RTP's; so the
        chunk's pass reads those as the whole file's): the latest REPLAYED."""
        return list(self.setups)

    def see(self, rows: Sequence[tuple[Any, ...]], occurrences: Sequence[int | None], first_local: int,
            cells: dict[str, Any]) -> None:
        """A block's layer rows (tables.LAYER_COLUMNS, this chunk's numbers) and its frames' build fields:
        `tcp_flags` and `tcp_seq_raw` per frame of the block from `first_local`, and `fragments`: (the
        frame's place in the block, its other BUILD_FIELDS) of the frames that may be IP fragments."""
        for row, k in zip(rows, occurrences, strict=True):
            layer = row[2]
            streams = self.streams.get(layer)
            if streams is None:
                continue
            number, src, dst, sport, dport, local = row[0], row[4], row[5], row[6], row[7], row[8]
            forward = (src, sport) <= (dst, dport)
            ends = hash((layer, src, sport, dst, dport) if forward else (layer, dst, dport, src, sport))
            flags = seq = 0
            if k is None:  # a layer an ICMP error quotes: its stream, never its sequence numbers
                streams.see(local, ends, 0 if forward else 1, 0, 0, replayed=True)
                continue
            if layer == "tcp":
                i = number - first_local
                flag_cells, seq_cells = cells["tcp_flags"][i] or [], cells["tcp_seq_raw"][i] or []
                flags = _number(flag_cells[k]) if k < len(flag_cells) else 0
                seq = int(seq_cells[k]) if k < len(seq_cells) else 0
            streams.see(local, ends, 0 if forward else 1, flags, seq, replayed=self.is_replayed(number))
        for i, frame in cells["fragments"]:
            if self._unassembled_fragment(frame):
                local = first_local + i
                if not self.is_replayed(local):
                    self.fragments.append(self.number(local))

    def see_setups(self, numbers: Sequence[int], offsets: Sequence[int]) -> None:
        """Frames (the whole file's numbers, the replayed left out) that set up other conversations."""
        self.setups.extend(zip(numbers, offsets, strict=True))
        self.setups_seen += len(numbers)

    @staticmethod
    def _unassembled_fragment(frame: dict[str, list[Any]]) -> bool:
        fragment = (any(_true(str(x)) for x in frame["ip_mf"] + frame["ipv6_more"])
                    or any(_number(str(x)) for x in frame["ip_frag_offset"] + frame["ipv6_frag_offset"]))
        assembled = any(frame[name] for name in ("ip_reassembled_in", "ip_fragment", "ipv6_reassembled_in",
                                                 "ipv6_fragment"))
        return fragment and not assembled

    def mapping(self, layer: str, highest: int) -> list[int]:
        return self.streams[layer].mapping(highest)

    def note_unsure(self, first_local: int) -> None:
        """After a block: if a stream was numbered without its ends, every stream number from the block's
        first frame on may be off (seams.parquet: `numbering`)."""
        for streams in self.streams.values():
            if streams.unsure:
                streams.unsure = False
                at = self.number(max(first_local, len(self.replayed) + 1))
                self.unsure_from = at if self.unsure_from is None else min(self.unsure_from, at)

    def doubted(self, layer: str) -> set[int]:
        return self.streams[layer].doubted


# A conversation spans chunks when a chunk starts after its first frame and at or before its last (no
# join of every layer row with the chunk it is in). Its ends are hashed (64 bits): two conversations
# hashed alike are one here, which can only mark more frames, never fewer.
_SEAMS_SQL = """
WITH c AS (SELECT unnest(?) AS first),
l AS (SELECT number, depth, layer, stream,
             least(hash(src, src_port), hash(dst, dst_port)) AS k1,
             greatest(hash(src, src_port), hash(dst, dst_port)) AS k2
      FROM read_parquet({layers}) WHERE layer IN ('tcp', 'sctp', 'udp')),
tunnels AS (SELECT l.number, l.depth FROM read_parquet({layers}) l
            JOIN {frames} f USING (number)
            WHERE l.layer = 'udp' AND string_split(f.protocols, ':')[l.depth + 2] IN ('gtp', 'vxlan', 'geneve')
              AND string_split(f.protocols, ':')[l.depth + 3] IN ('ip', 'ipv6', 'eth')),
stateful AS (SELECT l.* FROM l WHERE layer IN ('tcp', 'sctp')
             UNION ALL SELECT l.* FROM l ANTI JOIN tunnels t USING (number, depth) WHERE layer = 'udp'),
spans AS (SELECT layer, k1, k2, min(number) AS lo, max(number) AS hi FROM stateful GROUP BY ALL),
spanning AS (SELECT DISTINCT layer, k1, k2 FROM spans s JOIN c ON c.first > s.lo AND c.first <= s.hi),
doubted AS (SELECT unnest(?) AS layer, unnest(?) AS stream),
-- ICMP between the same innermost ends in two chunks (an echo and its reply, an error and what it answers)
ends AS (SELECT number, CASE WHEN len(ip_src) > 0 THEN ip_src[-1] ELSE ipv6_src[-1] END AS s,
                CASE WHEN len(ip_src) > 0 THEN ip_dst[-1] ELSE ipv6_dst[-1] END AS d
         FROM {frames} WHERE regexp_matches(protocols, '(^|:)icmp(v6)?(:|$)')),
icmp AS (SELECT number, least(s, d) AS k1, greatest(s, d) AS k2 FROM ends),
icmp_spans AS (SELECT k1, k2, min(number) AS lo, max(number) AS hi FROM icmp GROUP BY ALL),
icmp_spanning AS (SELECT DISTINCT k1, k2 FROM icmp_spans s JOIN c ON c.first > s.lo AND c.first <= s.hi),
seams AS (SELECT number, layer AS why FROM stateful SEMI JOIN spanning USING (layer, k1, k2)
          UNION ALL SELECT number, 'doubted' FROM l SEMI JOIN doubted USING (layer, stream)
          UNION ALL SELECT unnest(?) AS number, 'fragment'
          UNION ALL SELECT number, 'numbering' FROM l WHERE layer IN ('tcp', 'udp') AND number >= ?
          -- ARP's duplicate address detection (Info) remembers every earlier chunk's ARP frames
          UNION ALL SELECT number, 'arp' FROM {frames}
                    WHERE number >= (SELECT min(first) FROM c WHERE first > 1)
                      AND regexp_matches(protocols, '(^|:)arp(:|$)')
          UNION ALL SELECT number, 'icmp' FROM icmp SEMI JOIN icmp_spanning USING (k1, k2))
SELECT number, min(why) AS why FROM seams GROUP BY number ORDER BY number"""


def write_seams(folder: Path, frames: str, chunked: dict[str, Any], memory_limit: str = "384MB") -> int:
    """seams.parquet (SEAM_COLUMNS) from the build's layers, its frames table (`frames`, a FROM clause) and
    what its Stitcher noted; how many frames."""
    import duckdb

    layers = "'" + str(folder / "layers.parquet").replace("'", "''") + "'"
    doubted = [(layer, stream) for layer, streams in chunked["doubted"].items() for stream in streams]
    spill = folder / ".spill"
    try:
        with duckdb.connect(config={"memory_limit": memory_limit, "threads": 2, "temp_directory": str(spill)}) as con:
            con.execute("PRAGMA disable_progress_bar")
            seams = con.sql(_SEAMS_SQL.format(layers=layers, frames=frames),
                            params=[[first for first, _ in chunked["chunks"]], [x for x, _ in doubted],
                                    [y for _, y in doubted], chunked["fragments"],
                                    chunked["unsure_from"] or 1 << 62]
                            ).to_arrow_table()
    finally:
        if spill.exists():
            for leftover in spill.iterdir():
                leftover.unlink()
            spill.rmdir()
    import pyarrow.parquet as pq

    pq.write_table(seams, folder / SEAMS_FILE, compression="zstd")
    return int(seams.num_rows)
