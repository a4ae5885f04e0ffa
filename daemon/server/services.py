"""What the daemon's parts see of the running daemon: `Services`, a Protocol that `server.Daemon` fulfils.

backends.py (each back end's runtime), builtin_tools.py, control_server.py and http/start.py work on
the daemon through this, so none of them imports server.py, which imports them all: no import cycle,
`TYPE_CHECKING` imports included (tests/test_import_cycles.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from diagd.actors.runtime import StopCheck
from diagd.daemon.config import Config
from diagd.daemon.server.audit import CallStats
from diagd.daemon.server.connections import ByteBudget
from diagd.daemon.server.declared import Declarations
from diagd.daemon.server.heap_trim import QuietTrimmer
from diagd.daemon.server.presence import Clients
from diagd.daemon.server.replies import ReloadReply, StatusReply
from diagd.daemon.server.supervisor import Supervisor
from diagd.daemon.server.tools import ToolRegistry
from diagd.daemon.server.ui.auth import UiAuth
from diagd.daemon.tool_groups import Selection

# Called by a reload with the old and the new config: notes on changed settings that do not apply to
# what is already open, or DiagdError to refuse the new config.
ReloadNotes = Callable[[Config, Config], list[dict[str, Any]]]


class Services(Protocol):
    """The daemon, as its parts use it (read-only views: only the daemon swaps these)."""

    @property
    def config(self) -> Config: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def runtime_dir(self) -> Path: ...

    @property
    def registry(self) -> ToolRegistry: ...

    @property
    def supervisor(self) -> Supervisor: ...

    @property
    def stats(self) -> CallStats: ...

    @property
    def clients(self) -> Clients: ...

    @property
    def declared(self) -> Declarations: ...

    @property
    def reload_hooks(self) -> list[ReloadNotes]: ...

    @property
    def stop_checks(self) -> dict[str, StopCheck]: ...

    @property
    def shutdown_reason(self) -> str | None: ...

    @property
    def frame_budget(self) -> ByteBudget: ...

    @property
    def trimmer(self) -> QuietTrimmer: ...

    @property
    def connections(self) -> dict[int, dict[str, Any]]: ...

    @property
    def sockets(self) -> dict[str, str]: ...  # where it listens, by kind ("http": the endpoint URL once bound)

    def status(self) -> StatusReply: ...

    def reload(self) -> ReloadReply: ...

    def request_shutdown(self, reason: str) -> None: ...

    @property
    def before_stop(self) -> list[Callable[[str], Awaitable[object]]]: ...

    @property
    def ui_auth(self) -> UiAuth: ...  # the web view's login links and browser sessions (ui/web.py)

    def configured_tools(self, config: Config | None = None) -> Selection: ...


class Front(Protocol):
    """The MCP front end, imported on first use (server.LazyFront): the mcp/front.py module and its SDK server."""

    def get(self) -> Awaitable[tuple[ModuleType, Any]]: ...
