"""Real daemons against a planted runtime or state directory: they refuse to start with one line
naming the path and the problem, and touch nothing; clients refuse a socket another uid serves."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Env
from tests.support.raw import INITIALIZE

pytestmark = pytest.mark.e2e
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")


@pytest.fixture(autouse=True)
def remove_planted_links(env: Env) -> Iterator[None]:
    yield
    if env.runtime.is_symlink():  # the env fixture's rmtree leaves symlinks in place
        env.runtime.unlink()


def assert_refused_to_serve(env: Env, *words: str) -> str:
    out = env.run("serve", timeout=30)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("diagd: PERMISSION_DENIED: refusing ")
    assert "Traceback" not in out.stderr
    for word in words:
        assert word in last
    return last


def test_serve_refuses_a_runtime_dir_planted_as_a_symlink_and_leaves_its_target_alone(env: Env) -> None:
    target = env.root / "attacker-dir"
    target.mkdir()
    os.chmod(target, 0o777)
    env.runtime.symlink_to(target)
    assert_refused_to_serve(env, "runtime directory", str(env.runtime), "symlink", str(target))
    assert list(target.iterdir()) == [], "lock or sockets created through the symlink"
    assert stat.S_IMODE(target.stat().st_mode) == 0o777, "the target was chmod-ed"


@needs_root
def test_serve_refuses_a_runtime_dir_owned_by_another_uid(env: Env) -> None:
    env.runtime.mkdir(mode=0o700)
    os.chown(env.runtime, NOBODY, NOBODY)
    assert_refused_to_serve(env, str(env.runtime), f"owned by uid {NOBODY}")
    assert list(env.runtime.iterdir()) == []


def test_serve_refuses_a_world_writable_runtime_dir_of_its_own(env: Env) -> None:
    env.runtime.mkdir()
    os.chmod(env.runtime, 0o777)
    assert_refused_to_serve(env, "writable by group and others")
    assert stat.S_IMODE(env.runtime.stat().st_mode) == 0o777 and list(env.runtime.iterdir()) == []


def test_serve_refuses_a_symlinked_state_dir(env: Env) -> None:
    target = env.root / "elsewhere"
    target.mkdir()
    env.state.symlink_to(target)
    assert_refused_to_serve(env, "state directory", "symlink")
    assert list(target.iterdir()) == []


def test_the_shim_reports_why_an_autostarted_daemon_refused_its_runtime_dir(env: Env) -> None:
    target = env.root / "attacker-dir"
    target.mkdir()
    env.runtime.symlink_to(target)
    out = env.run("mcp", input=json.dumps(INITIALIZE).encode() + b"\n", timeout=60)
    assert out.returncode == 3 and out.stdout == ""  # NO_DAEMON, as `diagd start` says it
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing runtime directory" in lines[0] and "symlink" in lines[0]


@needs_root
def test_clients_refuse_a_socket_served_by_another_uid(env: Env) -> None:
    """The attack behind a planted dir: another user listens where our daemon would, hoping our
    shim and CLI talk to it. SO_PEERCRED tells them it is not ours."""
    env.runtime.mkdir(mode=0o700)
    os.chown(env.runtime, NOBODY, NOBODY)
    stop_r, stop_w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user: listen on both socket names until told to stop
        try:
            os.close(stop_w)  # or the read below never sees EOF
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            listeners = []
            for name in ("mcp.sock", "control.sock"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.bind(str(env.runtime / name))
                os.chmod(env.runtime / name, 0o666)
                s.listen(8)
                listeners.append(s)
            os.chmod(env.runtime, 0o755)
            os.write(ready_w, b"r")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    try:
        assert os.read(ready_r, 1) == b"r"
        status = env.run("status")
        assert status.returncode == 3 and "Traceback" not in status.stderr
        assert f"served by uid {NOBODY}" in status.stderr and len(status.stderr.strip().splitlines()) == 1
        shim = env.run("mcp", "--no-autostart", input=json.dumps(INITIALIZE).encode() + b"\n")
        assert shim.returncode == 3 and shim.stdout == ""  # NO_DAEMON, as `status` says it
        assert f"served by uid {NOBODY}" in shim.stderr
    finally:
        os.close(stop_w)
        os.close(ready_r)
        os.waitpid(pid, 0)
        shutil.rmtree(env.runtime, ignore_errors=True)


def test_status_and_logs_stay_one_line_when_the_state_dir_is_not_ours(env: Env, tmp_path: Path) -> None:
    target = tmp_path / "fake-state"
    target.mkdir()
    (target / "audit.jsonl").write_text('{"not": "a record"}\n')
    env.state.symlink_to(target)
    logs = env.run("logs")
    assert logs.returncode == 1 and "Traceback" not in logs.stderr
    assert "refusing state directory" in logs.stderr and "symlink" in logs.stderr
