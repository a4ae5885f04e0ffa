"""The control-socket protocol people's commands speak (`diagd status`, `diagd call`, ...).

Frames are a 4-byte big-endian length followed by one msgpack map. The first frame a client
sends is `hello` with `PROTOCOL_VERSION`; the daemon answers `hello` or a coded `error` and
closes. Every later request carries an `id` echoed in its reply. Messages are typed as frozen
dataclasses and validated on decode, so a malformed frame becomes an `error` reply, not a
dropped connection or a crash.

This module is imported by the CLI, so it must stay stdlib + msgpack only (no trio, no mcp):
`diagd status` has to answer in well under 150 ms.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, ClassVar

from diagd.protocol.errors import DiagdError, ErrorCode
from diagd.protocol.framing import HEADER_SIZE as HEADER_SIZE
from diagd.protocol.framing import Codec
from diagd.protocol.framing import Message as Message

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Hello(Message):
    tag: ClassVar[str] = "hello"
    version: int
    client: str = ""


@dataclass(frozen=True)
class StatusRequest(Message):
    tag: ClassVar[str] = "status"
    id: int


@dataclass(frozen=True)
class CallRequest(Message):
    tag: ClassVar[str] = "call"
    id: int
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StopActorRequest(Message):
    tag: ClassVar[str] = "stop_actor"
    id: int
    actor_id: str


@dataclass(frozen=True)
class ReloadRequest(Message):
    tag: ClassVar[str] = "reload"
    id: int


@dataclass(frozen=True)
class ShutdownRequest(Message):
    tag: ClassVar[str] = "shutdown"
    id: int


@dataclass(frozen=True)
class Reply(Message):
    """A successful answer; `result` is whatever the request produces."""

    tag: ClassVar[str] = "reply"
    id: int
    result: Any = None


@dataclass(frozen=True)
class ErrorReply(Message):
    tag: ClassVar[str] = "error"
    id: int
    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


CODEC = Codec((Hello, StatusRequest, CallRequest, StopActorRequest, ReloadRequest, ShutdownRequest, Reply,
               ErrorReply), MAX_FRAME_BYTES)
encode = CODEC.encode
decode = CODEC.decode
frame_length = CODEC.frame_length


class BlockingClient:
    """A synchronous control-socket client for the CLI (no event loop: start-up time matters)."""

    def __init__(self, path: str, *, client: str, timeout: float | None = None) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._next_id = 0
        self._send(Hello(version=PROTOCOL_VERSION, client=client))
        reply = self._recv()
        if isinstance(reply, ErrorReply):
            raise DiagdError(ErrorCode(reply.code), reply.message, **reply.details)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, make: Any, **fields: Any) -> Any:
        """Send one request and return its result, raising DiagdError for an error reply."""
        self._next_id += 1
        self._send(make(id=self._next_id, **fields))
        reply = self._recv()
        if isinstance(reply, ErrorReply):
            raise DiagdError(_code(reply.code), reply.message, **reply.details)
        if not isinstance(reply, Reply):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"unexpected {reply.tag!r} reply")
        return reply.result

    def _send(self, msg: Message) -> None:
        self._sock.sendall(encode(msg))

    def _recv(self) -> Message:
        length = frame_length(self._recv_exact(HEADER_SIZE))
        return decode(self._recv_exact(length))

    def _recv_exact(self, n: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self._sock.recv(n - len(chunks))
            if not chunk:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "daemon closed the control connection")
            chunks += chunk
        return bytes(chunks)


def _code(raw: str) -> ErrorCode:
    try:
        return ErrorCode(raw)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR
