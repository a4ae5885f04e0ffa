"""What a session records for a reopen, and how a reopen tells the recorded files from others."""

from __future__ import annotations

from pathlib import Path

from diagd.actors.crash import identity as ident
from diagd.actors.crash.target import Target, changes


def target(key: str = "k1", vmcore_id: tuple[int, int, int, int] = (1, 10, 100, 1000)) -> Target:
    dump = ident.DumpInfo("/d/vmcore", "kdump", {"OSRELEASE": "6.1"}, "f" * 64)
    vml = ident.VmlinuxInfo("/d/vmlinux", "ab" * 20, "Linux version 6.1 x", True)
    return Target(Path("/d/vmcore"), Path("/d/vmlinux"), [], "/usr/bin/crash", dump, vml, vmcore_id,
                  (1, 11, 200, 2000), ["release 6.1 matches"], key)


def test_the_same_files_have_no_changes_even_moved_to_another_inode_or_device() -> None:
    meta = {"key": "k1", "files": target().files()}
    assert meta["files"]["vmcore"] == {"dev": 1, "ino": 10, "size": 100, "mtime_ns": 1000}
    assert changes(meta, target(vmcore_id=(2, 99, 100, 1000))) == []


def test_a_rewritten_file_or_another_dump_is_named() -> None:
    meta = {"key": "k1", "files": target().files()}
    assert changes(meta, target(vmcore_id=(1, 10, 100, 5000))) == [
        "vmcore was rewritten since the session was opened (mtime_ns 1000 -> 5000)"]
    (other,) = changes(meta, target(key="k2"))
    assert "another dump or kernel image" in other


def test_a_record_without_file_identities_is_never_taken_for_the_same_files() -> None:
    assert len(changes({"key": "k1"}, target())) == 2
