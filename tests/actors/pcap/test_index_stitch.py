"""The stream numbering rule of a chunked build (index/stitch.py) on made-up layers: what Wireshark 4.0
does over the whole file (packet-tcp.c: a conversation is opened by ends never seen, or by a SYN whose
sequence number differs from the open conversation's first one that way). The rule against real
captures: test_index_chunked.py."""

from __future__ import annotations

from diagd.actors.pcap.index.stitch import SYN, Stitcher

ACK = 0x10
A, B = ("10.0.0.1", 1000), ("10.0.0.2", 80)


def tcp_row(number: int, local: int, src: tuple[str, int], dst: tuple[str, int]) -> tuple[object, ...]:
    return (number, 3, "tcp", "ip", src[0], dst[0], src[1], dst[1], local, 60, 0)


def see(stitcher: Stitcher, first: int, frames: list[tuple[int, tuple[str, int], tuple[str, int], int, int]]
        ) -> None:
    """Frames numbered from `first` (this chunk's numbers): (local stream, src, dst, flags, seq)."""
    rows = [tcp_row(first + i, local, src, dst) for i, (local, src, dst, _, _) in enumerate(frames)]
    stitcher.see(rows, [0] * len(rows), first, {
        "tcp_flags": [[hex(flags)] for *_, flags, _ in frames],
        "tcp_seq_raw": [[str(seq)] for *_, seq in frames], "fragments": []})


def test_a_conversation_across_a_chunk_start_keeps_its_stream_and_new_ones_follow_in_order() -> None:
    stitcher = Stitcher()
    stitcher.begin(0, 0, 0)
    see(stitcher, 1, [(0, A, B, SYN, 100), (0, B, A, SYN | ACK, 500), (1, ("10.0.0.3", 5), B, SYN, 7)])
    assert stitcher.mapping("tcp", 1) == [0, 1]
    # Chunk 1 replays frame 1 (its own stream 0 is frame 1's), then A-B goes on and a new one opens.
    stitcher.begin(1, 3, 0, [1])
    see(stitcher, 1, [(0, A, B, SYN, 100), (0, A, B, ACK, 101), (1, ("10.0.0.4", 6), B, SYN, 9)])
    assert stitcher.mapping("tcp", 1) == [0, 2]
    assert stitcher.doubted("tcp") == set()


def test_a_syn_with_another_sequence_number_opens_a_new_stream_the_same_one_does_not() -> None:
    stitcher = Stitcher()
    stitcher.begin(0, 0, 0)
    see(stitcher, 1, [(0, A, B, SYN, 100)])
    stitcher.begin(1, 1, 0, [1])
    see(stitcher, 1, [(0, A, B, SYN, 100), (0, A, B, SYN, 100)])  # replayed, then the SYN retransmitted
    assert stitcher.mapping("tcp", 0) == [0]
    stitcher.begin(2, 2, 0, [1])
    see(stitcher, 1, [(0, A, B, SYN, 100), (1, A, B, SYN, 999)])  # the ports reused
    assert stitcher.mapping("tcp", 1) == [0, 1]
    assert stitcher.doubted("tcp") == set()


def test_where_this_chunks_pass_and_the_whole_files_part_ways_the_stream_is_doubted() -> None:
    other = (("10.0.0.3", 5), ("10.0.0.4", 6))
    stitcher = Stitcher()
    stitcher.begin(0, 0, 0)
    see(stitcher, 1, [(0, *other, ACK, 1), (1, A, B, ACK, 100)])  # A-B seen mid-flow: its first segment 100
    stitcher.begin(1, 2, 0, [1])
    # This chunk first sees A-B at 500, so a SYN at 99 opens another conversation in its pass; over the
    # whole file that SYN is the first segment's retransmission, in the same conversation.
    see(stitcher, 1, [(0, *other, ACK, 1), (1, A, B, ACK, 500), (2, A, B, SYN, 99)])
    assert stitcher.mapping("tcp", 2) == [0, 1, 1]
    assert stitcher.doubted("tcp") == {1}
