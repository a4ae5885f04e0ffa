"""The runtime and state directories: planted symlinks, foreign owners and open modes are refused,
nothing is created or chmod-ed through them, and files inside never follow a symlink."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from diagd.daemon import paths
from diagd.protocol.errors import DiagdError, ErrorCode

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")


def refusal(path: Path) -> DiagdError:
    with pytest.raises(DiagdError) as info:
        paths.open_private_dir(path, what="runtime directory")
    assert info.value.code == ErrorCode.PERMISSION_DENIED
    assert str(path) in info.value.message and "\n" not in info.value.message
    return info.value


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_missing_dir_is_created_0700_and_files_inside_are_0600(tmp_path: Path) -> None:
    rundir = paths.open_private_dir(tmp_path / "run", what="runtime directory")
    try:
        assert mode(tmp_path / "run") == 0o700
        fd = rundir.open("daemon.lock", os.O_RDWR | os.O_CREAT)
        os.close(fd)
        assert mode(tmp_path / "run" / "daemon.lock") == 0o600
    finally:
        rundir.close()


def test_a_symlink_to_another_dir_is_refused_and_the_target_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "attacker"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    link = tmp_path / "diagd-0"
    link.symlink_to(target)
    error = refusal(link)
    assert "symlink" in error.message and str(target) in error.message
    assert mode(target) == 0o755, "the daemon chmod-ed a directory it does not own"
    assert list(target.iterdir()) == []


def test_a_dangling_symlink_is_refused_and_nothing_is_created_at_its_target(tmp_path: Path) -> None:
    link = tmp_path / "diagd-0"
    link.symlink_to(tmp_path / "not-yet")
    assert "symlink" in refusal(link).message
    assert not (tmp_path / "not-yet").exists()


@needs_root
def test_a_dir_owned_by_another_uid_is_refused_and_not_chmodded(tmp_path: Path) -> None:
    planted = tmp_path / "diagd-0"
    planted.mkdir(mode=0o700)
    os.chown(planted, NOBODY, NOBODY)
    error = refusal(planted)
    assert f"owned by uid {NOBODY}" in error.message
    assert os.stat(planted).st_uid == NOBODY and mode(planted) == 0o700


@pytest.mark.parametrize("bad_mode", [0o777, 0o770, 0o1777, 0o722])
def test_a_dir_writable_by_group_or_others_is_refused_not_repaired(tmp_path: Path, bad_mode: int) -> None:
    loose = tmp_path / "diagd-0"
    loose.mkdir()
    os.chmod(loose, bad_mode)
    assert "writable by" in refusal(loose).message
    assert mode(loose) == bad_mode


def test_an_own_dir_that_is_only_readable_by_others_is_tightened(tmp_path: Path) -> None:
    readable = tmp_path / "diagd-0"
    readable.mkdir()
    os.chmod(readable, 0o755)
    paths.open_private_dir(readable).close()
    assert mode(readable) == 0o700


def test_a_regular_file_in_place_of_the_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "diagd-0").write_text("x")
    assert "not a directory" in refusal(tmp_path / "diagd-0").message


def test_an_ancestor_writable_by_others_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    error = refusal(shared / "diagd")
    assert "ancestor" in error.message and str(shared) in error.message
    assert not (shared / "diagd").exists()


def test_a_sticky_world_writable_parent_like_tmp_is_fine(tmp_path: Path) -> None:
    tmp_like = tmp_path / "tmp"
    tmp_like.mkdir()
    os.chmod(tmp_like, 0o1777)
    paths.open_private_dir(tmp_like / "diagd-0").close()
    assert mode(tmp_like / "diagd-0") == 0o700


def test_a_symlinked_lock_file_inside_is_refused(tmp_path: Path) -> None:
    rundir = paths.open_private_dir(tmp_path / "run")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "run" / "daemon.lock").symlink_to(victim)
    try:
        with pytest.raises(DiagdError) as info:
            rundir.open("daemon.lock", os.O_RDWR | os.O_CREAT)
        assert info.value.code == ErrorCode.PERMISSION_DENIED and "symlink" in info.value.message
        assert victim.read_text() == "keep"
    finally:
        rundir.close()


def test_sockets_bind_through_the_dir_fd_even_after_the_path_is_swapped(tmp_path: Path) -> None:
    import socket

    rundir = paths.open_private_dir(tmp_path / "run")
    try:
        os.rename(tmp_path / "run", tmp_path / "moved")  # what an attacker would do to a checked path
        (tmp_path / "run").symlink_to(tmp_path / "elsewhere")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(rundir.socket_address("mcp.sock"))
        sock.close()
        assert stat.S_ISSOCK(os.lstat(tmp_path / "moved" / "mcp.sock").st_mode)
        assert not (tmp_path / "elsewhere").exists()
    finally:
        rundir.close()


def test_private_dir_problem_reports_without_creating_anything(tmp_path: Path) -> None:
    assert paths.private_dir_problem(tmp_path / "absent") is None
    assert not (tmp_path / "absent").exists()
    (tmp_path / "link").symlink_to(tmp_path)
    assert "symlink" in (paths.private_dir_problem(tmp_path / "link") or "")
