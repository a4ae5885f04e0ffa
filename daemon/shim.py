"""`diagd mcp`: the stdio shim an MCP client launches.

A byte pipe between stdio and the daemon's MCP socket. It never imports `mcp` (that alone takes
~0.7 s) and never writes anything but daemon bytes to stdout; diagnostics go to stderr. When no
daemon runs it starts one (detached) unless --no-autostart. Stdlib only, for start-up time.

It exits 0 only when the client ended the session (stdin EOF) and the daemon answered; a daemon
that refuses it (busy), drops it, or closes first gets one line on stderr and exit status 1,
never a silent 0. The daemon's last words, if any, are a JSON-RPC error with `id: null` and
`data.closing: true`: the shim quotes its message.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from diagd.daemon import paths
from diagd.protocol.errors import DiagdError, ErrorCode

CHUNK = 65536
TAIL_BYTES = 4096  # enough for a closing notice; the shim keeps no more of the stream than this


def connect(path: Path) -> socket.socket | None:
    """A connection to a daemon of ours at `path`; None when nobody listens there."""
    from diagd.protocol.control import check_peer_is_us  # msgpack import only once connected

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot connect to {path}: {exc.strerror or exc}") from None
    try:
        check_peer_is_us(sock, str(path))
    except DiagdError:
        sock.close()
        raise
    return sock


def start_daemon_detached() -> subprocess.Popen[bytes]:
    """Start `diagd serve` in its own session, logging to the state dir, stdio off the wire."""
    state = paths.open_private_dir(paths.state_dir(), what="state directory")
    try:
        logfd = state.open("daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    finally:
        state.close()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "diagd.daemon.cli", "serve"],
            stdin=subprocess.DEVNULL, stdout=logfd, stderr=logfd,
            start_new_session=True, close_fds=True, env={**os.environ, "DIAGD_AUTOSTARTED": "1"},
        )
    finally:
        os.close(logfd)


def last_log_line(max_bytes: int = 4096) -> str:
    """The daemon log's last line (`diagd serve` ends it with its one-line reason for exiting)."""
    try:
        with open(paths.state_dir() / "daemon.log", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


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


class _Session:
    """What the shim needs to know at the end: who hung up first, and the daemon's last words."""

    def __init__(self) -> None:
        self.stdin_closed = threading.Event()
        self.sent = 0
        self.received = 0
        self.tail = b""

    def saw(self, data: bytes) -> None:
        self.received += len(data)
        self.tail = (self.tail + data)[-TAIL_BYTES:]

    def closing_notice(self) -> str | None:
        """The message of a trailing `{"id": null, "error": {..., "data": {"closing": true}}}` line."""
        lines = self.tail.rstrip(b"\n").rsplit(b"\n", 1)
        try:
            last = json.loads(lines[-1])
            error = last["error"]
            if last.get("id") is None and error.get("data", {}).get("closing"):
                return str(error["message"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        return None

    def verdict(self) -> str | None:
        """None when the session ended normally, else the line to print."""
        if notice := self.closing_notice():
            return f"the daemon closed the connection: {notice}"
        if not self.stdin_closed.is_set():
            return "the daemon closed the connection before the client was done"
        if self.sent and not self.received:
            return "the daemon closed the connection without answering"
        return None


def _pump_stdin(sock: socket.socket, session: _Session) -> None:
    try:
        while data := os.read(0, CHUNK):
            sock.sendall(data)
            session.sent += len(data)
    except OSError:
        pass
    finally:
        session.stdin_closed.set()  # before the daemon can see EOF and close: the order is the verdict
        try:
            sock.shutdown(socket.SHUT_WR)  # tell the daemon the client is gone
        except OSError:
            pass


def run(*, autostart: bool = True, first_line: bytes = b"") -> int:
    """`first_line`: the connection's options (`tool_groups.options_line`), sent before any MCP byte."""
    path = paths.mcp_socket()
    try:
        sock = connect_or_start(path, autostart=autostart)
        if sock is not None and first_line:
            sock.sendall(first_line)
    except OSError as exc:
        sys.stderr.write(f"diagd mcp: {ErrorCode.BACKEND_UNAVAILABLE}: lost the connection to {path}: "
                         f"{exc.strerror or exc}\n")
        return 1
    except DiagdError as exc:
        sys.stderr.write(f"diagd mcp: {exc.code}: {exc.message}\n")
        return 1
    if sock is None:
        hint = "" if autostart else " (autostart disabled; run `diagd serve` or the systemd user service)"
        reason = last_log_line() if autostart else ""
        sys.stderr.write(f"diagd mcp: no daemon listening on {path}{hint}; "
                         + (f"the daemon said: {reason}" if reason else f"see {paths.state_dir()}/daemon.log")
                         + "\n")
        return 1
    session = _Session()
    threading.Thread(target=_pump_stdin, args=(sock, session), daemon=True, name="stdin->daemon").start()
    try:
        while data := sock.recv(CHUNK):
            session.saw(data)
            view = memoryview(data)
            while view:
                written = os.write(1, view)
                view = view[written:]
    except BrokenPipeError:
        return 0  # the client closed its end of stdout: it is gone, nobody is left to tell
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    if problem := session.verdict():
        sys.stderr.write(f"diagd mcp: {problem}\n")
        return 1
    return 0
