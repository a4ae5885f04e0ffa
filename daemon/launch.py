"""Starting the daemon so that no directory it happens to start in is trusted (see actors/interpreter.py).

`diagd start` and the MCP shim's autostart run `python -P -m diagd.daemon.cli serve` in `/` with a
sanitised PYTHONPATH and diagd's directory variables made absolute; `diagd serve`, however it was
started (by hand, by systemd, by the above), settles first: the same path rules for itself and every
child, and `/` as its working directory for life. Relative paths in tool arguments never meant the
daemon's cwd anyway: they are resolved in the calling client's (connections.peer_cwd).
Stdlib only: the shim imports it.
"""

from __future__ import annotations

import os
import subprocess

from diagd.actors import interpreter
from diagd.daemon import paths
from diagd.protocol.errors import DiagdError

SERVE_MODULE = "diagd.daemon.cli"


def settle() -> None:
    """`diagd serve`'s first step, before trio, msgpack or a back end is imported."""
    paths.pin(os.environ)  # DIAGD_STATE_DIR=state meant the directory it was started in
    interpreter.settle()
    lead_a_session()


def lead_a_session() -> None:
    """Make the daemon a session leader unless it leads its process group already.

    A child the daemon may stop (sharkd, _subprocess.open_process(stoppable=True)) relies on the kernel
    ending it when the daemon dies: its group is then orphaned, and an orphaned group with a stopped
    member gets SIGHUP and SIGCONT. The group is orphaned only if the process that adopts it is outside
    the daemon's session; started by a harness whose PID 1 or subreaper shares the starter's session
    (CI's container, a test runner), it would not be, and the stopped child would wait forever. In a
    session of its own nothing but the daemon's descendants share it. systemd's services and `diagd
    start` (start_detached) lead one already; a shell's job leads its group, where setsid fails and the
    terminal keeps its Ctrl-C."""
    try:
        os.setsid()
    except PermissionError:
        pass


def start_detached() -> subprocess.Popen[bytes]:
    """Start `diagd serve` in its own session, logging to the state dir, stdio off the wire."""
    # Where an MCP host stripped DIAGD_CONFIG / DIAGD_STATE_DIR: the ones the user's last daemon used.
    os.environ.update(paths.recorded_daemon_env())
    state = paths.open_private_dir(paths.state_dir(), what="state directory")
    try:
        logfd = state.open("daemon.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    finally:
        state.close()
    env = interpreter.child_env(DIAGD_AUTOSTARTED="1")
    paths.pin(env)
    try:
        return subprocess.Popen(
            interpreter.module_argv(SERVE_MODULE, "serve"), cwd=interpreter.DAEMON_CWD,
            stdin=subprocess.DEVNULL, stdout=logfd, stderr=logfd, start_new_session=True, close_fds=True, env=env,
        )
    finally:
        os.close(logfd)


def last_log_line(max_bytes: int = 4096) -> str:
    """The daemon log's last line (`diagd serve` ends it with its one-line reason for exiting); never
    read through a link (the state dir checked, the file opened with O_NOFOLLOW)."""
    try:
        state = paths.open_private_dir(paths.state_dir(), what="state directory")
        try:
            fd = state.open("daemon.log", os.O_RDONLY | os.O_NONBLOCK)
        finally:
            state.close()
    except DiagdError as exc:
        return f"{exc.code}: {exc.message}" if "symlink" in exc.message else ""
    with open(fd, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
        lines = f.read().decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""
