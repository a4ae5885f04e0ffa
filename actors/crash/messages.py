"""What the crash back end and its session actors exchange: the spec a session is started with, the
hooks it reports through, its phases, and the messages the tools send it (frozen dataclasses,
`match`-dispatched by `CrashSession.handle`, each a `Message[<its reply model>]`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from diagd.actors.crash.replies import CommandResult, TriageReply
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.message import Message
from diagd.protocol.errors import DiagdError

KIND = "crash"


class Phase(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"  # drgn only: could not load, crash still serves
    DEAD = "dead"  # drgn only: the worker died; the next drgn call starts a fresh one
    STOPPING = "stopping"  # the session is being closed: its child is being asked to quit (or killed)
    CLOSED = "closed"  # the child is gone (reaped) because the session ended


@dataclass(frozen=True)
class SessionSpec:
    session_id: str
    key: str
    vmcore: Path
    vmlinux: Path
    workdir: Path
    crash_args: tuple[str, ...]
    settings: CrashSettings  # as they were when the children were spawned (see SPAWN_SETTINGS)
    osrelease: str | None = None
    # diagd's state and runtime dirs: kept out of what the sandbox lets the children read, even where
    # allowed_dirs holds them (every client's outputs, logs and the audit log are there).
    private_dirs: tuple[str, ...] = ()


# Settings fixed into a session's children when they are spawned: the binary, whether drgn runs, and
# what the sandbox lets them read. Every other [crash] key is read again by each call, so `diagd
# reload` applies it to open sessions; a reload that changes one of these says so (`reload_notes`).
SPAWN_SETTINGS = ("crash_binary", "drgn", "allowed_dirs", "pykdump_path")


@dataclass
class Hooks:
    on_failed: Callable[[SessionView, DiagdError], None]
    on_exit: Callable[[SessionView], None]
    # The current [crash] settings (they follow `diagd reload`); None: the spawn-time ones.
    settings: Callable[[], CrashSettings] | None = None



class SessionView(Protocol):
    """What the back end reads of a running session without asking it: a single-writer structure.

    The session actor (`actor.CrashSession`) is its only writer, from its own tasks; the back end's
    handlers only read it, on the same Trio thread, so every read is a consistent snapshot between
    two checkpoints. It is read, not asked, because the reads must not queue behind the inbox:
    `open_vmcore_session` reports crash's loading every 0.5 s while the inbox serves drgn calls,
    `list_vmcore_sessions` shows phases while a long command runs, and `close_vmcore_session` waits
    for `stopped` after the inbox is closed. Everything else goes through the messages below.
    """

    @property
    def spec(self) -> SessionSpec: ...
    @property
    def crash_phase(self) -> Phase: ...
    @property
    def drgn_phase(self) -> Phase: ...
    @property
    def crash_done(self) -> trio.Event: ...  # crash's load ended (ready or failed)
    @property
    def crash_error(self) -> DiagdError | None: ...
    @property
    def failure(self) -> DiagdError | None: ...  # the session failed (a child died or hung)
    @property
    def started_at(self) -> float: ...  # trio.current_time() when the actor was made
    @property
    def crash_load_s(self) -> float | None: ...
    @property
    def drgn_load_s(self) -> float | None: ...
    @property
    def summary(self) -> dict[str, Any]: ...  # open_vmcore_session's summary, once crash is ready
    @property
    def commands(self) -> int: ...
    @property
    def stopped(self) -> trio.Event: ...  # the children are reaped and `stop_results` final
    @property
    def stop_results(self) -> dict[str, str]: ...


# -- messages: what the tools ask a session -----------------------------------------------------


@dataclass(frozen=True)
class RunCrash(Message[CommandResult]):
    """Run one crash command (or answer it from the cache unless `force`)."""

    command: str
    force: bool = False
    max_lines: int | None = None  # lines returned inline; None: [crash] output_lines
    extension: str | None = None  # a crash extension (.so) to load first (pykdump:)


@dataclass(frozen=True)
class RunDrgn(Message[CommandResult]):
    """Run Python in the session's drgn worker."""

    code: str
    filename: str = "<drgn>"
    isolated: bool = False  # a fresh namespace (analysis scripts), not the session's persistent one
    max_lines: int | None = None
    label: str | None = None  # what the stored output is listed as (default: the code)


@dataclass(frozen=True)
class Triage(Message[TriageReply]):
    """get_crash_info's report: sys, the panic task's bt, the log tail, kmem -i, ps (+ drgn's tasks)."""
