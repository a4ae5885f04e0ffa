"""The systemd user units: `diagd service install|uninstall|print`, and `diagd restart` through them.

`--socket` adds diagd.socket (socket activation): systemd holds the sockets and starts the
service on the first client, so only the socket is enabled, never the service itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from diagd.daemon.exits import EXIT_OK

TEMPLATE_EXEC = "ExecStart=%h/.local/bin/diagd serve"
TEMPLATE_DOCS = "Documentation=file:@UNITS@/README.md"
# Set in the shell that installs the unit: the daemon systemd starts must use the same (a client whose
# environment lost them still finds that daemon, through the runtime dir: daemon/paths.py).
CARRIED_ENV = ("DIAGD_CONFIG", "DIAGD_STATE_DIR")


def diagd_executable() -> str:
    found = shutil.which("diagd")
    candidate = Path(sys.argv[0]).resolve() if Path(sys.argv[0]).name == "diagd" else None
    return str(candidate or (Path(found).resolve() if found else Path(sys.prefix) / "bin" / "diagd"))


def render_unit(executable: str | None = None) -> str:
    template = _template("diagd.service")
    env = "".join(f'\nEnvironment="{name}={_quoted(os.path.abspath(value))}"' for name in CARRIED_ENV
                  if (value := os.environ.get(name)))
    return template.replace(TEMPLATE_EXEC, f"ExecStart={_quoted(executable or diagd_executable())} serve{env}")


def render_socket() -> str:
    return _template("diagd.socket")


def _template(name: str) -> str:
    """A unit file, its Documentation= pointing at the README installed beside it (a real file)."""
    units = resources.files("diagd.systemd")
    return units.joinpath(name).read_text().replace(TEMPLATE_DOCS, f"Documentation=file:{units}/README.md")


def _quoted(value: str) -> str:
    """For a unit file: `%` is a specifier, `\\` and `"` escape inside quotes."""
    return value.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')


def unit_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user"


# What systemctl says when there is no user manager to talk to (a container, a session without
# lingering): the caller's own line says what to do instead, so these are not repeated.
_NO_MANAGER = ("Failed to connect to bus", "No medium found", "System has not been booted with systemd",
               "$DBUS_SESSION_BUS_ADDRESS and $XDG_RUNTIME_DIR not defined")


def _systemctl(*args: str, timeout_s: float = 30) -> bool:
    """`systemctl --user ARGS`; its failure said in one line of diagd's (none without a user manager)."""
    shown = " ".join(["systemctl", "--user", *args])
    try:
        done = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except OSError:
        return False  # no systemctl: as no user manager
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"diagd service: {shown} did not answer within {timeout_s:g} s\n")
        return False
    if done.returncode != 0 and not any(marker in done.stderr for marker in _NO_MANAGER):
        said = done.stderr.strip().splitlines()
        sys.stderr.write(f"diagd service: {shown}: {said[0] if said else f'exit status {done.returncode}'}\n")
    return done.returncode == 0


def is_service_daemon(pid: int) -> bool:
    """Whether the daemon `pid` is the user service's main process (`diagd restart` then goes through
    systemd); not merely whether the service is active: a daemon of another runtime directory (a test's,
    DIAGD_RUNTIME_DIR) beside the user's service is not the one to restart."""
    try:
        active = subprocess.run(["systemctl", "--user", "is-active", "--quiet", "diagd"], capture_output=True,
                                timeout=30, check=False)
        if active.returncode != 0:
            return False
        shown = subprocess.run(["systemctl", "--user", "show", "--property=MainPID", "--value", "diagd"],
                               capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False  # no systemctl, or no user manager answering
    return shown.returncode == 0 and shown.stdout.strip() == str(pid)


def restart() -> bool:
    """`systemctl --user restart diagd` (its error, if any, on stderr); bounded past the unit's
    TimeoutStopSec (30 s) plus a start."""
    return _systemctl("restart", "diagd", timeout_s=90)


def run(action: str, *, start: bool = True, socket: bool = False) -> int:
    if action == "print":
        sys.stdout.write(render_socket() if socket else render_unit())
        return EXIT_OK
    service, socket_unit = unit_dir() / "diagd.service", unit_dir() / "diagd.socket"
    if action == "uninstall":  # both, whichever way it was installed
        installed = [unit.name for unit in (socket_unit, service) if unit.exists()]
        if installed:
            _systemctl("disable", "--now", *installed)
        for target in (socket_unit, service):
            if target.exists():
                target.unlink()
                print(f"removed {target}")
        _systemctl("daemon-reload")
        return EXIT_OK
    service.parent.mkdir(parents=True, exist_ok=True)
    service.write_text(render_unit())
    print(f"wrote {service}")
    if socket:
        socket_unit.write_text(render_socket())
        print(f"wrote {socket_unit}")
    if not start:
        return EXIT_OK
    if socket and _start_socket():
        print("socket enabled and listening; the first client starts the daemon: systemctl --user status diagd.socket")
        return EXIT_OK
    if not socket and _systemctl("daemon-reload") and _systemctl("enable", "--now", "diagd.service"):
        print("enabled and started: systemctl --user status diagd")
        return EXIT_OK
    print("no systemd user manager here; start the daemon with `diagd start` instead "
          "(or `loginctl enable-linger $USER` and log in again)")
    return EXIT_OK


def _start_socket() -> bool:
    """Hand the sockets to systemd: a running service (a plain install) is stopped first, or it
    would keep serving files systemd is about to replace; then only the socket is enabled."""
    return (_systemctl("daemon-reload") and _systemctl("disable", "--now", "diagd.service")
            and _systemctl("enable", "--now", "diagd.socket"))
