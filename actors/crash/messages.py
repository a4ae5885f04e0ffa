"""What the crash back end and its session actors exchange: the spec a session is started with, the
hooks it reports through, its phases, and the messages the tools send it (frozen dataclasses,
`match`-dispatched by `CrashSession.handle`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diagd.actors.crash.settings import CrashSettings
from diagd.protocol.errors import DiagdError

if TYPE_CHECKING:
    from diagd.actors.crash.actor import CrashSession

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


# Settings fixed into a session's children when they are spawned: the binary, whether drgn runs, and
# what the sandbox lets them read. Every other [crash] key is read again by each call, so `diagd
# reload` applies it to open sessions; a reload that changes one of these says so (`reload_notes`).
SPAWN_SETTINGS = ("crash_binary", "drgn", "allowed_dirs", "pykdump_path")


@dataclass
class Hooks:
    on_failed: Callable[[CrashSession, DiagdError], None]
    on_exit: Callable[[CrashSession], None]
    # The current [crash] settings (they follow `diagd reload`); None: the spawn-time ones.
    settings: Callable[[], CrashSettings] | None = None



# -- messages: what the tools ask a session -----------------------------------------------------


@dataclass(frozen=True)
class RunCrash:
    """Run one crash command (or answer it from the cache unless `force`)."""

    command: str
    force: bool = False
    max_lines: int | None = None  # lines returned inline; None: [crash] output_lines
    extension: str | None = None  # a crash extension (.so) to load first (pykdump:)


@dataclass(frozen=True)
class RunDrgn:
    """Run Python in the session's drgn worker."""

    code: str
    filename: str = "<drgn>"
    isolated: bool = False  # a fresh namespace (analysis scripts), not the session's persistent one
    max_lines: int | None = None
    label: str | None = None  # what the stored output is listed as (default: the code)


@dataclass(frozen=True)
class Triage:
    """get_crash_info's report: sys, the panic task's bt, the log tail, kmem -i, ps (+ drgn's tasks)."""
