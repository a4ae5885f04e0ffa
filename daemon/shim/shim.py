"""`diagd mcp`: the stdio shim an MCP client launches.

It carries newline-delimited JSON-RPC between stdio and the daemon's MCP socket, line by line, and
keeps the session across a daemon restart: when the connection drops (or the daemon says it stops,
DAEMON_STOPPING), it reconnects with backoff within a bound (DIAGD_SHIM_RECONNECT_S, 30 s),
replays the client's `initialize` and `initialized` (the answer is swallowed), and answers every
call that was in flight with a coded DAEMON_RESTARTED error; calls sent meanwhile wait and then go
through. The session's state is `shim_session.ShimSession`. It never imports `mcp` (that alone takes
~0.7 s) and never writes anything but daemon lines (and its DAEMON_RESTARTED answers) to stdout;
diagnostics go to stderr. When no daemon runs it starts one (detached) unless --no-autostart.
Stdlib only, for start-up time.

It exits 0 only when the client ended the session (stdin EOF) and every request it sent was answered,
by the daemon or with DAEMON_RESTARTED (a restart is no failure: the session went on). Otherwise one
line on stderr, never a silent 0, and the statuses of daemon/exits.py: NO_DAEMON for no daemon, one
that refuses the connection (busy: its last words are a JSON-RPC error with `id: null` and
`data.closing: true`, which the shim quotes), one that does not come back within the bound, or a
request left with no answer at all; FAILED for a daemon that refuses what the client sent (a line too
long) or the replayed session.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from diagd.daemon import launch, paths
from diagd.daemon.exits import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_OK
from diagd.daemon.shim.shim_session import Closing, Lines, ReplayFailed, ShimSession, Verdict
from diagd.protocol.errors import DiagdError, ErrorCode

CHUNK = 65536
# Client bytes held while their line is incomplete (a reconnect never splits a line); past this they go
# on as they are: a line that never ends meets the daemon's max_line_bytes refusal, not unbounded memory.
MAX_HELD_BYTES = 16 * 1024 * 1024
RECONNECT_S = 30.0  # how long a dropped session waits for a daemon to come back
# Under systemd a restarted daemon is back well within this: autostarting earlier would race the
# service manager's own start (the loser exits, but it might be systemd's).
AUTOSTART_AFTER_S = 2.0
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.02, 0.2  # a refused connect costs ~20 µs: polling often is cheap


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


AUTOSTART_WAIT_S = 15.0  # for a daemon just started to answer on its control socket


def connect_or_start(path: Path, *, autostart: bool, timeout_s: float = AUTOSTART_WAIT_S) -> socket.socket | None:
    sock = connect(path)
    if sock is not None or not autostart:
        return sock
    child = launch.start_detached()
    try:
        return wait_for_socket(path, timeout_s, child)
    finally:
        reap_in_background(child)


def reap_in_background(child: subprocess.Popen[bytes]) -> None:
    """Wait for an autostarted daemon from a thread: a shim that outlives it (it reconnects after a
    `diagd stop`) must not keep it a zombie, which `diagd stop` would take for a daemon still running."""
    threading.Thread(target=child.wait, daemon=True, name="reaper").start()


def _env_seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ[name]))
    except (KeyError, ValueError):
        return default


class _Link:
    """The session and its current connection, shared by the two threads under one condition.

    `sock` is None while the shim reconnects: client lines wait then, so none is lost between two
    connections and none reaches a new daemon before the session is replayed there.
    """

    def __init__(self, session: ShimSession, sock: socket.socket) -> None:
        self.session = session
        self.cond = threading.Condition()
        self.sock: socket.socket | None = sock
        self.stdin_closed = False
        self.gone = False  # the shim gives up: waiting client lines are dropped
        self.sent = 0
        self.received = 0

    def send_line(self, line: bytes) -> None:
        with self.cond:
            while self.sock is None and not self.gone:
                self.cond.wait()
            if self.sock is None:
                return
            self.session.from_client(line)
            sock = self.sock
            self.sent += len(line)
        try:  # outside the lock: a daemon slow to read must not stop its answers from being read
            sock.sendall(line)
        except OSError:
            pass  # the connection dropped: the line is in flight and gets its DAEMON_RESTARTED answer

    def close_input(self) -> None:
        with self.cond:
            self.stdin_closed = True  # before the daemon can see EOF and close: the order is the verdict
            sock = self.sock
            self.cond.notify_all()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_WR)  # tell the daemon the client is gone
            except OSError:
                pass

    def detach(self) -> tuple[Closing, str | None, list[bytes], bool]:
        """The connection ended: how, its notice, the answers for the calls it leaves unanswered (none
        after a refusal: the shim ends), and whether stdin is closed. Client lines wait from now on."""
        with self.cond:
            closing = self.session.closing()
            notice = self.session.notice_message()
            self.sock = None
            failed = self.session.dropped() if closing is not Closing.REFUSED else []
            return closing, notice, failed, self.stdin_closed

    def attach(self, sock: socket.socket) -> None:
        with self.cond:
            self.sock = sock
            stdin_closed = self.stdin_closed
            self.cond.notify_all()
        if stdin_closed:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def give_up(self) -> None:
        with self.cond:
            self.gone = True
            self.cond.notify_all()


def _pump_stdin(link: _Link) -> None:
    """Client lines to the daemon, whole lines only (a reconnect never splits one)."""
    lines = Lines()
    try:
        while data := os.read(0, CHUNK):
            for line in lines.feed(data):
                link.send_line(line)
            if len(lines.partial) > MAX_HELD_BYTES:  # no end in sight: pass it on, the daemon's line limit refuses it
                link.send_line(bytes(lines.partial))
                lines.partial.clear()
        if lines.partial:
            link.send_line(bytes(lines.partial))  # a last line without its newline goes as it is
    except OSError:
        pass
    finally:
        link.close_input()


def _write_out(data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(1, view)
        view = view[written:]


def _serve(link: _Link, sock: socket.socket) -> bool:
    """Daemon lines to stdout until the connection ends; True when at least one line came.

    Raises BrokenPipeError when the client closed stdout, ReplayFailed when the daemon refused the
    replayed session.
    """
    pending = Lines()
    any_line = False
    try:
        while data := sock.recv(CHUNK):
            link.received += len(data)
            lines = pending.feed(data)
            if not lines:
                continue
            with link.cond:
                verdicts = [link.session.from_daemon(line) for line in lines]
            out = b"".join(line for line, v in zip(lines, verdicts, strict=True) if v is Verdict.FORWARD)
            any_line = True
            if out:
                _write_out(out)
    except ConnectionResetError:
        pass
    return any_line  # a partial last line is dropped: half a message would break the client's stream


def _reconnect(path: Path, link: _Link, *, autostart: bool, deadline: float, pause: float = 0.0
               ) -> socket.socket | None:
    """A new connection, with exponential backoff until `deadline`; None when the client is gone
    meanwhile, an autostarted daemon died, or time ran out. DiagdError when the socket is not ours.

    `pause` comes first: after a connection the daemon accepted but closed without a line, a connect
    succeeds at once, so without it a daemon that keeps hanging up would be reconnected to in a loop
    that the bound never ends (the deadline is checked only between refused connects)."""
    if pause:
        if time.monotonic() + pause > deadline:
            return None
        time.sleep(pause)
    began = time.monotonic()
    delay = BACKOFF_FIRST_S
    child: subprocess.Popen[bytes] | None = None
    autostart_after = _env_seconds("DIAGD_SHIM_AUTOSTART_AFTER_S", AUTOSTART_AFTER_S)
    while True:
        sock = connect(path)
        if sock is not None:
            if child is not None:
                reap_in_background(child)
            return sock
        if link.stdin_closed:
            return None
        if autostart and child is None and time.monotonic() - began >= autostart_after:
            child = launch.start_detached()
        if child is not None and child.poll() not in (None, 0):
            return None
        if time.monotonic() + delay > deadline:
            if child is not None:
                reap_in_background(child)
            return None
        time.sleep(delay)
        delay = min(delay * 2, BACKOFF_MAX_S)


def _fail(message: str, status: int = EXIT_NO_DAEMON) -> int:
    """One line on stderr; NO_DAEMON unless said otherwise: the shim ends when no daemon serves it."""
    sys.stderr.write(f"diagd mcp: {message}\n")
    return status


def run(*, autostart: bool = True, prelude: Sequence[bytes] = ()) -> int:
    """Serve one MCP client on stdio; `prelude`: lines sent first on every connection."""
    path = paths.mcp_socket()
    try:
        sock = connect_or_start(path, autostart=autostart)
    except DiagdError as exc:
        return _fail(f"{exc.code}: {exc.message}")
    if sock is None:
        hint = "" if autostart else " (autostart disabled; run `diagd serve` or the systemd user service)"
        return _fail(f"no daemon listening on {path}{hint}; {_daemon_said(autostart)}")
    session = ShimSession(prelude=list(prelude))
    link = _Link(session, sock)
    with contextlib.suppress(OSError):  # a failed send is seen as a drop by the reader below
        sock.sendall(b"".join(session.prelude))
    threading.Thread(target=_pump_stdin, args=(link,), daemon=True, name="stdin->daemon").start()
    bound_s = _env_seconds("DIAGD_SHIM_RECONNECT_S", RECONNECT_S)
    episode: float | None = None  # when the current run of failed connections began
    pause = 0.0  # the wait before reconnecting after connections that brought no line
    while True:
        try:
            delivered = _serve(link, sock)
        except BrokenPipeError:
            return EXIT_OK  # the client closed its end of stdout: it is gone, nobody is left to tell
        except ReplayFailed as exc:
            return _fail(f"the restarted daemon refused the replayed session: {exc}", EXIT_FAILED)
        finally:
            _close(sock)
        closing, notice, failed, stdin_closed = link.detach()
        try:
            _write_out(b"".join(failed))
        except BrokenPipeError:
            return EXIT_OK
        if closing is Closing.REFUSED:
            return _fail(f"the daemon closed the connection: {notice}", _refusal_status(link))
        if stdin_closed:
            return _verdict_after_input(link)
        if delivered or episode is None:
            episode, pause = time.monotonic(), 0.0
        else:  # accepted, then closed without a word: the episode goes on, backing off like a refused connect
            pause = min(max(pause * 2, BACKOFF_FIRST_S), BACKOFF_MAX_S)
        why = _why(closing, hung_up=bool(pause))
        try:
            new = _reconnect(path, link, autostart=autostart, deadline=episode + bound_s, pause=pause)
        except DiagdError as exc:
            link.give_up()
            return _fail(f"the daemon went away ({why}) and {path} is now refused: {exc.code}: {exc.message}")
        if new is None:
            link.give_up()
            if link.stdin_closed:
                return _verdict_after_input(link)
            return _fail(f"the daemon went away ({why}) and did not come back within {bound_s:g} s"
                         + ("" if autostart else " (autostart disabled)") + f"; {_daemon_said(autostart)}")
        _replay(link, new)
        sys.stderr.write(f"diagd mcp: the daemon went away ({why}); reconnected after "
                         f"{time.monotonic() - episode:.2f} s and replayed the session\n")
        sock = new


def _why(closing: Closing, *, hung_up: bool) -> str:
    if closing is Closing.STOPPING:
        return "it is stopping"
    return "it keeps closing the connection without a word" if hung_up else "the connection dropped"


def _daemon_said(autostart: bool) -> str:
    reason = launch.last_log_line() if autostart else ""
    return f"the daemon said: {reason}" if reason else f"see {paths.state_dir()}/daemon.log"


def _replay(link: _Link, sock: socket.socket) -> None:
    """Open the session again on a new connection, then let the client's waiting lines through."""
    with link.cond:
        replay = link.session.replay()
    try:
        sock.sendall(b"".join(replay))
    except OSError:
        pass  # dropped again: the next round sees it
    link.attach(sock)


def _verdict_after_input(link: _Link) -> int:
    """The client closed stdin: 0 when each of its requests got an answer, the daemon's or a coded
    DAEMON_RESTARTED one (the session went on, as promised); NO_DAEMON when one got none."""
    with link.cond:
        unanswered = len(link.session.in_flight)  # what dropped() left: an initialize no daemon answered
    if unanswered:
        return _fail(f"the daemon went away before answering {unanswered} request(s)")
    if link.sent and not link.received:
        return _fail("the daemon closed the connection without answering")
    return EXIT_OK


def _refusal_status(link: _Link) -> int:
    """NO_DAEMON when the daemon refused the connection itself (every one busy), as `diagd status` and
    `call` say it; FAILED when it refused what the client sent (a line over its limit, say)."""
    with link.cond:
        notice = link.session.notice or {}
    return EXIT_NO_DAEMON if (notice.get("data") or {}).get("code") == ErrorCode.BUSY else EXIT_FAILED


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes the stdin thread if it is blocked sending on it
    except OSError:
        pass
    sock.close()
