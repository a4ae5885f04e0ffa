"""The control socket: msgpack frames for people's commands (`diagd status`, `diagd call`, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
import trio

from diagd.daemon.tools import CallContext
from diagd.protocol import control
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.daemon.server import Daemon

log = structlog.get_logger("diagd.control")


class FrameStream:
    """Length-prefixed msgpack frames over a Trio stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    async def _read_exact(self, n: int) -> bytes | None:
        while len(self._buffer) < n:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                return None
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def receive(self) -> control.Message | None:
        """Next message, None at EOF; DiagdError(PROTOCOL_ERROR) for a malformed frame."""
        header = await self._read_exact(control.HEADER_SIZE)
        if header is None:
            return None
        length = control.frame_length(header)  # raises before we buffer an oversized frame
        body = await self._read_exact(length)
        if body is None:
            return None
        return control.decode(body)

    async def send(self, msg: control.Message) -> None:
        await self._stream.send_all(control.encode(msg))


async def serve_connection(stream: trio.SocketStream, daemon: Daemon, *, client: str) -> None:
    frames = FrameStream(stream)
    try:
        hello = await _handshake(frames)
        if hello is None:
            return
        who = f"cli:{hello.client or client}"
        while True:
            try:
                msg = await frames.receive()
            except DiagdError as exc:
                await frames.send(control.ErrorReply(id=0, **_wire(exc)))
                if "exceeds" in exc.message:
                    return  # cannot resynchronise after an oversized frame
                continue
            if msg is None:
                return
            msg_id = getattr(msg, "id", 0)
            try:
                reply: control.Message = control.Reply(id=msg_id, result=await _dispatch(daemon, msg, who))
            except DiagdError as exc:
                reply = control.ErrorReply(id=msg_id, **_wire(exc))
            await frames.send(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            await stream.aclose()


async def _handshake(frames: FrameStream) -> control.Hello | None:
    try:
        first = await frames.receive()
    except DiagdError as exc:
        await frames.send(control.ErrorReply(id=0, **_wire(exc)))
        return None
    if first is None:
        return None
    if not isinstance(first, control.Hello):
        await frames.send(control.ErrorReply(id=0, code=str(ErrorCode.PROTOCOL_ERROR),
                                             message=f"first message must be hello, got {first.tag!r}"))
        return None
    if first.version != control.PROTOCOL_VERSION:
        await frames.send(control.ErrorReply(
            id=0, code=str(ErrorCode.PROTOCOL_ERROR),
            message=f"protocol version {first.version} not supported (daemon speaks {control.PROTOCOL_VERSION})",
            details={"supported": [control.PROTOCOL_VERSION]}))
        return None
    await frames.send(control.Hello(version=control.PROTOCOL_VERSION, client="diagd"))
    return first


async def _dispatch(daemon: Daemon, msg: control.Message, who: str) -> Any:
    if isinstance(msg, control.StatusRequest):
        return daemon.status()
    if isinstance(msg, control.CallRequest):
        result = await daemon.registry.call(msg.tool, msg.arguments, CallContext(client=who))
        return {"is_error": result.is_error, "result": result.payload, "meta": result.meta}
    if isinstance(msg, control.StopActorRequest):
        return daemon.supervisor.stop(msg.actor_id, reason=f"stopped by {who}").statistics()
    if isinstance(msg, control.ReloadRequest):
        return daemon.reload()
    if isinstance(msg, control.ShutdownRequest):
        daemon.request_shutdown(f"shutdown requested by {who}")
        return {"stopping": True}
    raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"{msg.tag!r} is not a request")


def _wire(exc: DiagdError) -> dict[str, Any]:
    return {"code": str(exc.code), "message": exc.message, "details": exc.details}
