"""What the serial tools ask a port's actor: one frozen dataclass per operation, each a
`Message[<its reply>]` (the tool's reply model, or what the tool builds its reply from).

Every message that acts on the port names the client it acts for: the actor owns the port's owner
(and logs each take-over), so ownership is decided where the port is, in inbox order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from typing_extensions import TypedDict

from diagd.actors.message import Message
from diagd.actors.serial.replies import ReadUrcReply, SendReply, SignalsReply, WaitPolicy


class Configured(TypedDict):
    """What `Configure` did: configure_connection's reply is built from it."""

    reopened: bool  # the port was closed and opened again (it was not Connected)
    took_over_from: str | None  # the owner the port was taken from (force)


class Closed(TypedDict):
    """What `Close` did: configure_connection's reply is built from it."""

    took_over_from: str | None
    discarded_urc_packets: int  # URC packets the buffer still held


@dataclass(frozen=True)
class Configure(Message[Configured]):
    """Change the open port's settings and lines, or reopen it when it is not Connected."""

    client: str
    force: bool
    given: dict[str, Any] = field(default_factory=dict)  # the settings the call names; the others stay
    lines: dict[str, bool] = field(default_factory=dict)  # dtr / rts


@dataclass(frozen=True)
class Send(Message[SendReply]):
    """Write `payload` (plus the line ending), then wait for the reply by `wait_policy`."""

    client: str
    payload: bytes
    # A key of LINE_ENDINGS, or None for the port's own (configure_connection line_ending).
    line_ending: str | None
    wait_policy: WaitPolicy
    patterns: dict[bytes, str]  # stop pattern bytes -> as the caller wrote it
    text_patterns: bool  # a CR/LF right after a text pattern belongs to the reply
    timeout_s: float
    as_hex: bool


@dataclass(frozen=True)
class Signals(Message[SignalsReply]):
    client: str
    dtr: bool | None
    rts: bool | None
    break_ms: int | None


@dataclass(frozen=True)
class ReadUrc(Message[ReadUrcReply]):
    """Take (or, with `peek`, look at) the oldest URC packets; a peek needs no ownership."""

    client: str
    max_packets: int
    peek: bool
    as_hex: bool


@dataclass(frozen=True)
class Close(Message[Closed]):
    """End the session (the port is closed when the reply comes); the tool then stops the actor."""

    client: str
    force: bool
