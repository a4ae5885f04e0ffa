"""The client's working directory, read from /proc for relative paths in its arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from diagd.daemon.server.connections import peer_cwd


def test_the_cwd_of_a_live_process_is_read_and_resolves_to_the_same_directory(tmp_path: Path) -> None:
    assert peer_cwd(os.getpid()) == os.getcwd()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=tmp_path,
                             stdin=subprocess.PIPE)
    try:
        assert peer_cwd(child.pid) == str(tmp_path)
    finally:
        child.communicate(b"")


def test_a_gone_process_or_a_removed_directory_gives_no_cwd(tmp_path: Path) -> None:
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], cwd=doomed,
                             stdin=subprocess.PIPE)
    try:
        doomed.rmdir()  # its cwd now reads "<path> (deleted)"
        assert peer_cwd(child.pid) is None
    finally:
        child.communicate(b"")
    assert peer_cwd(child.pid) is None  # reaped
