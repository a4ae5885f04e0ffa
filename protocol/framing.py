"""Length-prefixed msgpack frames carrying typed messages: shared by the control socket and the
drgn worker's pipes.

A frame is a 4-byte big-endian length and one msgpack map tagged with `t`. Messages are frozen
dataclasses; `Codec.decode` validates the tag and every field's type, so a malformed frame becomes
a coded PROTOCOL_ERROR, never a crash. Stdlib + msgpack only: the CLI and the drgn worker import it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

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
