"""budget.plan and budget.wanted on exact cases worked out by hand from the documented rule (budget.py's
docstring, docs/capture.md "Confinement and the disk budget"): each file may pass its size by one packet
(snaplen) and 16 KiB of blocks; dumpcap's smallest file is 64 kB (kB of 1024 bytes in the reservation);
a ring given size and count needs count x (size + margin); one file stops at the `bytes` asked (rounded
up to whole kB), else at the capture's share; a ring's missing size or count is derived from the share,
at most 4 files of the default; what needs more than the room is refused with what is free; the
boundaries (exactly the room, one byte less) on both sides.
"""

from __future__ import annotations

from typing import Any

import pytest

from diagd.actors.capture import budget
from diagd.protocol.errors import DiagdError, ErrorCode

SNAPLEN = 1500
MARGIN = 1500 + 16 * 1024  # 17884: one packet and the blocks around
SMALLEST = 64 * 1024 + MARGIN  # 83420


def plan(ring: dict[str, Any], stop_bytes: int | None, room: int, share: int, snaplen: int = SNAPLEN) -> budget.Plan:
    return budget.plan(ring=ring, stop_bytes=stop_bytes, snaplen=snaplen, room=room, share=share)


def refusal(ring: dict[str, Any], stop_bytes: int | None, room: int, share: int) -> DiagdError:
    with pytest.raises(DiagdError) as refused:
        plan(ring, stop_bytes, room, share)
    return refused.value


def test_the_margin_of_a_file() -> None:
    assert budget.file_margin(1500) == MARGIN
    assert budget.file_margin(262144) == 262144 + 16384


@pytest.mark.parametrize(("room", "free"), [(SMALLEST - 1, SMALLEST - 1), (0, 0), (-5, 0), (1000, 1000)])
def test_no_room_for_the_smallest_file_is_busy(room: int, free: int) -> None:
    for ring, stop_bytes in (({}, None), ({}, 100), ({"ring_files": 1, "file_size_kb": 64}, None)):
        error = refusal(ring, stop_bytes, room, room)
        assert error.code == ErrorCode.BUSY
        assert error.message == (f"the captures' disk budget has {free} bytes free, less than one file of "
                                 f"{SMALLEST} bytes")
        assert error.details == {"free_bytes": free, "hint": "stop a running capture, or raise [capture] max_bytes"}


def test_exactly_the_smallest_file_fits() -> None:
    p = plan({}, None, SMALLEST, SMALLEST)
    assert (p.reserved_bytes, p.args, p.autostop_kb, p.ring) == (SMALLEST, ["-a", "filesize:64"], 64, {})


def assert_too_big(error: DiagdError, what: str, need: int, room: int) -> None:
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert error.message == (f"{what} needs up to {need} bytes on disk; the captures' disk budget has {room} free")
    assert error.details == {"needed_bytes": need, "free_bytes": room,
                             "hint": "ask for fewer or smaller files (or a bytes limit), stop a capture, or raise "
                                     "[capture] max_bytes"}


def test_a_ring_of_size_and_count() -> None:
    need = 3 * (100 * 1024 + MARGIN)  # 360852
    p = plan({"file_size_kb": 100, "ring_files": 3}, None, need, 1)
    assert (p.reserved_bytes, p.args, p.autostop_kb) == (need, ["-b", "filesize:100", "-b", "files:3"], None)
    assert p.ring == {"file_size_kb": 100, "ring_files": 3}
    timed = plan({"file_size_kb": 100, "ring_files": 3, "file_duration_s": 7.6}, 10**6, 1 << 30, 1 << 20)
    assert timed.args == ["-b", "filesize:100", "-b", "files:3", "-b", "duration:8"]
    assert timed.reserved_bytes == need
    assert_too_big(refusal({"file_size_kb": 100, "ring_files": 3}, None, need - 1, 1 << 30),
                   "a ring of 3 files of 100 kB", need, need - 1)


def test_one_file_stops_at_the_bytes_asked() -> None:
    # 1,000,000 bytes: 977 kB (976.56 rounded up); reserved with one margin
    p = plan({}, 1_000_000, 32 << 20, 1 << 20)
    assert (p.args, p.autostop_kb, p.reserved_bytes, p.ring) == (["-a", "filesize:977"], 977, 977 * 1024 + MARGIN, {})
    assert plan({}, 977 * 1024, 32 << 20, 1).autostop_kb == 977  # a whole kB is not rounded up
    assert plan({}, 977 * 1024 + 1, 32 << 20, 1).autostop_kb == 978
    assert plan({}, 1000, 32 << 20, 1).autostop_kb == 64  # never below dumpcap's smallest file
    # the bytes asked and one margin must fit: exactly the room does, a byte more does not
    assert plan({}, 1_000_000, 1_000_000 + MARGIN, 1).autostop_kb == 977
    assert_too_big(refusal({}, 1_000_000, 1_000_000 + MARGIN - 1, 1 << 30), "bytes = 1000000", 1_000_000 + MARGIN,
                   1_000_000 + MARGIN - 1)


