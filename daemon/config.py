"""The one TOML config file, parsed into frozen dataclasses (stdlib only).

Reloading builds a new `Config`; nothing mutates a config in place, so an actor that holds a
reference keeps a consistent view until it asks for the new one.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from diagd.daemon import paths
from diagd.protocol.errors import DiagdError, ErrorCode

VISIBILITY_MODES = ("verbose", "simple", "off")


@dataclass(frozen=True)
class DaemonConfig:
    idle_timeout_s: float = 600.0
    call_timeout_s: float = 30.0
    max_line_bytes: int = 8 * 1024 * 1024
    max_connections: int = 64
    # Connection deadlines: a new connection's first message (control hello / first MCP line)
    # must be complete within handshake_timeout_s; a control frame, once its first byte came,
    # within frame_timeout_s. Half-received large control frames share control_buffer_bytes.
    handshake_timeout_s: float = 10.0
    frame_timeout_s: float = 10.0
    control_buffer_bytes: int = 4 * 1024 * 1024
    inbox_size: int = 32
    audit_max_bytes: int = 10 * 1024 * 1024
    audit_keep: int = 5
    visibility: str = "verbose"
    allowed_dirs: tuple[str, ...] = ()
    # Seconds of regex matching one call may spend on a caller's pattern (all lines, fields, frames).
    regex_budget_s: float = 5.0
    # Extra back-end modules to load (dotted import paths); tests use it for their echo actor.
    extra_backends: tuple[str, ...] = ()


@dataclass(frozen=True)
class Config:
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
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
    daemon_raw = dict(raw.get("daemon", {}))
    known = {f.name: f for f in fields(DaemonConfig)}
    unknown = set(daemon_raw) - set(known)
    if unknown:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown [daemon] keys in {source}: {sorted(unknown)}")
    for key in ("allowed_dirs", "extra_backends"):
        if key in daemon_raw:
            daemon_raw[key] = tuple(daemon_raw[key])
    if daemon_raw.get("visibility", "verbose") not in VISIBILITY_MODES:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[daemon] visibility must be one of {VISIBILITY_MODES}")
    try:
        daemon = DaemonConfig(**daemon_raw)
    except TypeError as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"bad [daemon] table in {source}: {exc}") from None
    for key in ("handshake_timeout_s", "frame_timeout_s", "max_connections", "control_buffer_bytes"):
        if not isinstance(getattr(daemon, key), int | float) or getattr(daemon, key) <= 0:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[daemon] {key} must be a positive number in {source}")
    backends = {k: v for k, v in raw.items() if k != "daemon" and isinstance(v, dict)}
    return Config(daemon=daemon, backends=backends, source=source)
