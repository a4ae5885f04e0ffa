"""The one TOML config file, parsed into frozen dataclasses (stdlib only, `actors/settings.py`'s parser).

Reloading builds a new `Config`; nothing mutates a config in place, so an actor that holds a
reference keeps a consistent view until it asks for the new one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from diagd.actors.settings import parse_table, setting
from diagd.daemon import paths
from diagd.daemon.http_settings import HttpConfig
from diagd.protocol.errors import DiagdError, ErrorCode

VISIBILITY_MODES = ("verbose", "simple", "off")


@dataclass(frozen=True)
class DaemonConfig:
    idle_timeout_s: float = setting(600.0, positive=True)
    call_timeout_s: float = setting(30.0, positive=True)
    max_line_bytes: int = setting(8 * 1024 * 1024, positive=True)
    max_connections: int = setting(64, positive=True)
    # Connection deadlines: a new connection's first message (control hello / first MCP line)
    # must be complete within handshake_timeout_s; a control frame, once its first byte came,
    # within frame_timeout_s. Half-received large control frames share control_buffer_bytes.
    handshake_timeout_s: float = setting(10.0, positive=True)
    frame_timeout_s: float = setting(10.0, positive=True)
    control_buffer_bytes: int = setting(4 * 1024 * 1024, positive=True)
    inbox_size: int = setting(32, positive=True)
    audit_max_bytes: int = setting(10 * 1024 * 1024, positive=True)
    audit_keep: int = setting(5, minimum=0)
    visibility: str = setting("verbose", choices=VISIBILITY_MODES)
    allowed_dirs: tuple[str, ...] = ()
    # Seconds of regex matching one call may spend on a caller's pattern (all lines, fields, frames).
    regex_budget_s: float = setting(5.0, positive=True)
    # Extra back-end modules to load (dotted import paths); tests use it for their echo actor.
    extra_backends: tuple[str, ...] = ()


@dataclass(frozen=True)
class McpConfig:
    # The tool groups (back ends) MCP clients see unless they choose with `diagd mcp --tools`;
    # empty: every group. The daemon's own tools are always listed.
    tools: tuple[str, ...] = ()
    # diagd_calls shows every client's calls of the groups a client selected; the arguments of other
    # clients' calls (serial payloads, drgn code, bpftrace programs) only when this is true.
    show_other_clients_arguments: bool = False


# Tables the daemon parses itself; every other table belongs to the back end of that name.
OWN_TABLES = ("daemon", "mcp", "http")


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    # Per-back-end tables stay raw here; each back end parses its own table.
    backends: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = "<defaults>"

    def backend(self, name: str) -> dict[str, Any]:
        return self.backends.get(name, {})


def load(path: Path | None = None) -> Config:
    """Read the config file; a missing file means defaults, a broken one a coded error."""
    path = path or paths.config_file()
    if not path.exists():
        return Config()
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"cannot read config {path}: {exc}", path=str(path)) from None
    return parse(raw, source=str(path))


def parse(raw: dict[str, Any], *, source: str = "<memory>") -> Config:
    for key, value in raw.items():
        if not isinstance(value, dict):  # above the first [table]: it would be ignored in silence
            owner = next((t for t, cls in _OWN.items() if key in {f.name for f in fields(cls)}), None)
            hint = f" (did you mean [{owner}] {key}?)" if owner else ""
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{key} is outside any table: settings go under a table "
                             f"such as [daemon]{hint}", setting=key, source=source)
    daemon = parse_table(DaemonConfig, "daemon", raw.get("daemon", {}), source=source)
    http = parse_table(HttpConfig, "http", raw.get("http", {}), source=source)
    mcp = parse_table(McpConfig, "mcp", raw.get("mcp", {}), source=source)
    backends = {k: v for k, v in raw.items() if k not in OWN_TABLES and isinstance(v, dict)}
    return Config(daemon=daemon, http=http, mcp=mcp, backends=backends, source=source)


_OWN: dict[str, Any] = {"daemon": DaemonConfig, "http": HttpConfig, "mcp": McpConfig}
