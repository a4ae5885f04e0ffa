"""`diagd service install|uninstall|print`: the systemd user unit, pointed at this diagd."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

TEMPLATE_EXEC = "ExecStart=%h/.local/bin/diagd serve"


def diagd_executable() -> str:
    found = shutil.which("diagd")
    candidate = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "diagd" else None
    return str(candidate or (Path(found).resolve() if found else Path(sys.prefix) / "bin" / "diagd"))


def render_unit(executable: str | None = None) -> str:
    template = resources.files("diagd.systemd").joinpath("diagd.service").read_text()
    return template.replace(TEMPLATE_EXEC, f"ExecStart={executable or diagd_executable()} serve")


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


def _systemctl(*args: str) -> bool:
    try:
        done = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
    return done.returncode == 0


def run(action: str, *, start: bool = True) -> int:
    if action == "print":
        sys.stdout.write(render_unit())
        return 0
    target = unit_dir() / "diagd.service"
    if action == "uninstall":
        _systemctl("disable", "--now", "diagd.service")
        target.unlink(missing_ok=True)
        _systemctl("daemon-reload")
        print(f"removed {target}")
        return 0
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_unit())
    print(f"wrote {target}")
    if not start:
        return 0
    if _systemctl("daemon-reload") and _systemctl("enable", "--now", "diagd.service"):
        print("enabled and started: systemctl --user status diagd")
        return 0
    print("no systemd user manager here; start the daemon with `diagd start` instead "
          "(or `loginctl enable-linger $USER` and log in again)")
    return 0
