"""`diagd mcp`: the stdio shim an MCP client launches.

A byte pipe between stdio and the daemon's MCP socket. It never imports `mcp` (that alone takes
~0.7 s) and never writes anything but daemon bytes to stdout; diagnostics go to stderr. When no
daemon runs it starts one (detached) unless --no-autostart. Stdlib only, for start-up time.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from diagd.daemon import paths

CHUNK = 65536


def connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


def start_daemon_detached() -> subprocess.Popen[bytes]:
    """Start `diagd serve` in its own session, logging to the state dir, stdio off the wire."""
    state = paths.ensure_private_dir(paths.state_dir())
    with open(state / "daemon.log", "ab") as logfile:
        return subprocess.Popen(
            [sys.executable, "-m", "diagd.daemon.cli", "serve"],
            stdin=subprocess.DEVNULL, stdout=logfile, stderr=logfile,
            start_new_session=True, close_fds=True, env={**os.environ, "DIAGD_AUTOSTARTED": "1"},
        )


def wait_for_socket(path: Path, timeout_s: float, child: subprocess.Popen[bytes] | None = None
                    ) -> socket.socket | None:
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while time.monotonic() < deadline:
        sock = connect(path)
        if sock is not None:
            return sock
        if child is not None and child.poll() not in (None, 0):
            return None  # it died (not "already running", which exits 0 too late to matter)
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    return None


def connect_or_start(path: Path, *, autostart: bool, timeout_s: float = 15.0) -> socket.socket | None:
    sock = connect(path)
    if sock is not None or not autostart:
        return sock
    child = start_daemon_detached()
    return wait_for_socket(path, timeout_s, child)


def _pump_stdin(sock: socket.socket) -> None:
    try:
        while data := os.read(0, CHUNK):
            sock.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)  # tell the daemon the client is gone
        except OSError:
            pass


def run(*, autostart: bool = True) -> int:
    path = paths.mcp_socket()
    sock = connect_or_start(path, autostart=autostart)
    if sock is None:
        hint = "" if autostart else " (autostart disabled; run `diagd serve` or the systemd user service)"
        sys.stderr.write(f"diagd mcp: no daemon listening on {path}{hint}; see {paths.state_dir()}/daemon.log\n")
        return 1
    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True, name="stdin->daemon").start()
    try:
        while data := sock.recv(CHUNK):
            view = memoryview(data)
            while view:
                written = os.write(1, view)
                view = view[written:]
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    return 0
