"""The MCP line reader's deadline, size limit and share of the daemon-wide buffer budget, on
Trio's virtual clock."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from diagd.daemon.server.connections import ByteBudget, ConnectionTable, State
from diagd.daemon.server.mcp.lines import SMALL_PARTIAL_BYTES, LineReader
from diagd.protocol.errors import DiagdError, ErrorCode

MiB = 1024 * 1024


def pipe() -> tuple[trio.testing.MemorySendStream, trio.testing.MemoryReceiveStream]:
    return trio.testing.memory_stream_one_way_pair()


async def test_lines_split_across_chunks_and_several_per_chunk_come_out_whole(
        autojump_clock: trio.testing.MockClock) -> None:
    send, recv = pipe()
    reader = LineReader(recv, max_line_bytes=1000)
    await send.send_all(b'{"a": 1}\n{"b"')
    assert await reader.next_lines() == [b'{"a": 1}']
    await send.send_all(b': 2}\n\n{"c": 3}\n')
    assert await reader.next_lines() == [b'{"b": 2}', b"", b'{"c": 3}']
    await send.aclose()
    assert await reader.next_lines() is None


async def test_a_partial_line_times_out_at_its_first_byte_plus_the_frame_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    send, recv = pipe()
    reader = LineReader(recv, max_line_bytes=1000, frame_timeout_s=10)

    async def trickle() -> None:
        await trio.sleep(100)  # idle before the line: free
        for _ in range(30):
            await send.send_all(b"x")
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        with pytest.raises(DiagdError) as info:
            await reader.next_lines()
        assert trio.current_time() == 110  # first byte at 100, not the start of the wait
        nursery.cancel_scope.cancel()
    assert info.value.code is ErrorCode.TIMEOUT and "10 s of its first byte" in info.value.message


async def test_the_deadline_restarts_with_each_line_and_idle_time_between_lines_is_free(
        autojump_clock: trio.testing.MockClock) -> None:
    send, recv = pipe()
    reader = LineReader(recv, max_line_bytes=1000, frame_timeout_s=10)

    async def client() -> None:
        for _ in range(3):
            await send.send_all(b'{"part":')
            await trio.sleep(8)
            await send.send_all(b' 1}\n{"next":')  # the next line starts here: its own 10 s
            await trio.sleep(8)
            await send.send_all(b" 2}\n")
            await trio.sleep(60)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        got: list[bytes] = []
        while len(got) < 6:
            batch = await reader.next_lines()
            assert batch is not None
            got += batch
    assert got == [b'{"part": 1}', b'{"next": 2}'] * 3


async def test_a_line_longer_than_the_limit_is_refused_before_more_is_buffered(
        autojump_clock: trio.testing.MockClock) -> None:
    send, recv = pipe()
    reader = LineReader(recv, max_line_bytes=100)
    await send.send_all(b"x" * 100 + b"\n")
    assert await reader.next_lines() == [b"x" * 100]  # exactly the limit is fine
    await send.send_all(b"x" * 1000)
    with pytest.raises(DiagdError) as info:
        await reader.next_lines()
    assert info.value.code is ErrorCode.PROTOCOL_ERROR and "exceeds 100 bytes" in info.value.message
    assert reader.partial_bytes == 101


async def test_a_long_partial_line_waits_for_the_budget_and_its_deadline_still_runs(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = ByteBudget(MiB)
    send, recv = pipe()
    small_send, small_recv = pipe()
    async with budget.hold(MiB):  # a control frame holds it all
        await small_send.send_all(b"s" * (SMALL_PARTIAL_BYTES // 2) + b"\n")
        assert await LineReader(small_recv, max_line_bytes=8 * MiB, budget=budget).next_lines() is not None
        await send.send_all(b"x" * (2 * SMALL_PARTIAL_BYTES))
        reader = LineReader(recv, max_line_bytes=8 * MiB, frame_timeout_s=5, budget=budget)
        with pytest.raises(DiagdError) as info:
            await reader.next_lines()
        assert info.value.code is ErrorCode.TIMEOUT and trio.current_time() == 5
        assert reader.partial_bytes <= SMALL_PARTIAL_BYTES  # it stopped reading at the threshold
    reader.release()
    assert budget.free == budget.total


async def test_long_lines_on_many_connections_all_complete_within_a_budget_smaller_than_their_sum(
        autojump_clock: trio.testing.MockClock) -> None:
    # Each reader holds bytes while it waits for more: without the oldest going first, eight
    # half-read 1 MiB lines in a 2 MiB budget would wait for each other until their deadlines.
    budget = ByteBudget(2 * MiB)
    most_held = 0

    async def one(i: int) -> None:
        nonlocal most_held
        send, recv = pipe()
        reader = LineReader(recv, max_line_bytes=8 * MiB, frame_timeout_s=10, budget=budget)
        line = bytes([65 + i]) * MiB

        async def client() -> None:
            for start in range(0, len(line), 100_000):
                await send.send_all(line[start:start + 100_000])
                await trio.lowlevel.checkpoint()
            await send.send_all(b"\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            while (batch := await reader.next_lines()) == []:
                pass
            assert batch == [line]
        most_held = max(most_held, budget.total - budget.free)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(one, i)
    assert budget.free == budget.total  # every share given back once its line was complete
    assert most_held <= budget.total + MiB + SMALL_PARTIAL_BYTES


async def test_the_oldest_share_may_pass_the_budget_and_younger_ones_wait_for_it(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = ByteBudget(100)
    old, young = budget.share(), budget.share()
    await old.grow_to(60)
    await young.grow_to(40)
    await old.grow_to(150)  # the oldest does not wait for younger shares: free goes below zero
    assert budget.free == -90
    with trio.move_on_after(1) as scope:
        await young.grow_to(41)
    assert scope.cancelled_caught and young.held == 40
    old.shrink_to(0)  # young is the oldest now
    async with budget.hold(10):  # but it does wait for whole frames, which end by themselves
        with trio.move_on_after(1) as scope:
            await young.grow_to(200)
        assert scope.cancelled_caught and young.held == 40
    with trio.fail_after(1):
        await young.grow_to(200)
    young.shrink_to(0)
    assert budget.free == 100


async def test_a_connection_reading_a_partial_line_is_not_dropped_as_idle(
        autojump_clock: trio.testing.MockClock) -> None:
    table = ConnectionTable(2)
    conn, _ = table.admit("mcp", 1)
    assert conn is not None
    conn.touch(State.IDLE)
    send, recv = pipe()
    reader = LineReader(recv, max_line_bytes=1000, frame_timeout_s=10, conn=conn)
    await send.send_all(b'{"partial"')
    with trio.move_on_after(1):
        await reader.next_lines()
    assert conn.state is State.READING and table.oldest_idle() is None
    await send.send_all(b": 1}\n")
    assert await reader.next_lines() == [b'{"partial": 1}']
    assert conn.state is State.IDLE