@pytest.mark.parametrize(("room", "share", "kb"), [
    (32 << 20, 8 << 20, (8388608 - MARGIN) // 1024),  # the share: 8174 kB
    (1 << 20, 64 << 20, (1048576 - MARGIN) // 1024),  # less room than the share: the room, 1006 kB
    (1 << 30, 100_000, (100_000 - MARGIN) // 1024),  # 80 kB
    (1 << 30, 80_000, 64),  # a share below the smallest file: the smallest file
])
def test_one_file_without_a_limit_stops_at_the_share(room: int, share: int, kb: int) -> None:
    p = plan({}, None, room, share)
    assert (p.args, p.autostop_kb, p.reserved_bytes, p.ring) == (["-a", f"filesize:{kb}"], kb, kb * 1024 + MARGIN, {})
    assert p.reserved_bytes <= max(min(room, share), SMALLEST)
    assert kb in (8174, 1006, 80, 64)  # worked out: 8370724 // 1024, 1030692 // 1024, 82116 // 1024


def test_a_ring_of_a_size_gets_as_many_files_as_the_share_holds() -> None:
    one = 500 * 1024 + MARGIN  # 529884
    p = plan({"file_size_kb": 500}, None, 32 << 20, 8 << 20)
    assert 8388608 // one == 15
    assert (p.args, p.reserved_bytes, p.autostop_kb) == (["-b", "filesize:500", "-b", "files:15"], 15 * one, None)
    assert p.ring == {"file_size_kb": 500, "ring_files": 15}
    assert plan({"file_size_kb": 500}, None, one, 8 << 20).ring["ring_files"] == 1  # the room: one file
    assert plan({"file_size_kb": 500}, None, 32 << 20, 100_000).ring["ring_files"] == 1  # at least one
    assert plan({"file_size_kb": 500}, None, 32 << 20, 2 * one).ring["ring_files"] == 2
    assert plan({"file_size_kb": 500}, None, 32 << 20, 2 * one - 1).ring["ring_files"] == 1
    assert_too_big(refusal({"file_size_kb": 500}, None, one - 1, 1 << 30), "one file of 500 kB", one, one - 1)


def test_a_ring_of_a_count_divides_the_share() -> None:
    p = plan({"ring_files": 3}, None, 32 << 20, 8 << 20)
    size = (8388608 // 3 - MARGIN) // 1024  # 2713
    assert size == 2713
    assert (p.args, p.reserved_bytes) == (["-b", f"filesize:{size}", "-b", "files:3"], 3 * (size * 1024 + MARGIN))
    assert p.ring == {"ring_files": 3, "file_size_kb": size}
    # the smallest file of each does not fit: refused naming the count
    assert_too_big(refusal({"ring_files": 10}, None, 200_000, 200_000), "a ring of 10 files", 10 * SMALLEST, 200_000)
    assert plan({"ring_files": 2}, None, 2 * SMALLEST, 2 * SMALLEST).reserved_bytes == 2 * SMALLEST


@pytest.mark.parametrize(("share", "files", "size"), [
    (8 << 20, 4, (8388608 // 4 - MARGIN) // 1024),  # the share holds many: the default four, 2030 kB
    (200_000, 2, (100_000 - MARGIN) // 1024),  # two of the smallest: two files of 80 kB
    (2 * SMALLEST, 2, 64),
    (2 * SMALLEST - 1, 1, (2 * SMALLEST - 1 - MARGIN) // 1024),
    (50_000, 1, 64),  # not even one: one of the smallest
])
def test_a_ring_of_a_duration_derives_count_and_size(share: int, files: int, size: int) -> None:
    p = plan({"file_duration_s": 2.4}, None, 1 << 30, share)
    assert p.ring == {"file_duration_s": 2.4, "ring_files": files, "file_size_kb": size}
    assert p.args == ["-b", f"filesize:{size}", "-b", f"files:{files}", "-b", "duration:2"]
    assert p.reserved_bytes == files * (size * 1024 + MARGIN) and p.autostop_kb is None
    assert ((8388608 // 4 - MARGIN) // 1024, (100_000 - MARGIN) // 1024) == (2030, 80)


@pytest.mark.parametrize(("seconds", "arg"), [(0.2, "duration:1"), (1, "duration:1"), (2.6, "duration:3"),
                                              (3600, "duration:3600"), (1.4, "duration:1")])
def test_a_file_duration_is_whole_seconds_at_least_one(seconds: float, arg: str) -> None:
    assert plan({"file_duration_s": seconds}, None, 1 << 30, 8 << 20).args[-2:] == ["-b", arg]


def test_a_bytes_limit_with_a_ring_is_the_ring() -> None:
    """A ring is kept whatever `bytes` says (the actor stops it there): its files bound the disk."""
    p = plan({"ring_files": 2}, 10**9, 32 << 20, 8 << 20)
    assert p.autostop_kb is None and p.ring["ring_files"] == 2


def test_what_a_capture_would_like_free() -> None:
    assert budget.wanted(ring={"file_size_kb": 100, "ring_files": 3}, stop_bytes=None, snaplen=SNAPLEN,
                         share=1) == 3 * (100 * 1024 + MARGIN)
    assert budget.wanted(ring={"file_size_kb": 100, "ring_files": 3}, stop_bytes=5, snaplen=SNAPLEN,
                         share=1) == 3 * (100 * 1024 + MARGIN)
    assert budget.wanted(ring={}, stop_bytes=1_000_000, snaplen=SNAPLEN, share=1) == 1_000_000 + MARGIN
    assert budget.wanted(ring={"ring_files": 3}, stop_bytes=1_000_000, snaplen=SNAPLEN, share=777) == 777
    assert budget.wanted(ring={"file_size_kb": 100}, stop_bytes=None, snaplen=SNAPLEN, share=777) == 777
    assert budget.wanted(ring={"ring_files": 3, "file_duration_s": 1}, stop_bytes=None, snaplen=SNAPLEN,
                         share=778) == 778
    assert budget.wanted(ring={}, stop_bytes=None, snaplen=SNAPLEN, share=779) == 779
    assert budget.wanted(ring={"file_size_kb": 64, "ring_files": 1}, stop_bytes=None, snaplen=262144,
                         share=1) == 64 * 1024 + 262144 + 16384
    assert budget.wanted(ring={}, stop_bytes=0, snaplen=SNAPLEN, share=5) == MARGIN
