"""diagd's own files are never opened through a link (actors/statefile.py), on real files: the helpers,
and the bpftrace store, whose files sit in a directory a run's id names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagd.actors import statefile
from diagd.actors.bpftrace.execution import Execution
from diagd.actors.bpftrace.store import ExecutionStore
from diagd.protocol.errors import DiagdError, ErrorCode


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("secret\n")
    return path


def refusal(call: object, *args: object) -> DiagdError:
    with pytest.raises(DiagdError) as info:
        call(*args)  # type: ignore[operator]
    assert info.value.code == ErrorCode.PERMISSION_DENIED
    return info.value


def test_files_and_directories_that_are_links_are_refused_and_their_targets_untouched(tmp_path: Path,
                                                                                      victim: Path) -> None:
    link = tmp_path / "state.json"
    link.symlink_to(victim)
    assert "symlink (to " in refusal(statefile.read_text, link).message
    refusal(statefile.append_text, link, "planted\n")
    refusal(statefile.open_file, link, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    dangling = tmp_path / "new.json"
    dangling.symlink_to(tmp_path / "would-be-created")
    refusal(statefile.append_text, dangling, "x")
    assert victim.read_text() == "secret\n" and not (tmp_path / "would-be-created").exists()
    linked_dir = tmp_path / "runs"
    linked_dir.symlink_to(tmp_path)
    assert "symlink" in refusal(statefile.ensure_dir, linked_dir).message
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in refusal(statefile.read_text, tmp_path / "fifo").message
    with pytest.raises(FileNotFoundError):
        statefile.read_text(tmp_path / "absent")


def test_regular_files_and_directories_work_as_before(tmp_path: Path) -> None:
    runs = statefile.ensure_dir(tmp_path / "a" / "b")
    assert runs.is_dir() and (runs.stat().st_mode & 0o777) == 0o700
    statefile.append_text(runs / "out.txt", "one\n")
    statefile.append_text(runs / "out.txt", "two\n")
    assert statefile.read_text(runs / "out.txt") == "one\ntwo\n"
    assert (runs / "out.txt").stat().st_mode & 0o777 == 0o600


def test_the_bpftrace_store_never_writes_or_reads_through_a_planted_link(tmp_path: Path, victim: Path) -> None:
    store = ExecutionStore(tmp_path)
    ex = Execution(id="bt-0000000b", program="BEGIN { }", output_format="text", timeout_s=3)
    run = tmp_path / ex.id
    run.mkdir()
    (run / "output.txt").symlink_to(victim)
    store.create(ex)  # logged and given up: the run goes on unpersisted
    ex.add_line("agent-controlled line")
    store.save(ex)
    assert victim.read_text() == "secret\n"
    (run / "meta.json").unlink(missing_ok=True)
    (run / "meta.json").symlink_to(victim)
    assert store.load(ex.id) is None and store.metas() == []
