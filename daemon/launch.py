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
