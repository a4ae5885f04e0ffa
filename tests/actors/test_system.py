"""actors/system.py: the probes back ends and `diagd doctor` share."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from diagd.actors import system


def test_rss_of_this_process_and_of_a_child_and_none_once_it_is_gone() -> None:
    assert (system.rss_bytes() or 0) > 1 << 20
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert (system.rss_bytes(child.pid) or 0) > 0
    finally:
        child.kill()
        child.wait()
    assert system.rss_bytes(child.pid) is None


def test_a_missing_tool_is_a_failed_check_with_an_apt_fix() -> None:
    check = system.check_tool("no-such-tool-diagd", ["no-such-tool-diagd", "-v"], "nothing")
    assert not check.ok and "apt-get install -y nothing" in check.fix
    assert system.tool_version(["no-such-tool-diagd"]) is None


def test_a_tracefs_only_root_may_read_is_found_from_the_mount_table_not_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian mounts tracefs 0700 root: for any other user `exists()` raises PermissionError (doctor's
    traceback, every non-root user); the mount table, readable by anyone, still says where it is."""
    def refused(self: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refused)
    monkeypatch.setattr(system, "_tracefs_mounts", lambda: [Path("/sys/kernel/tracing")])
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert system.tracefs_dir() == Path("/sys/kernel/tracing")
    check = system.check_tracefs()
    assert check.ok and "readable by root only" in check.detail
    monkeypatch.setattr(system, "_tracefs_mounts", lambda: [])
    assert system.tracefs_dir() is None and not system.check_tracefs().ok
