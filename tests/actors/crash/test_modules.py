"""load_module_debuginfo's file discovery: links never followed, names crash cannot read left out,
bounded walks and module counts, and everything left out said."""

from __future__ import annotations

import os
from pathlib import Path

from diagd.actors.crash import modules


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


def test_regular_module_files_are_found_sorted_and_nothing_else(tmp_path: Path) -> None:
    b, a = touch(tmp_path / "kernel" / "b.ko"), touch(tmp_path / "a.ko.xz")
    touch(tmp_path / "README")
    found = modules.find(tmp_path)
    assert found.files == [str(a), str(b)] and found.skipped == {}


def test_a_module_link_pointing_outside_is_never_followed(tmp_path: Path) -> None:
    outside = touch(tmp_path / "outside" / "secret.ko")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "evil.ko").symlink_to(outside)
    (allowed / "sub").symlink_to(outside.parent, target_is_directory=True)
    found = modules.find(allowed)
    assert found.files == []
    assert found.notes() == ["1 left out: symbolic links (they may point outside the allowed directories)"]


def test_names_crash_cannot_read_as_one_word_are_left_out_and_said(tmp_path: Path) -> None:
    touch(tmp_path / "my mod.ko")
    touch(tmp_path / "x|id.ko")
    good = touch(tmp_path / "good.ko")
    found = modules.find(tmp_path)
    assert found.files == [str(good)]
    assert found.skipped == {"names with blanks or shell characters (crash reads its command line itself)": 2}


def test_module_count_and_walk_are_bounded(tmp_path: Path) -> None:
    for i in range(7):
        touch(tmp_path / f"m{i}.ko")
    capped = modules.find(tmp_path, max_files=5)
    assert len(capped.files) == 5 and capped.notes() == ["2 left out: more than 5 modules"]
    for i in range(30):
        touch(tmp_path / "noise" / f"f{i}")
    walked = modules.find(tmp_path, max_entries=10)
    assert walked.entries_seen == 11 and "the walk stopped after 10 entries" in walked.skipped


def test_a_fifo_named_like_a_module_is_not_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.ko")
    assert modules.find(tmp_path).skipped == {"not regular files": 1}
