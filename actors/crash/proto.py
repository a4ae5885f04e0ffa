"""The drgn worker's wire protocol: length-prefixed msgpack frames over the worker's stdin/stdout.

Every frame is a 4-byte big-endian length and one msgpack map tagged with `t`. The worker speaks
first with `hello` carrying `PROTOCOL_VERSION`; the daemon's first request (`load`) carries it too,
and either side refuses a version it does not speak. Each request has an `id` echoed by its reply.
Messages are frozen dataclasses validated on decode, so a malformed frame becomes a coded `error`
reply rather than a dead worker. Stdlib + msgpack only: the worker imports this before drgn.

Outputs never travel in frames: `exec` names the file the worker writes the output to, and
`exec_result` carries only its first `HEAD_BYTES` and counts, so a frame stays far below
MAX_FRAME_BYTES whatever the code prints (the output cap applies to the file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO, ClassVar

from diagd.protocol import framing
from diagd.protocol.framing import Message as Message

PROTOCOL_VERSION = 3  # 3: outputs come back as Output frames (the worker writes no host file)
MAX_FRAME_BYTES = 8 * 1024 * 1024  # requests carry code (scripts), replies a bounded head and traceback
MAX_ERROR_CHARS = 64 * 1024  # a traceback longer than this keeps its start and its end
HEADER = framing.HEADER


@dataclass(frozen=True)
class Hello(Message):
    """Worker -> daemon, first frame."""

    tag: ClassVar[str] = "hello"
    version: int
    pid: int
    drgn_version: str = ""


@dataclass(frozen=True)
class Load(Message):
    """Daemon -> worker, first request: open the dump and its debug info."""

    tag: ClassVar[str] = "load"
    id: int
    version: int
    vmcore: str
    debug_files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Loaded(Message):
    tag: ClassVar[str] = "loaded"
    id: int
    load_s: float
    warnings: list[str] = field(default_factory=list)
    tasks: int = -1  # what for_each_task() sees (crash 8.0.2 sees fewer on 6.1.y)
    crashed_pid: int = -1
    crashed_comm: str = ""


@dataclass(frozen=True)
class Exec(Message):
    """Run Python with `prog` and drgn's Linux helpers in scope; the namespace persists."""

    tag: ClassVar[str] = "exec"
    id: int
    code: str
    filename: str = "<drgn>"
    max_output_bytes: int = 16 * 1024 * 1024
    isolated: bool = False  # a fresh copy of the initial namespace (analysis scripts), run as __main__


@dataclass(frozen=True)
class Output(Message):
    """Worker -> daemon, during an Exec: the next piece of its output, which the daemon stores. The worker
    runs where it can write nothing of the host's (its namespaces), so the output comes back this way."""

    tag: ClassVar[str] = "output"
    id: int
    data: bytes


@dataclass(frozen=True)
class ExecResult(Message):
    tag: ClassVar[str] = "exec_result"
    id: int
    head: str  # the first HEAD_BYTES of the output (the whole of it came in Output frames)
    head_complete: bool = True  # the head is the whole output
    output_bytes: int = 0
    lines: int = 0
    error: str | None = None  # the traceback as text (at most MAX_ERROR_CHARS); the worker lives on
    duration_s: float = 0.0
    truncated: bool = False  # the output passed max_output_bytes and was cut there
    interrupted: bool = False


@dataclass(frozen=True)
class Ping(Message):
    tag: ClassVar[str] = "ping"
    id: int


@dataclass(frozen=True)
class Pong(Message):
    tag: ClassVar[str] = "pong"
    id: int
    rss_bytes: int = 0


@dataclass(frozen=True)
class Quit(Message):
    tag: ClassVar[str] = "quit"
    id: int


@dataclass(frozen=True)
class Error(Message):
    tag: ClassVar[str] = "error"
    id: int
    code: str
    message: str


CODEC = framing.Codec((Hello, Load, Loaded, Exec, Output, ExecResult, Ping, Pong, Quit, Error), MAX_FRAME_BYTES)
encode = CODEC.encode
decode = CODEC.decode
frame_length = CODEC.frame_length


def read_frame(stream: BinaryIO) -> bytes | None:
    """Blocking read of one frame body (the worker side); None at a clean EOF."""
    return framing.FrameReader(CODEC).read(stream.read)
