"""FrameReader: one way to cut a byte stream into frames, blocking or async, never past a frame."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from diagd.protocol import control, framing
from diagd.protocol.errors import DiagdError, ErrorCode

CODEC = framing.Codec([control.StatusRequest], max_frame_bytes=64)


def frames(*ids: int) -> bytes:
    return b"".join(CODEC.encode(control.StatusRequest(id=i)) for i in ids)


def test_a_blocking_stream_gives_each_frame_then_none_at_its_end() -> None:
    stream = io.BytesIO(frames(1, 2))
    reader = framing.FrameReader(CODEC)
    bodies = [reader.read(stream.read), reader.read(stream.read), reader.read(stream.read)]
    assert [CODEC.decode(b).id for b in bodies[:2] if b is not None] == [1, 2] and bodies[2] is None


def test_a_stream_that_ends_inside_a_frame_or_announces_too_much_is_a_protocol_error() -> None:
    with pytest.raises(framing.StreamEnded):
        framing.FrameReader(CODEC).read(io.BytesIO(frames(1)[:-2]).read)
    oversized = io.BytesIO(framing.HEADER.pack(65) + b"x" * 65)
    with pytest.raises(DiagdError) as info:
        framing.FrameReader(CODEC).read(oversized.read)
    assert info.value.code == ErrorCode.PROTOCOL_ERROR and oversized.tell() == framing.HEADER_SIZE  # body unread


async def test_an_async_stream_is_read_one_frame_at_a_time_and_a_hold_covers_each_body() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    held: list[int] = []

    @asynccontextmanager
    async def hold(length: int) -> AsyncIterator[None]:
        held.append(length)
        yield

    reader = framing.FrameReader(CODEC)
    data = frames(7, 8)
    for byte in data[:5]:  # a header and one byte of body, trickled
        await send.send_all(bytes([byte]))
    await send.send_all(data[5:])
    first = await reader.receive(receive, hold=hold)
    assert first is not None and CODEC.decode(first).id == 7
    assert reader.want() == framing.HEADER_SIZE and not reader.partial  # the second frame is still unread
    second = await reader.receive(receive, hold=hold)
    assert second is not None and CODEC.decode(second).id == 8
    assert held == [len(first), len(second)]
    await send.aclose()
    assert await reader.receive(receive) is None
