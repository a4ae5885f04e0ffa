"""actors/system.py: the probes back ends and `diagd doctor` share."""

from __future__ import annotations

import subprocess

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
