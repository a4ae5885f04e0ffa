"""Allowed-directory checks: symlinks resolved before the check, clear codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagd.actors._paths import resolve_allowed
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
