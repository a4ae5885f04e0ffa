"""`diagd restart`: the running daemon stopped (its pid gone) and started again as `diagd start` does,
or through systemd when it is the user service's; one line and a non-zero exit when it cannot.
The clients that carry on across it: tests/e2e/test_http_sessions.py (both SDKs over HTTP) and
tests/e2e/test_shim_restart.py (stdio)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Env

pytestmark = pytest.mark.e2e


def pid_of(env: Env) -> int:
    done = env.run("status", "--json")
    assert done.returncode == 0, done.stderr
    pid: int = json.loads(done.stdout)["daemon"]["pid"]
    return pid


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def started(env: Env) -> Iterator[Env]:
    done = env.run("start", timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        yield env
    finally:
        env.run("stop", timeout=60)


def test_restart_replaces_the_running_daemon_and_returns_when_it_answers(started: Env) -> None:
    before = pid_of(started)
    done = started.run("restart", timeout=90)
    assert done.returncode == 0, done.stderr
    assert gone(before)
    after = pid_of(started)  # no wait: it answers as soon as `diagd restart` returned
    assert after != before
    assert done.stdout.splitlines() == [f"diagd stopped (pid {before})",
                                        f"diagd running: pid {after}, sockets in {started.runtime}"]


def test_restart_with_no_daemon_running_starts_one(env: Env) -> None:
    try:
        done = env.run("restart", timeout=90)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("diagd running: pid ")
        assert pid_of(env) > 0
    finally:
        env.run("stop", timeout=60)


def test_a_restart_that_cannot_start_again_says_why_in_one_line_and_exits_non_zero(started: Env) -> None:
    before = pid_of(started)
    started.write_config('[daemon]\nextra_backends = ["echo_actor"]\nidle_timeout_s = "soon"\n')
    done = started.run("restart", timeout=90)
    assert done.returncode == 3 and gone(before)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("diagd restart: the daemon did not start (") and "idle_timeout_s" in lines[0], lines
    assert started.run("status").returncode == 3  # and nothing half-started is left behind


def fake_systemctl(env: Env, main_pid: int) -> Path:
    """A `systemctl` on PATH that says the user service is active with MAINPID, and logs its calls."""
    bindir = env.root / "bin"
    bindir.mkdir()
    calls = env.root / "systemctl.calls"
    script = bindir / "systemctl"
    script.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  "--user is-active --quiet diagd") exit 0 ;;
  "--user show --property=MainPID --value diagd") echo {main_pid} ;;
  "--user restart diagd") exit 0 ;;
  *) exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env.vars["PATH"] = f"{bindir}{os.pathsep}{env.vars['PATH']}"
    return calls


def test_the_user_services_daemon_is_restarted_through_systemd(started: Env) -> None:
    pid = pid_of(started)
    calls = fake_systemctl(started, main_pid=pid)
    done = started.run("restart", timeout=90)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == ["--user is-active --quiet diagd",
                                              "--user show --property=MainPID --value diagd",
                                              "--user restart diagd"]
    # (The fake restarted nothing: `diagd restart` waited for the daemon at its socket and names it.)
    assert done.stdout.strip() == f"diagd running: pid {pid}, sockets in {started.runtime}"


def test_a_daemon_that_is_not_the_user_services_is_restarted_by_diagd_not_systemd(started: Env) -> None:
    """A service active beside it (the user's own, while this is a test's runtime dir) is left alone."""
    pid = pid_of(started)
    calls = fake_systemctl(started, main_pid=1)
    done = started.run("restart", timeout=90)
    assert done.returncode == 0, done.stderr
    assert "--user restart diagd" not in calls.read_text().splitlines()
    assert gone(pid) and pid_of(started) != pid
