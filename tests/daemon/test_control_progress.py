"""Progress frames on the control socket never make the reporting tool wait for the client to read."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from diagd.daemon.server.control_server import PROGRESS_QUEUE, FrameStream, _dispatch
from diagd.daemon.server.tools import CallContext
from diagd.protocol import control, framing

REPORTS = 1000


class ReportingRegistry:
    """A registry whose one tool reports progress REPORTS times, as an actor does from its own task."""

    def __init__(self) -> None:
        self.reported = 0
        self.after_end: Any = None

    async def call(self, tool: str, arguments: dict[str, Any], ctx: CallContext, **_: Any) -> Any:
        assert ctx.progress is not None
        for i in range(REPORTS):
            await ctx.progress(i, REPORTS, "loading " + "x" * 100)
            self.reported += 1
        self.after_end = ctx.progress  # an actor could still hold it after the call
        return SimpleNamespace(is_error=False, payload={"done": True}, meta={})


def frame_stream() -> tuple[trio.SocketStream, FrameStream, socket.socket]:
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # a few frames fill it
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    return stream, FrameStream(stream), theirs


def read_to_reply(sock: socket.socket) -> list[control.Message]:
    sock.settimeout(30)
    reader = framing.FrameReader(control.REPLIES)
    messages: list[control.Message] = []
    while not messages or isinstance(messages[-1], control.Progress):
        body = reader.read(sock.recv)
        assert body is not None
        messages.append(control.REPLIES.decode(body))
    return messages


async def answer(frames: FrameStream, registry: ReportingRegistry, request: control.CallRequest) -> None:
    """What the connection does with a call: dispatch it, then write its reply."""
    result = await _dispatch(SimpleNamespace(registry=registry), request, "cli:t", frames)  # type: ignore[arg-type]
    try:
        await frames.send(control.Reply(id=request.id, result=result))
    except trio.BrokenResourceError:
        pass  # the client went away (serve_connection ends the connection then)


async def test_a_client_that_never_reads_its_progress_does_not_stall_the_reporting_tool() -> None:
    stream, frames, client = frame_stream()
    registry = ReportingRegistry()
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(answer, frames, registry, control.CallRequest(id=1, tool="t", progress=True))
        await trio.testing.wait_all_tasks_blocked()
        assert registry.reported == REPORTS  # every report returned although nothing was read
        client.close()  # only the connection's own task waits for the client, until it goes


async def test_progress_comes_before_the_reply_and_none_after_it() -> None:
    stream, frames, client = frame_stream()
    registry = ReportingRegistry()
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(answer, frames, registry, control.CallRequest(id=1, tool="t", progress=True))
        await trio.testing.wait_all_tasks_blocked()
        received = await trio.to_thread.run_sync(read_to_reply, client)
    *progress, reply = received
    assert isinstance(reply, control.Reply) and reply.result == {"is_error": False, "result": {"done": True},
                                                                 "meta": {}}
    assert progress and all(isinstance(m, control.Progress) and m.id == 1 for m in progress)
    assert len(progress) <= PROGRESS_QUEUE + 2  # the queue, one being written, one taken: the rest dropped
    await registry.after_end(1, 1, "late")  # a report after the call ended is dropped, not written
    client.setblocking(False)
    try:
        assert client.recv(65536) == b""  # the stream is closed: EOF, no late frame before it
    finally:
        client.close()
