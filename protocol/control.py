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
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import msgpack

from diagd.protocol.errors import DiagdError, ErrorCode

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class Message:
    tag: ClassVar[str] = ""

    def to_map(self) -> dict[str, Any]:
        return {"t": self.tag, **asdict(self)}


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


_TYPES: dict[str, type[Message]] = {
    cls.tag: cls
    for cls in (Hello, StatusRequest, CallRequest, StopActorRequest, ReloadRequest, ShutdownRequest,
                Reply, ErrorReply)
}


def encode(msg: Message) -> bytes:
    body: bytes = msgpack.packb(msg.to_map(), use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE, f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return int(length)


HEADER_SIZE = _HEADER.size


def decode(body: bytes) -> Message:
    """Turn one frame body into a typed message, or raise PROTOCOL_ERROR saying why."""
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"frame is not valid msgpack: {exc}") from None
    if not isinstance(raw, dict):
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, "frame is not a msgpack map")
    tag = raw.pop("t", None)
    cls = _TYPES.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"unknown message type {tag!r}")
    try:
        msg = cls(**raw)
    except TypeError as exc:
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"malformed {tag!r} message: {exc}") from None
    _check_field_types(msg)
    return msg


def _check_field_types(msg: Message) -> None:
    expected = {"id": int, "version": int, "tool": str, "arguments": dict, "actor_id": str, "client": str}
    for name, typ in expected.items():
        if hasattr(msg, name) and not isinstance(getattr(msg, name), typ):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"field {name!r} of {msg.tag!r} must be {typ.__name__}")


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
