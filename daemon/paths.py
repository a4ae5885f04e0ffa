"""Where diagd keeps its sockets, state and config (stdlib only: the CLI imports it)."""

from __future__ import annotations

import os
from pathlib import Path


def runtime_dir() -> Path:
    """Owner-only socket directory: $XDG_RUNTIME_DIR/diagd, else /tmp/diagd-$UID."""
    if override := os.environ.get("DIAGD_RUNTIME_DIR"):
        return Path(override)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "diagd"
    return Path(f"/tmp/diagd-{os.getuid()}")


def mcp_socket() -> Path:
    return runtime_dir() / "mcp.sock"


def control_socket() -> Path:
    return runtime_dir() / "control.sock"


def state_dir() -> Path:
    if override := os.environ.get("DIAGD_STATE_DIR"):
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "diagd"


def config_file() -> Path:
    if override := os.environ.get("DIAGD_CONFIG"):
        return Path(override)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "diagd" / "config.toml"


def ensure_private_dir(path: Path) -> Path:
    """Create `path` with mode 0700 and refuse one that someone else owns or can enter."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"{path} is owned by uid {st.st_uid}, not {os.getuid()}")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path
