"""The capture disk budget as dumpcap's own bound (budget.plan): every plan's worst case fits the room, and
dumpcap is given the arguments that hold it there."""

from __future__ import annotations

import itertools

import pytest

from diagd.actors.capture import budget
from diagd.protocol.errors import DiagdError, ErrorCode

SNAPLEN = 262144
MARGIN = budget.file_margin(SNAPLEN)


def worst_case(plan: budget.Plan, snaplen: int = SNAPLEN) -> int:
    """The most bytes dumpcap can leave on disk under `plan.args`: every ring file one packet and the
    closing blocks past its size, or the one file past its autostop size the same way."""
    args = dict(zip(plan.args[1::2], plan.args[::2], strict=True))  # "filesize:N" -> "-b"
    values = {a.split(":")[0]: int(a.split(":")[1]) for a in plan.args[1::2]}
    assert set(args.values()) <= {"-a", "-b"}
    margin = budget.file_margin(snaplen)
    if "-a" in args.values():
        return values["filesize"] * 1024 + margin
    return values["files"] * (values["filesize"] * 1024 + margin)


@pytest.mark.parametrize("ring,stop_bytes", [
    ({}, None), ({}, 10_000_000), ({"ring_files": 3, "file_duration_s": 5}, None), ({"file_size_kb": 500}, None),
    ({"file_duration_s": 2.5}, None), ({"file_size_kb": 100, "ring_files": 7}, None),
    ({"file_size_kb": 64, "ring_files": 2}, 5_000_000)])
@pytest.mark.parametrize("room", [1 << 20, 32 << 20, 1 << 30])
def test_every_plan_fits_its_room_and_reserves_its_worst_case(ring: dict[str, int], stop_bytes: int | None,
                                                               room: int) -> None:
    share = room // 4
    try:
        plan = budget.plan(ring=ring, stop_bytes=stop_bytes, snaplen=SNAPLEN, room=room, share=share)
    except DiagdError as refused:
        assert refused.code in (ErrorCode.INVALID_ARGUMENT, ErrorCode.BUSY)
        assert refused.details["free_bytes"] == room and refused.details.get("needed_bytes", room + 1) > room
        return
    assert worst_case(plan) <= plan.reserved_bytes <= room
    if "file_duration_s" in ring:
        assert plan.args[-2:] == ["-b", f"duration:{max(1, round(ring['file_duration_s']))}"]
    if not ring:  # one file, stopped by dumpcap at the byte limit, else at its share
        assert plan.autostop_kb is not None and plan.ring == {}
        if stop_bytes is not None:
            assert plan.autostop_kb * 1024 >= stop_bytes
        else:
            assert plan.reserved_bytes <= max(share, budget.MIN_FILE_KB * 1024 + MARGIN)
    else:  # a ring: given values kept, the others derived
        assert plan.autostop_kb is None
        assert all(plan.ring[k] == v for k, v in ring.items())
        assert plan.ring["ring_files"] >= 1 and plan.ring["file_size_kb"] >= budget.MIN_FILE_KB
        if "ring_files" not in ring and "file_size_kb" not in ring:
            assert plan.ring["ring_files"] <= budget.DEFAULT_RING_FILES


def test_a_ring_bigger_than_the_room_is_refused_with_what_is_free() -> None:
    with pytest.raises(DiagdError) as refused:
        budget.plan(ring={"file_size_kb": 1024, "ring_files": 10}, stop_bytes=None, snaplen=1500,
                    room=5 << 20, share=1 << 20)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.details == {"needed_bytes": 10 * (1024 * 1024 + 1500 + budget.BLOCK_MARGIN),
                                     "free_bytes": 5 << 20} | {"hint": refused.value.details["hint"]}


def test_no_room_for_one_file_is_busy() -> None:
    with pytest.raises(DiagdError) as refused:
        budget.plan(ring={}, stop_bytes=None, snaplen=1500, room=1000, share=1000)
    assert refused.value.code == ErrorCode.BUSY


def test_reservations_of_consecutive_starts_never_add_up_past_the_budget() -> None:
    """Each start gets the room left by the reservations before it: together they stay within max_bytes."""
    for max_bytes, concurrent, snaplen in itertools.product((2 << 20, 64 << 20, 1 << 30), (1, 2, 4), (1500, SNAPLEN)):
        reserved: list[int] = []
        for _ in range(concurrent):
            room = max_bytes - sum(reserved)
            try:
                plan = budget.plan(ring={}, stop_bytes=None, snaplen=snaplen, room=room,
                                   share=room // max(1, concurrent - len(reserved)))
            except DiagdError:
                break
            reserved.append(plan.reserved_bytes)
        assert sum(reserved) <= max_bytes
