"""The control-socket protocol people's commands speak (`diagd status`, `diagd call`, ...).

Frames are a 4-byte big-endian length followed by one msgpack map. The first frame a client
sends is `hello` with `PROTOCOL_VERSION`; the daemon answers `hello` or a coded `error` and
closes. Every later request carries an `id` echoed in its reply. Version 2 added progress: a
`call` with `progress: true` gets zero or more `progress` frames with its id before its reply.
The daemon still answers version-1 clients, which never ask for progress and so never see one.
Messages are typed as frozen dataclasses and validated on decode, so a malformed frame becomes an `error` reply, not a
dropped connection or a crash.

The two directions have their own frame limits. Requests (client -> daemon) are small: the
largest legitimate one is a drgn script (schema cap 200,000 chars, under 1 MiB in msgpack), and
the daemon buffers them, so their limit bounds its memory. Replies (daemon -> client) carry tool
results: measured on the real captures, a 5000-row x 64-field pcap_timeline is ~0.96 MB and a
5000-frame pcap_frames_by_filter ~0.68 MB; a bpftrace page is capped at 4 MiB and crash/drgn
output at 64 MiB, so replies get room above that (the encoding adds its own bytes).

This module is imported by the CLI, so it must stay stdlib + msgpack only (no trio, no mcp):
`diagd status` has to answer in well under 150 ms.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from diagd.protocol.errors import DiagdError, ErrorCode
from diagd.protocol.framing import HEADER_SIZE as HEADER_SIZE
from diagd.protocol.framing import Codec, FrameReader, StreamEnded
from diagd.protocol.framing import Message as Message

PROTOCOL_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)  # what the daemon answers: older clients keep working across an upgrade
MAX_REQUEST_BYTES = 1024 * 1024
MAX_REPLY_BYTES = 128 * 1024 * 1024
MAX_FRAME_BYTES = MAX_REPLY_BYTES  # the larger of the two: what any frame may be at most


@dataclass(frozen=True)
class Hello(Message):
    tag: ClassVar[str] = "hello"
    version: int
    client: str = ""


@dataclass(frozen=True)
class StatusRequest(Message):
    tag: ClassVar[str] = "status"
    id: int
    memory: bool = False  # add the tracemalloc report (a daemon started with DIAGD_TRACEMALLOC; debug only)


@dataclass(frozen=True)
class CallRequest(Message):
    tag: ClassVar[str] = "call"
    id: int
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    progress: bool = False  # version 2: send `Progress` frames while the call runs


@dataclass(frozen=True)
class Progress(Message):
    """A long call's progress (the `CallContext.progress` reports), sent before its reply."""

    tag: ClassVar[str] = "progress"
    id: int
    progress: float
    total: float | None = None
    message: str | None = None


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
class ToolsRequest(Message):
    """Every registered tool with its group, description and input schema (`diagd tools`)."""

    tag: ClassVar[str] = "tools"
    id: int


@dataclass(frozen=True)
class UiLoginRequest(Message):
    """A one-time login link for the web view on the HTTP listener (`diagd ui`)."""

    tag: ClassVar[str] = "ui_login"
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


_TYPES = (Hello, StatusRequest, CallRequest, StopActorRequest, ReloadRequest, ShutdownRequest, ToolsRequest, Reply,
          ErrorReply, Progress, UiLoginRequest)
CODEC = Codec(_TYPES, MAX_FRAME_BYTES)
encode = CODEC.encode
decode = CODEC.decode
frame_length = CODEC.frame_length
# Per direction: what a client may send the daemon, and what the daemon may send back.
REQUESTS = Codec(_TYPES, MAX_REQUEST_BYTES)
REPLIES = Codec(_TYPES, MAX_REPLY_BYTES)


class NotServed(DiagdError):
    """The daemon did not serve this client: it refused the connection (BUSY), the socket is another
    user's, or the connection closed, reset or timed out before an answer. A refusal of the request
    itself is a plain DiagdError: the CLI says "no daemon" for this one (daemon/exits.py), "refused"
    for that."""


class BlockingClient:
    """A synchronous control-socket client for the CLI (no event loop: start-up time matters).

    Connecting raises FileNotFoundError / ConnectionRefusedError when no daemon listens; every
    later failure is a DiagdError, so the CLI can print one line instead of a traceback: NotServed
    when the connection failed (refused by a busy daemon, closed or reset, timeout), a plain one for
    an error reply to the request.
    """

    def __init__(self, path: str, *, client: str, timeout: float | None = None) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            check_peer_is_us(self._sock, path)
            self._next_id = 0
            self._send(Hello(version=PROTOCOL_VERSION, client=client))
            reply = self._recv()
        except DiagdError as exc:  # not our daemon's socket, or closed before its hello
            self._sock.close()
            raise exc if isinstance(exc, NotServed) else NotServed(exc.code, exc.message, **exc.details) from None
        except BaseException:
            self._sock.close()
            raise
        if isinstance(reply, ErrorReply):  # refused at the door (BUSY)
            self._sock.close()
            raise NotServed.from_wire(reply.code, reply.message, reply.details)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, make: Any, *, on_progress: Callable[[Progress], None] | None = None, **fields: Any) -> Any:
        """Send one request and return its result, raising DiagdError for an error reply.
        `on_progress` gets the request's progress frames (a call sent with `progress=True`)."""
        self._next_id += 1
        self._send(make(id=self._next_id, **fields))
        reply = self._recv()
        while isinstance(reply, Progress):
            if on_progress is not None and reply.id == self._next_id:
                on_progress(reply)
            reply = self._recv()
        if isinstance(reply, ErrorReply):
            raise DiagdError.from_wire(reply.code, reply.message, reply.details)
        if not isinstance(reply, Reply):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"unexpected {reply.tag!r} reply")
        return reply.result

    def _send(self, msg: Message) -> None:
        frame = REQUESTS.encode(msg)
        try:
            self._sock.sendall(frame)
        except OSError as exc:
            # The daemon may have refused us and closed already: its error frame is the better story.
            early = self._pending_error()
            if early is not None:
                raise early from None
            raise self._lost(exc) from None

    def _pending_error(self) -> DiagdError | None:
        try:
            self._sock.settimeout(1)
            reply = self._recv()
        except DiagdError:
            return None
        if isinstance(reply, ErrorReply):
            return NotServed.from_wire(reply.code, reply.message, reply.details)
        return None

    def _recv(self) -> Message:
        try:
            body = FrameReader(REPLIES).read(self._sock.recv)
        except OSError as exc:
            raise self._lost(exc) from None
        except StreamEnded:
            body = None
        if body is None:
            raise NotServed(ErrorCode.BACKEND_UNAVAILABLE,
                            f"the daemon closed the control connection ({self._path}) without answering")
        return REPLIES.decode(body)

    def _lost(self, exc: OSError) -> DiagdError:
        if isinstance(exc, TimeoutError):
            return NotServed(ErrorCode.TIMEOUT, f"no answer from the daemon on {self._path} in time")
        why = exc.strerror or type(exc).__name__
        return NotServed(ErrorCode.BACKEND_UNAVAILABLE, f"lost the control connection ({self._path}): {why}")


def check_peer_is_us(sock: socket.socket, path: str) -> None:
    """Refuse a socket served by another user (a runtime dir planted before our daemon started)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.getuid():
        raise DiagdError(ErrorCode.PERMISSION_DENIED,
                         f"refusing {path}: it is served by uid {uid}, not by uid {os.getuid()}", path=path, uid=uid)
