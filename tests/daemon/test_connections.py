"""The connection table's drop policy, the shared frame budget and the control frame deadlines,
on Trio's virtual clock."""

from __future__ import annotations

import math
import struct

import msgpack
import pytest
import trio
import trio.testing

from diagd.daemon.server.connections import ByteBudget, ConnectionTable, State
from diagd.daemon.server.control_server import SMALL_FRAME_BYTES, FrameStream
from diagd.protocol import control
from diagd.protocol.errors import DiagdError, ErrorCode


async def test_a_full_table_drops_never_greeted_connections_before_long_idle_ones(
        autojump_clock: trio.testing.MockClock) -> None:
    table = ConnectionTable(3)
    idle_old, _ = table.admit("mcp", 1)
    assert idle_old is not None
    idle_old.touch(State.IDLE)
    await trio.sleep(5)
    silent, _ = table.admit("control", 2)  # connected later, never said anything
    busy, _ = table.admit("control", 3)
    assert silent is not None and busy is not None
    busy.touch(State.IDLE)
    with busy.busy():
        newcomer, dropped = table.admit("control", 4)
        assert newcomer is not None and dropped is silent
        assert silent.scope.cancel_called and silent.drop_reason is not None
        newcomer.touch(State.IDLE)  # it greeted: now idle for less time than the first one
        _, dropped = table.admit("control", 5)
        assert dropped is idle_old  # then the longest idle
    assert len(table) == 3 and table.dropped == 2


async def test_a_full_table_of_busy_or_reading_connections_refuses_the_newcomer(
        autojump_clock: trio.testing.MockClock) -> None:
    table = ConnectionTable(2)
    a, _ = table.admit("mcp", 1)
    b, _ = table.admit("control", 2)
    assert a is not None and b is not None
    a.touch(State.IDLE)
    b.touch(State.READING)
    with a.busy():
        assert a.state is State.BUSY
        assert table.admit("control", 3) == (None, None)
    assert a.state is State.IDLE and table.refused == 1
    newcomer, dropped = table.admit("control", 3)
    assert newcomer is not None and dropped is a


async def test_the_drop_callback_tells_the_peer_before_its_handler_is_cancelled(
        autojump_clock: trio.testing.MockClock) -> None:
    told: list[str] = []
    table = ConnectionTable(1)
    victim, _ = table.admit("control", 1)
    assert victim is not None
    victim.on_drop = told.append
    table.admit("control", 2)
    assert told and "dropped to make room" in told[0]


async def test_the_byte_budget_makes_a_large_frame_wait_until_another_releases(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = ByteBudget(100)
    order: list[str] = []

    async def holder() -> None:
        async with budget.hold(80):
            order.append("first holds")
            await trio.sleep(3)
        order.append("first releases")

    async def waiter() -> None:
        await trio.sleep(1)
        async with budget.hold(50):
            order.append(f"second holds at {trio.current_time():g}")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        nursery.start_soon(waiter)
    assert order == ["first holds", "first releases", "second holds at 3"]
    assert budget.free == 100
    with pytest.raises(ValueError):
        async with budget.hold(101):
            pass


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


async def stream_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_a_hello_that_never_completes_times_out_at_the_handshake_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    client, server = await stream_pair()
    frames = FrameStream(server)
    hello = frame({"t": "hello", "version": 1})
    await client.send_all(hello[:3])
    with pytest.raises(DiagdError) as info:
        await frames.receive(first_byte_by=10, frame_by=10)
    assert info.value.code == ErrorCode.TIMEOUT and trio.current_time() == 10


async def test_silence_before_a_hello_times_out_at_the_handshake_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    _client, server = await stream_pair()
    with pytest.raises(DiagdError) as info:
        await FrameStream(server).receive(first_byte_by=10, frame_by=10)
    assert info.value.code == ErrorCode.TIMEOUT and trio.current_time() == 10


async def test_between_frames_waiting_is_free_but_a_started_frame_has_its_own_deadline(
        autojump_clock: trio.testing.MockClock) -> None:
    client, server = await stream_pair()
    frames = FrameStream(server)
    status = frame({"t": "status", "id": 1})

    async def trickle() -> None:
        await trio.sleep(100)  # long idle: allowed
        await client.send_all(status[:5])  # then a slowloris frame

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        with pytest.raises(DiagdError) as info:
            await frames.receive(frame_timeout_s=2)
    assert info.value.code == ErrorCode.TIMEOUT and trio.current_time() == 102


async def test_a_complete_frame_after_idle_time_is_read(autojump_clock: trio.testing.MockClock) -> None:
    client, server = await stream_pair()

    async def later() -> None:
        await trio.sleep(50)
        await client.send_all(frame({"t": "status", "id": 7}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(later)
        msg = await FrameStream(server).receive(frame_timeout_s=2)
    assert msg == control.StatusRequest(id=7)


async def test_a_request_frame_over_the_request_limit_is_refused_from_its_header(
        autojump_clock: trio.testing.MockClock) -> None:
    client, server = await stream_pair()
    await client.send_all(struct.pack(">I", control.MAX_REQUEST_BYTES + 1))
    with pytest.raises(DiagdError) as info:
        await FrameStream(server).receive(frame_timeout_s=math.inf)
    assert info.value.code == ErrorCode.PROTOCOL_ERROR and "exceeds" in info.value.message


async def test_a_large_frame_waits_for_the_budget_and_small_ones_do_not(
        autojump_clock: trio.testing.MockClock) -> None:
    budget = ByteBudget(control.MAX_REQUEST_BYTES)
    client, server = await stream_pair()
    big = frame({"t": "call", "id": 1, "tool": "echo", "arguments": {"message": "x" * (SMALL_FRAME_BYTES * 2)}})
    small_client, small_server = await stream_pair()
    await small_client.send_all(frame({"t": "status", "id": 2}))
    async with budget.hold(control.MAX_REQUEST_BYTES):  # someone else holds it all
        assert await FrameStream(small_server, budget=budget).receive() == control.StatusRequest(id=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send_all, big)
            with pytest.raises(DiagdError) as info:
                await FrameStream(server, budget=budget).receive(frame_timeout_s=5)
            nursery.cancel_scope.cancel()
    assert info.value.code == ErrorCode.TIMEOUT  # it waited for budget, and its deadline still ran


def test_request_and_reply_limits_fit_what_people_send_and_get() -> None:
    assert control.MAX_REQUEST_BYTES < control.MAX_REPLY_BYTES
    drgn_script = control.CallRequest(id=1, tool="run_drgn_command", arguments={"code": "é" * 200_000})
    assert len(control.REQUESTS.encode(drgn_script)) <= control.MAX_REQUEST_BYTES
    crash_page = control.Reply(id=1, result={"output": "x" * (64 * 1024 * 1024)})
    assert len(control.REPLIES.encode(crash_page)) <= control.MAX_REPLY_BYTES
