"""Issue 20 item 8: a symlink planted among diagd's own files (a link named audit.jsonl ended the
daemon with an ExceptionGroup traceback). Each file or directory diagd opens in its state and runtime
directories is opened without following a link; a link is refused with one coded line and a clean
exit status, and nothing is created or written at the link's target.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import backends
from tests.conftest import DIAGD, Env
from tests.support.raw import INITIALIZE

pytestmark = [pytest.mark.e2e, pytest.mark.fault]


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """Where a planted link points: it must stay absent."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    yield path
    assert not path.exists(), f"diagd created or wrote {path} through a planted link"


def plant(link: Path, target: Path) -> None:
    link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    link.symlink_to(target)


def serve(env: Env) -> subprocess.CompletedProcess[str]:
    """`diagd serve`, which must refuse to start."""
    return subprocess.run([DIAGD, "serve"], env=env.vars, capture_output=True, text=True, timeout=60, check=False)


def assert_one_coded_line(done: subprocess.CompletedProcess[str], link: Path, *, status: int = 1) -> None:
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr, done.stderr
    last = [line for line in done.stderr.splitlines() if line.startswith("diagd")]
    assert len(last) == 1, done.stderr
    assert "PERMISSION_DENIED" in last[0] and str(link) in last[0] and "symlink" in last[0], last[0]


def test_a_planted_audit_log_link_stops_the_start_with_one_coded_line(env: Env, target: Path) -> None:
    plant(env.state / "audit.jsonl", target)
    assert_one_coded_line(serve(env), env.state / "audit.jsonl")


@pytest.mark.parametrize("backend", [*backends.names(), "echo_actor"])
def test_a_planted_link_as_a_back_ends_state_directory_stops_the_start_with_one_coded_line(
        env: Env, tmp_path: Path, backend: str) -> None:
    elsewhere = tmp_path / "elsewhere-dir"
    elsewhere.mkdir(mode=0o700)
    plant(env.state / backend, elsewhere)
    assert_one_coded_line(serve(env), env.state / backend)
    assert list(elsewhere.iterdir()) == []


def test_a_planted_lock_file_link_stops_the_start_with_one_coded_line(env: Env, target: Path) -> None:
    plant(env.runtime / "daemon.lock", target)
    assert_one_coded_line(serve(env), env.runtime / "daemon.lock")


def test_a_planted_daemon_log_link_ends_diagd_start_and_the_shim_with_one_coded_line(env: Env, target: Path) -> None:
    plant(env.state / "daemon.log", target)
    assert_one_coded_line(env.run("start"), env.state / "daemon.log", status=3)
    shim = env.run("mcp", input=json.dumps(INITIALIZE).encode() + b"\n")
    assert shim.stdout == ""
    assert_one_coded_line(shim, env.state / "daemon.log", status=3)  # NO_DAEMON: it could not start one, as start


def test_diagd_logs_refuses_a_planted_audit_log_link_with_one_coded_line(env: Env, target: Path) -> None:
    target.write_text('{"tool": "planted"}\n')
    plant(env.state / "audit.jsonl", target)
    done = env.run("logs")
    assert "planted" not in done.stdout
    target.unlink()  # it was created by the test, not by diagd
    assert_one_coded_line(done, env.state / "audit.jsonl")


def test_the_token_store_refuses_a_planted_link_with_one_coded_line(env: Env, target: Path) -> None:
    plant(env.state / "http_tokens.json", target)
    assert_one_coded_line(env.run("token", "list"), env.state / "http_tokens.json")
    assert_one_coded_line(env.run("token", "add", "agent"), env.state / "http_tokens.json")


def test_the_daemon_starts_once_the_link_is_gone(env: Env, target: Path) -> None:
    """The refusal leaves nothing behind that would stop the next start."""
    plant(env.state / "audit.jsonl", target)
    assert serve(env).returncode == 1
    os.unlink(env.state / "audit.jsonl")
    started = env.run("start")
    try:
        assert started.returncode == 0, started.stderr
    finally:
        env.run("stop")
