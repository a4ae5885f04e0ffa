"""The control socket: msgpack frames for people's commands (`diagd status`, `diagd call`, ...).

Each connection runs under deadlines, so a silent or trickling peer cannot hold a slot or
memory: the hello must be complete within `handshake_timeout_s` of the accept, and every later
frame within `frame_timeout_s` of its first byte (waiting between frames is free: an idle
connection is what the accept loop drops when the table is full). Frames from clients are
limited to `control.MAX_REQUEST_BYTES`, and any frame above `SMALL_FRAME_BYTES` is read only
with a share of the daemon-wide `ByteBudget`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import structlog
import trio

from diagd.actors.base import ProgressFn
from diagd.actors.runtime import Client
from diagd.daemon import memtrace
from diagd.daemon.server import connections, tool_listing
from diagd.daemon.server.connections import ByteBudget, Connection, State, last_words
from diagd.daemon.server.tools import CallContext
from diagd.daemon.server.ui.auth import ONCE_TTL_S
from diagd.protocol import control, framing
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.daemon.server.services import Services as Daemon

log = structlog.get_logger("diagd.control")

# Frames up to this size are read without the shared budget: status, stop, most calls. With the
# table full of them that is at most max_connections x 64 KiB.
SMALL_FRAME_BYTES = 64 * 1024


class FrameStream:
    """Length-prefixed msgpack frames over a Trio stream, read under deadlines."""

    def __init__(self, stream: trio.SocketStream, conn: Connection | None = None,
                 budget: ByteBudget | None = None) -> None:
        self._stream = stream
        self._conn = conn
        self._budget = budget
        self._frames = framing.FrameReader(control.REQUESTS)
        self._send_lock = trio.Lock()  # a call's progress frames come from its own tasks

    async def receive(self, *, first_byte_by: float = math.inf, frame_by: float | None = None,
                      frame_timeout_s: float = math.inf) -> control.Message | None:
        """Next message, None at EOF.

        The first byte must come by `first_byte_by`, the whole frame by `frame_by` (default: its
        first byte's time + `frame_timeout_s`). DiagdError TIMEOUT when a deadline passes,
        PROTOCOL_ERROR for a malformed or oversized frame.
        """
        with trio.move_on_at(first_byte_by):
            first = await self._stream.receive_some(1)
            if not first:
                return None
            self._frames.feed(first)
        if not self._frames.partial:
            raise DiagdError(ErrorCode.TIMEOUT, "no complete hello before the handshake deadline; closing")
        if self._conn is not None and self._conn.state is not State.HANDSHAKE:
            self._conn.touch(State.READING)
        deadline = frame_by if frame_by is not None else trio.current_time() + frame_timeout_s
        with trio.move_on_at(deadline) as scope:
            # Large frames are read only with a share of the daemon-wide budget; the header's length is
            # refused past the limit before any of the body is read.
            body = await self._frames.receive(self._stream, hold=self._hold)
        if scope.cancelled_caught:
            raise DiagdError(ErrorCode.TIMEOUT, f"frame not complete within its deadline "
                             f"({self._frames.buffered} bytes received); closing")
        return None if body is None else control.REQUESTS.decode(body)

    def _hold(self, length: int) -> AbstractAsyncContextManager[Any]:
        if length <= SMALL_FRAME_BYTES or self._budget is None:
            return nullcontext()
        return self._budget.hold(length)

    async def send(self, msg: control.Message) -> None:
        try:
            frame = control.REPLIES.encode(msg)
        except DiagdError as exc:  # a result too large for a frame: say so instead of dropping the line
            frame = control.REPLIES.encode(control.ErrorReply(id=getattr(msg, "id", 0), **exc.to_wire()))
        async with self._send_lock:
            await self._stream.send_all(frame)

    async def last_words(self, msg: control.Message) -> None:
        """Send `msg` as the connection's last frame, so that the peer really gets to read it."""
        await last_words(self._stream, control.REPLIES.encode(msg))


async def serve_connection(stream: trio.SocketStream, daemon: Daemon, *, client: str,
                           conn: Connection | None = None) -> None:
    settings = daemon.config.daemon
    frames = FrameStream(stream, conn, daemon.frame_budget)
    try:
        started = conn.connected_at if conn is not None else trio.current_time()
        hello = await _handshake(frames, deadline=started + settings.handshake_timeout_s, conn=conn)
        if hello is None:
            return
        who = Client(f"cli:{hello.client or client}", conn.pid if conn is not None else 0, ephemeral=True)
        daemon.clients.connected(who)
        try:
            await _serve_requests(frames, daemon, conn, who.name, client)
        finally:
            daemon.clients.gone(who)  # a command's references end with its connection
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


async def _serve_requests(frames: FrameStream, daemon: Daemon, conn: Connection | None, who: str,
                          client: str) -> None:
    """Answer requests until the client closes (or a frame cannot be read)."""
    while True:
        _mark(conn, State.IDLE)
        try:
            msg = await frames.receive(frame_timeout_s=daemon.config.daemon.frame_timeout_s)
        except DiagdError as exc:
            if exc.code is ErrorCode.TIMEOUT or "exceeds" in exc.message:
                log.warning("control connection closed", client=client, reason=exc.message)
                await frames.last_words(control.ErrorReply(id=0, **exc.to_wire()))
                return  # cannot resynchronise after a partial or oversized frame
            await frames.send(control.ErrorReply(id=0, **exc.to_wire()))
            continue
        if msg is None:
            return
        msg_id = getattr(msg, "id", 0)
        with _busy(conn):
            try:
                reply: control.Message = control.Reply(id=msg_id, result=await _dispatch(daemon, msg, who, frames))
            except DiagdError as exc:
                reply = control.ErrorReply(id=msg_id, **exc.to_wire())
            await frames.send(reply)


async def _handshake(frames: FrameStream, *, deadline: float, conn: Connection | None) -> control.Hello | None:
    try:
        first = await frames.receive(first_byte_by=deadline, frame_by=deadline)
    except DiagdError as exc:
        log.warning("control handshake failed", reason=exc.message, client=conn.client if conn else "?")
        await frames.last_words(control.ErrorReply(id=0, **exc.to_wire()))
        return None
    if first is None:
        return None
    with _busy(conn):
        if not isinstance(first, control.Hello):
            await frames.last_words(control.ErrorReply(id=0, code=str(ErrorCode.PROTOCOL_ERROR),
                                                       message=f"first message must be hello, got {first.tag!r}"))
            return None
        if first.version not in control.SUPPORTED_VERSIONS:
            await frames.last_words(control.ErrorReply(
                id=0, code=str(ErrorCode.PROTOCOL_ERROR),
                message=f"protocol version {first.version} not supported (daemon speaks {control.PROTOCOL_VERSION})",
                details={"supported": list(control.SUPPORTED_VERSIONS)}))
            return None
        await frames.send(control.Hello(version=first.version, client="diagd"))  # the client's: we speak it
    return first


def _mark(conn: Connection | None, state: State) -> None:
    if conn is not None:
        conn.touch(state)


def _busy(conn: Connection | None) -> AbstractContextManager[None]:
    """Busy while a request is served and its reply written: never dropped as idle mid-reply."""
    return conn.busy() if conn is not None else nullcontext()


# Progress frames a call may have waiting to be written; more are dropped (progress is lossy).
PROGRESS_QUEUE = 16


@asynccontextmanager
async def _progress_frames(frames: FrameStream, msg_id: int) -> AsyncIterator[ProgressFn]:
    """CallContext.progress for a call that asked for it: each report becomes a `progress` frame.

    Reports are queued, never written by the reporter: an actor reports from its own task, and a
    client that stops reading (a suspended `diagd call`) would otherwise stall the actor for every
    client once the socket buffer is full. Reports past PROGRESS_QUEUE, and any after the call
    ended, are dropped. On exit the queue is written out first, so progress still precedes the reply.
    """
    send_channel, receive_channel = trio.open_memory_channel[control.Progress](PROGRESS_QUEUE)

    async def pump() -> None:
        async with receive_channel:
            async for frame in receive_channel:
                try:
                    await frames.send(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the command is gone; its reply will fail the same way, the tool need not

    async def report(progress: float, total: float | None, message: str | None) -> None:
        try:
            send_channel.send_nowait(control.Progress(id=msg_id, progress=float(progress),
                                                      total=None if total is None else float(total), message=message))
        except (trio.WouldBlock, trio.ClosedResourceError):
            pass

    async with trio.open_nursery() as nursery:  # the body raises only Cancelled (ToolRegistry.call)
        nursery.start_soon(pump)
        try:
            yield report
        finally:
            send_channel.close()


async def _dispatch(daemon: Daemon, msg: control.Message, who: str, frames: FrameStream) -> Any:
    if isinstance(msg, control.StatusRequest):
        if not msg.memory:
            return daemon.status()
        # The tracemalloc report (debug only): comparing snapshots of a traced heap takes seconds to minutes,
        # in a worker thread so that calls go on meanwhile (the snapshot itself is one short C step).
        return {**daemon.status(), "memory": await trio.to_thread.run_sync(memtrace.report)}
    if isinstance(msg, control.CallRequest):
        conn = connections.current.get()
        async with _progress_frames(frames, msg.id) if msg.progress else nullcontext() as progress:
            result = await daemon.registry.call(msg.tool, msg.arguments,
                                                CallContext(client=who, progress=progress,
                                                            cwd=conn.cwd if conn is not None else None, ephemeral=True,
                                                            typed=True))
        return {"is_error": result.is_error, "result": result.payload, "meta": result.meta}
    if isinstance(msg, control.StopActorRequest):
        return daemon.supervisor.stop(msg.actor_id, reason=f"stopped by {who}").statistics()
    if isinstance(msg, control.ReloadRequest):
        return daemon.reload()
    if isinstance(msg, control.ToolsRequest):
        return tool_listing.catalogue(daemon)
    if isinstance(msg, control.UiLoginRequest):
        return login_link(daemon, who)
    if isinstance(msg, control.ShutdownRequest):
        daemon.request_shutdown(f"shutdown requested by {who}")
        return {"stopping": True}
    raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"{msg.tag!r} is not a request")


HTTP_OFF = ('the web view is served by the HTTP listener, which this daemon does not run: set `listen = '
            '"127.0.0.1:8765"` in the [http] table of {config}, then `diagd restart`')
WILDCARDS = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}  # a browser here reaches a wildcard bind on loopback


def login_link(daemon: Daemon, who: str) -> dict[str, Any]:
    """A one-time login link for the web view (`diagd ui`): the listener's origin, /ui/login?once=..."""
    url = daemon.sockets.get("http")
    if url is None:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, HTTP_OFF.format(config=daemon.config.source),
                         setting="[http] listen")
    scheme, _, rest = url.removesuffix("/mcp").partition("://")
    host, sep, port = rest.rpartition(":")
    origin = f"{scheme}://{WILDCARDS.get(host, host)}{sep}{port}"
    log.info("web view login link made", by=who)  # never the link: it is a secret until used
    return {"url": f"{origin}/ui/login?once={daemon.ui_auth.login_secret()}", "view": f"{origin}/ui",
            "expires_in_s": ONCE_TTL_S}
