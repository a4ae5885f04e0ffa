"""Outputs on disk: streamed with a head and a cap, indexed by line, read back a page at a time, and
never read or written through a link that drgn code could plant in its session directory."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from diagd.actors.crash.output import (
    INDEX_STRIDE,
    MAX_LINE_BYTES,
    OutputWriter,
    StoredLines,
    head_lines,
    read_lines,
    scan,
)
from diagd.actors.crash.store import OutputStore
from diagd.protocol.errors import DiagdError, ErrorCode


def written(path: Path, chunks: list[bytes], limit: int = 1 << 40, head_bytes: int = 64) -> OutputWriter:
    writer = OutputWriter(path, limit, head_bytes=head_bytes)
    for chunk in chunks:
        writer.write(chunk)
    writer.close()
    return writer


def test_the_writer_keeps_a_head_counts_lines_and_cuts_at_the_limit(tmp_path: Path) -> None:
    whole = written(tmp_path / "a.out", [b"one\ntwo\nthr", b"ee\n"])
    assert (whole.size, whole.lines, whole.truncated) == (14, 3, False)
    assert whole.head_lines(10) == ["one", "two", "three"]
    cut = written(tmp_path / "b.out", [b"x" * 50 + b"\n", b"y" * 100 + b"\n"], limit=80)
    assert cut.truncated and cut.size == 80 and (tmp_path / "b.out").read_bytes() == b"x" * 50 + b"\n" + b"y" * 29
    assert cut.lines == 2 and cut.head_lines(10) == ["x" * 50]  # the cut last line is past the head


def test_head_lines_drop_a_partial_last_line_but_show_a_giant_first_one() -> None:
    assert head_lines("a\nb\n", complete=True) == ["a", "b"]
    assert head_lines("a\nb", complete=True) == ["a", "b"]
    assert head_lines("a\nbb", complete=False) == ["a"]
    assert head_lines("aaaa", complete=False) == ["aaaa"]
    assert head_lines("", complete=True) == []


def test_the_index_pages_any_line_exactly_like_splitting_the_whole_file(tmp_path: Path) -> None:
    rng = random.Random(7)
    count = 5 * INDEX_STRIDE + 17
    lines = ["".join(rng.choice("ab\r\x0c é") for _ in range(rng.randrange(0, 40))) for _ in range(count)]
    path = tmp_path / "c.out"
    written(path, [("\n".join(lines) + "\n").encode()])
    index = scan(path)
    assert index.total == len(lines) and len(index.offsets) == 6
    for start in (0, 1, INDEX_STRIDE - 1, INDEX_STRIDE, 3 * INDEX_STRIDE + 5, len(lines) - 3, len(lines)):
        assert read_lines(path, index, start, start + 7) == lines[start:start + 7]
    stored = StoredLines(path, index)
    assert len(stored) == len(lines) and list(stored) == lines
    assert stored[-1] == lines[-1] and stored[-5:] == lines[-5:] and stored[10:2] == []


def test_a_last_line_without_newline_counts_and_an_empty_file_has_none(tmp_path: Path) -> None:
    path = tmp_path / "d.out"
    written(path, [b"a\nb"])
    assert scan(path).total == 2 and read_lines(path, scan(path), 1, 5) == ["b"]
    written(path, [])
    assert scan(path).total == 0 and read_lines(path, scan(path), 0, 5) == []


def test_an_overlong_line_is_cut_when_read_back_and_the_next_line_is_intact(tmp_path: Path) -> None:
    path = tmp_path / "e.out"
    written(path, [b"z" * (MAX_LINE_BYTES * 3) + b"\nnext\n"])
    first, second = read_lines(path, scan(path), 0, 2)
    assert first.startswith("z" * 100) and first.endswith("[... line cut]") and len(first) < MAX_LINE_BYTES + 100
    assert second == "next"


def test_a_planted_symlink_or_hard_link_is_never_read_and_never_written_through(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "crash")
    sid = "abcd1234-000001"
    workdir = store.create_session(sid, {})
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash\n")
    store.write(sid, 1, "fine\n", {"engine": "drgn", "command": "x"})
    # drgn code may write its session dir: a symlinked or hard-linked output must not leak a file.
    (workdir / "cmd-000001.out").unlink()
    (workdir / "cmd-000001.out").symlink_to(secret)
    with pytest.raises(DiagdError) as err:
        store.page(f"{sid}:1", 0, 10)
    assert err.value.code == ErrorCode.NOT_FOUND
    (workdir / "cmd-000001.out").unlink()
    os.link(secret, workdir / "cmd-000001.out")
    with pytest.raises(DiagdError):
        store.page(f"{sid}:1", 0, 10)
    # ... and writing the next output (or its metadata) replaces a planted link instead of following it.
    (workdir / "cmd-000002.out").symlink_to(secret)
    (workdir / "cmd-000002.json.tmp").symlink_to(secret)
    store.write(sid, 2, "new\n", {"engine": "crash", "command": "y"})
    assert secret.read_text() == "root:$6$hash\n"
    assert store.page(f"{sid}:2", 0, 10)["output"] == "new"


def test_an_output_the_worker_wrote_is_counted_from_the_file(tmp_path: Path) -> None:
    store = OutputStore(tmp_path / "crash")
    sid = "abcd1234-000002"
    store.create_session(sid, {})
    written(store.output_path(sid, 4), [b"".join(b"row %d\n" % i for i in range(3000))])
    meta = store.finish(sid, 4, {"engine": "drgn", "command": "print(rows)"})
    assert meta["total_lines"] == 3000 and meta["bytes"] == store.output_path(sid, 4).stat().st_size
    page = store.page(f"{sid}:4", 2998, 10)
    assert page["output"] == "row 2998\nrow 2999" and not page["has_more"]
    missing = store.finish(sid, 5, {"engine": "drgn", "command": "os._exit(1)"})  # the worker died first
    assert missing["total_lines"] == 0 and store.page(f"{sid}:5", 0, 10)["output"] == ""
