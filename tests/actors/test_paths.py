"""Allowed-directory checks: symlinks resolved before the check, clear codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagd.actors._paths import replace_whole, resolve_allowed
from diagd.protocol.errors import DiagdError, ErrorCode


def code_of(raw: str, allowed: list[str]) -> ErrorCode:
    with pytest.raises(DiagdError) as info:
        resolve_allowed(raw, allowed)
    return info.value.code


def test_a_file_inside_an_allowed_dir_resolves(tmp_path: Path) -> None:
    f = tmp_path / "a.pcap"
    f.write_bytes(b"x")
    assert resolve_allowed(str(f), [str(tmp_path)]) == f.resolve()
    assert resolve_allowed(str(f), []) == f.resolve()


def test_a_symlink_pointing_outside_is_refused(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("x")
    (inside / "link").symlink_to(outside / "secret")
    assert code_of(str(inside / "link"), [str(inside)]) == ErrorCode.PERMISSION_DENIED
    assert code_of(str(inside / ".." / "out" / "secret"), [str(inside)]) == ErrorCode.PERMISSION_DENIED


def test_missing_files_and_directories_get_their_own_codes(tmp_path: Path) -> None:
    assert code_of(str(tmp_path / "nope"), []) == ErrorCode.FILE_NOT_FOUND
    assert code_of(str(tmp_path), []) == ErrorCode.INVALID_ARGUMENT
    assert code_of("", []) == ErrorCode.INVALID_ARGUMENT


def test_a_relative_path_is_the_callers_not_the_daemons(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.pcap").write_bytes(b"x")
    assert resolve_allowed("sub/a.pcap", [str(tmp_path)], cwd=str(tmp_path)) == (tmp_path / "sub" / "a.pcap")
    assert resolve_allowed("a.pcap", [], cwd=str(tmp_path / "sub")) == (tmp_path / "sub" / "a.pcap")
    with pytest.raises(DiagdError) as missing:
        resolve_allowed("nope.pcap", [], cwd=str(tmp_path))
    assert missing.value.code == ErrorCode.FILE_NOT_FOUND and missing.value.details["cwd"] == str(tmp_path)
    assert code_of("../../etc/passwd", [str(tmp_path)]) == ErrorCode.INVALID_ARGUMENT  # no cwd: refused
    (tmp_path / "outside").write_bytes(b"x")
    with pytest.raises(DiagdError) as escape:  # the allow-list applies to where a relative path leads
        resolve_allowed("../outside", [str(tmp_path / "sub")], cwd=str(tmp_path / "sub"))
    assert escape.value.code == ErrorCode.PERMISSION_DENIED


def test_a_relative_path_without_a_known_cwd_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DiagdError) as info:
        resolve_allowed("vmcore", [], what="vmcore")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert "relative" in info.value.message and info.value.details["hint"] == "pass an absolute path"


def test_diagds_own_directories_are_refused_whatever_allowed_dirs_says(tmp_path: Path) -> None:
    # allowed_dirs often covers a home directory, and with it the state dir: every client's crash
    # outputs, serial logs, bpftrace results and the audit log are there.
    state, exports = tmp_path / "state", tmp_path / "state" / "serial" / "exports"
    exports.mkdir(parents=True)
    (state / "audit.jsonl").write_text("{}")
    (exports / "s.pcapng").write_text("x")
    (tmp_path / "via-link").symlink_to(state / "audit.jsonl")
    for raw, allowed in ((state / "audit.jsonl", [str(tmp_path)]), (tmp_path / "via-link", [str(tmp_path)]),
                         (state / "audit.jsonl", []), (exports / "s.pcapng", [str(tmp_path)])):
        with pytest.raises(DiagdError) as info:
            resolve_allowed(str(raw), allowed, private_dirs=[str(state)],
                            hints={str(exports): "select serial"})
        assert info.value.code == ErrorCode.PERMISSION_DENIED, raw
        assert "diagd's own directories" in info.value.message and info.value.details["private_dir"] == str(state)
    assert info.value.details["hint"] == "select serial"
    # A shared dir inside (a group's exports, for a client that selected the group) stays readable.
    assert resolve_allowed(str(exports / "s.pcapng"), [str(tmp_path)], private_dirs=[str(state)],
                           shared_dirs=[str(exports)]) == exports / "s.pcapng"


def test_replace_whole_writes_whole_files_and_replaces_a_planted_link_never_writing_through_it(tmp_path: Path) -> None:
    target, victim = tmp_path / "kept.json", tmp_path / "victim"
    victim.write_bytes(b"untouched")
    target.symlink_to(victim)
    replace_whole(target, b"new")
    assert not target.is_symlink() and target.read_bytes() == b"new" and victim.read_bytes() == b"untouched"
    assert (target.stat().st_mode & 0o777) == 0o600 and sorted(p.name for p in tmp_path.iterdir()) == [
        "kept.json", "victim"]
