"""daemon/paths.py: which runtime dir a client picks in each environment, and what the daemon records
there for clients whose environment lost DIAGD_CONFIG / DIAGD_STATE_DIR. (A real stripped launcher
against a real daemon: tests/e2e/test_one_daemon.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diagd.daemon import paths


@pytest.fixture
def run_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /run/user, and an environment with none of the variables set."""
    base = tmp_path / "run-user"
    base.mkdir()
    monkeypatch.setattr(paths, "RUN_USER", base)
    for name in ("DIAGD_RUNTIME_DIR", "XDG_RUNTIME_DIR", "DIAGD_CONFIG", "DIAGD_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return base


def session_dir(base: Path, mode: int = 0o700) -> Path:
    mine = base / str(os.getuid())
    mine.mkdir(mode=mode)
    mine.chmod(mode)
    return mine


def test_xdg_runtime_dir_first(run_user: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session_dir(run_user)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert paths.runtime_dir() == tmp_path / "diagd"


def test_without_xdg_the_users_run_user_dir(run_user: Path) -> None:
    mine = session_dir(run_user)
    assert paths.runtime_dir() == mine / "diagd"


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_run_user_dir_that_is_not_private_is_not_taken(run_user: Path, mode: int) -> None:
    session_dir(run_user, mode)
    assert paths.runtime_dir() == Path(f"/tmp/diagd-{os.getuid()}")


def test_a_symlink_or_someone_elses_dir_is_not_taken(run_user: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (run_user / str(os.getuid())).symlink_to(target)
    assert paths.runtime_dir() == Path(f"/tmp/diagd-{os.getuid()}")
    if os.geteuid() == 0:
        (run_user / str(os.getuid())).unlink()
        os.chown(session_dir(run_user), 12345, 12345)
        assert paths.runtime_dir() == Path(f"/tmp/diagd-{os.getuid()}")


def test_no_run_user_dir_falls_back_to_tmp(run_user: Path) -> None:
    assert paths.runtime_dir() == Path(f"/tmp/diagd-{os.getuid()}")


def test_the_daemons_record_fills_only_what_the_environment_lacks(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "rt"
    monkeypatch.setenv("DIAGD_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("DIAGD_CONFIG", raising=False)
    monkeypatch.delenv("DIAGD_STATE_DIR", raising=False)
    assert paths.recorded_daemon_env() == {}  # nothing recorded yet
    rundir = paths.open_private_dir(runtime)
    try:
        paths.record_daemon_paths(rundir, tmp_path / "c.toml", tmp_path / "state")
    finally:
        rundir.close()
    record = runtime / paths.DAEMON_RECORD
    assert record.stat().st_mode & 0o777 == 0o600
    assert json.loads(record.read_text()) == {"config": str(tmp_path / "c.toml"), "state_dir": str(tmp_path / "state")}
    assert paths.recorded_daemon_env() == {"DIAGD_CONFIG": str(tmp_path / "c.toml"),
                                           "DIAGD_STATE_DIR": str(tmp_path / "state")}
    monkeypatch.setenv("DIAGD_CONFIG", "/mine.toml")  # what the environment says wins
    assert paths.recorded_daemon_env() == {"DIAGD_STATE_DIR": str(tmp_path / "state")}


def test_a_record_that_is_a_symlink_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"config": "/evil.toml"}))
    (runtime / paths.DAEMON_RECORD).symlink_to(planted)
    monkeypatch.setenv("DIAGD_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("DIAGD_CONFIG", raising=False)
    assert paths.recorded_daemon_env() == {}
