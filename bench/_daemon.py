"""An isolated `diagd serve` for the benchmarks, shared by every bench/*.py.

    with isolated_daemon("pcap", config=toml_text, extra_env={"DIAGD_LOG_LEVEL": "info"}) as daemon:
        ...  # daemon.env for child processes, daemon.mcp_socket, daemon.tmp for scratch files

The daemon gets fresh directories of its own (DIAGD_RUNTIME_DIR, DIAGD_STATE_DIR, DIAGD_CONFIG), so a
bench can run next to a real daemon. The block starts once both sockets exist; on the way out the
daemon gets SIGTERM (then SIGKILL after a bounded wait) and the directories are removed, also on
failure, when the tail of the daemon's log is written to stderr first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

DIAGD = str(Path(sys.executable).parent / "diagd")
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 4000


@dataclass
class BenchDaemon:
    env: dict[str, str]  # os.environ plus the DIAGD_* variables: give it to every child process
    tmp: Path  # state dir, config and log live here; scratch space for the bench
    runtime: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def mcp_socket(self) -> Path:
        return self.runtime / "mcp.sock"

    @property
    def control_socket(self) -> Path:
        return self.runtime / "control.sock"


def _wait_for_sockets(daemon: BenchDaemon, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (daemon.mcp_socket.exists() and daemon.control_socket.exists()):
        if daemon.proc.poll() is not None:
            raise RuntimeError(f"diagd serve exited with {daemon.proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"diagd serve did not create its sockets in {timeout_s} s")
        time.sleep(0.01)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def isolated_daemon(name: str, config: str | None = None, extra_env: dict[str, str] | None = None,
                    start_timeout_s: float = 30) -> Iterator[BenchDaemon]:
    """A running `diagd serve` in fresh directories; config is the TOML text of its config file
    (None: no file, the defaults), extra_env is added to its environment."""
    # A short runtime path: AF_UNIX socket paths are limited to ~108 bytes.
    runtime = Path(f"/tmp/diagd-bench-{name}-{os.getpid()}")
    shutil.rmtree(runtime, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"diagd-bench-{name}-state-"))
    log = tmp / "daemon.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        if config is not None:
            (tmp / "config.toml").write_text(config)
        env = {**os.environ, "DIAGD_RUNTIME_DIR": str(runtime), "DIAGD_STATE_DIR": str(tmp / "state"),
               "DIAGD_CONFIG": str(tmp / "config.toml"), **(extra_env or {})}
        env.pop("NOTIFY_SOCKET", None)  # not ours to tell a service manager we are ready
        with open(log, "wb") as log_file:
            proc = subprocess.Popen([DIAGD, "serve"], env=env, stdin=subprocess.DEVNULL, stdout=log_file,
                                    stderr=log_file, start_new_session=True)
        daemon = BenchDaemon(env=env, tmp=tmp, runtime=runtime, proc=proc, log=log)
        _wait_for_sockets(daemon, start_timeout_s)
        yield daemon
    except BaseException:
        text = log.read_text(errors="replace") if log.exists() else ""
        if text.strip():
            sys.stderr.write(f"--- daemon log ({log}) ---\n{text[-LOG_TAIL_CHARS:]}\n")
        raise
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
