"""Length-prefixed msgpack frames carrying typed messages: shared by the control socket and the
drgn worker's pipes.

A frame is a 4-byte big-endian length and one msgpack map tagged with `t`. Messages are frozen
dataclasses; `Codec.decode` validates the tag and every field's type, so a malformed frame becomes
a coded PROTOCOL_ERROR, never a crash. `FrameReader` cuts a byte stream into frame bodies, the
same way for the daemon's async streams and the drgn worker's blocking pipe. Stdlib + msgpack only:
the CLI and the drgn worker import it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Protocol

import msgpack

from diagd.protocol.errors import DiagdError, ErrorCode

HEADER = struct.Struct(">I")
HEADER_SIZE = HEADER.size
_SCALARS: dict[str, type | tuple[type, ...]] = {"int": int, "str": str, "float": (int, float), "bool": bool}


@dataclass(frozen=True)
class Message:
    tag: ClassVar[str] = ""

    def to_map(self) -> dict[str, Any]:
        return {"t": self.tag, **asdict(self)}


class Codec:
    """Encoder/decoder for one protocol: its message types and its maximum frame size."""

    def __init__(self, types: Iterable[type[Message]], max_frame_bytes: int) -> None:
        self.types = {cls.tag: cls for cls in types}
        self.max_frame_bytes = max_frame_bytes

    def encode(self, msg: Message) -> bytes:
        try:
            body: bytes = msgpack.packb(msg.to_map(), use_bin_type=True)
        except (OverflowError, TypeError, ValueError) as exc:  # e.g. an int beyond 64 bits in a result
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"{msg.tag!r} message cannot be encoded: {exc}") from None
        if len(body) > self.max_frame_bytes:
            raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE, f"frame of {len(body)} bytes exceeds {self.max_frame_bytes}")
        return HEADER.pack(len(body)) + body

    def frame_length(self, header: bytes) -> int:
        (length,) = HEADER.unpack(header)
        if length > self.max_frame_bytes:
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"frame of {length} bytes exceeds {self.max_frame_bytes}")
        return int(length)

    def decode(self, body: bytes) -> Message:
        """One frame body -> a typed message, or PROTOCOL_ERROR saying what is wrong with it."""
        try:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception as exc:
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"frame is not valid msgpack: {exc}") from None
        if not isinstance(raw, dict):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, "frame is not a msgpack map")
        tag = raw.pop("t", None)
        cls = self.types.get(tag) if isinstance(tag, str) else None
        if cls is None:
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"unknown message type {tag!r}")
        try:
            msg = cls(**raw)
        except TypeError as exc:
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"malformed {tag!r} message: {exc}") from None
        _check_fields(msg)
        return msg


class StreamEnded(DiagdError):
    """The stream ended inside a frame (its writer died, or it is not speaking this protocol)."""

    def __init__(self) -> None:
        super().__init__(ErrorCode.PROTOCOL_ERROR, "stream ended inside a frame")


class ByteStream(Protocol):
    """What `FrameReader.receive` reads from: a Trio receive stream (a socket, a child's stdout)."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray: ...


class FrameReader:
    """Cuts a byte stream into frame bodies, never reading a byte past the current frame (what
    follows stays in the kernel, so a frame waiting for memory holds only its header).

    `want()` is how many bytes the current frame still needs (its header, then its body) and `feed()`
    takes them; `read()` (blocking) and `receive()` (async) drive both. The header's length is checked
    against the codec's limit before any of the body is read.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._buffer = bytearray()
        self.length: int | None = None  # the current frame's body length, once its header is in

    @property
    def partial(self) -> bool:
        """Part of a frame has been read."""
        return bool(self._buffer) or self.length is not None

    @property
    def buffered(self) -> int:
        """Bytes of the current frame read so far."""
        return len(self._buffer) + (HEADER_SIZE if self.length is not None else 0)

    def want(self) -> int:
        return (HEADER_SIZE if self.length is None else self.length) - len(self._buffer)

    def feed(self, chunk: bytes | bytearray) -> bytes | None:
        """Take bytes (at most `want()`); the frame's body once it is complete."""
        self._buffer += chunk
        if self.length is None and len(self._buffer) >= HEADER_SIZE:
            self.length = self.codec.frame_length(bytes(self._buffer[:HEADER_SIZE]))
            del self._buffer[:HEADER_SIZE]
        if self.length is None or len(self._buffer) < self.length:
            return None
        body = bytes(self._buffer[:self.length])
        del self._buffer[:self.length]
        self.length = None
        return body

    def ended(self) -> None:
        """The stream ended: fine between frames, PROTOCOL_ERROR inside one."""
        if self.partial:
            raise StreamEnded

    def read(self, recv: Callable[[int], bytes | None]) -> bytes | None:
        """Blocking: the next frame's body, None at a clean end of the stream. `recv(n)` reads at most
        n bytes, b"" at the end (a file's `read`, a socket's `recv`)."""
        while True:
            chunk = recv(self.want())
            if not chunk:
                self.ended()
                return None
            if (body := self.feed(chunk)) is not None:
                return body

    async def receive(self, stream: ByteStream, *,
                      hold: Callable[[int], AbstractAsyncContextManager[Any]] | None = None) -> bytes | None:
        """The next frame's body (or the rest of one partly read), None at a clean end of the stream.
        `hold(length)`, once the header is in, is entered while the body is read (a memory budget)."""
        async with AsyncExitStack() as held:
            holding = False
            while True:
                if hold is not None and self.length is not None and not holding:
                    await held.enter_async_context(hold(self.length))
                    holding = True
                chunk = await stream.receive_some(min(65536, self.want()))
                if not chunk:
                    self.ended()
                    return None
                if (body := self.feed(chunk)) is not None:
                    return body


def _check_fields(msg: Message) -> None:
    for f in fields(msg):
        value = getattr(msg, f.name)
        wanted = str(f.type)  # annotations are strings here (from __future__ import annotations)
        if wanted.endswith("| None") and value is None:
            continue
        base = wanted.removesuffix(" | None")
        if base in _SCALARS and not isinstance(value, _SCALARS[base]):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"field {f.name!r} of {msg.tag!r} must be {base}")
        if base.startswith("dict[") and not isinstance(value, dict):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"field {f.name!r} of {msg.tag!r} must be {base}")
        if base == "list[str]" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"field {f.name!r} of {msg.tag!r} must be a list of strings")
