"""Answers from an index still being built (actors/pcap/index/partial.py) and the writer that closes its
files as it goes (actors/pcap/index/sink.py), at their edges: a read whose files go away under it (a
failing build removes its folder) is left to the loaded capture, never an internal error; a chunked
build vouches for a chunk's rows only once its frame count is checked; a failing build's own error is
the one said. The answers themselves, through the daemon against tshark: tests/e2e/test_pcap_index_partial.py.
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
import pytest

from diagd.actors.pcap.index import partial, tables
from diagd.actors.pcap.index.schema import COLUMNS
from diagd.actors.pcap.index.sink import Sink
from diagd.actors.pcap.messages import Frames
from diagd.protocol.errors import DiagdError
from tests.pcaps import PCAPS
from tests.support import pcap_oracle as oracle
from tests.support.index_builds import build

CAPTURE = PCAPS / "magma_gx_gy_combined_04.pcapng"  # 4,070 frames
SEGMENT = 500


@pytest.fixture
def built(tmp_path: Path) -> Path:
    if shutil.which("tshark") is None or not CAPTURE.exists():
        pytest.skip("tshark or the capture is missing")
    build(CAPTURE, tmp_path / "index", 0, segment_frames=SEGMENT)
    return tmp_path / "index"


def test_pages_of_the_frames_indexed_so_far_and_past_them(built: Path) -> None:
    files = tables.frame_files(built)
    assert [int(f.name.split(".")[0]) for f in files] == list(range(1, 4071, SEGMENT))
    building = partial.Building(built, 2 * SEGMENT, chunked=False)  # as if two files were closed so far
    page = partial.frames(building, Frames("", 10, 2 * SEGMENT - 10, None))
    assert [f["number"] for f in page["frames"]] == list(range(991, 1001)) and page["total_at_least"] == 1000
    wanted = [n for n in oracle.matching(CAPTURE, "diameter") if n <= 2 * SEGMENT]
    page = partial.frames(building, Frames("diameter", 3, len(wanted) - 3, None))
    assert [f["number"] for f in page["frames"]] == wanted[-3:] and page["total"] == len(wanted)
    for past in (Frames("", 10, 2 * SEGMENT - 9, None), Frames("diameter", 3, len(wanted) - 2, None),
                 Frames("diameter.cmd.code == 272", 3, 0, None)):  # a filter the index does not translate
        with pytest.raises(DiagdError) as refused:
            partial.frames(building, past)
        assert refused.value.details.get("index_unanswered") is True, past


def test_a_read_whose_files_go_away_under_it_is_left_to_the_loaded_capture(built: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review: the matches were read from every file, then a failing build removed one before
    the page was read from it (a KeyError escaped as an internal error)."""
    building = partial.Building(built, 4070, chunked=False)
    real = partial.query.listed_page

    def after_a_file_went(*args: object) -> object:
        tables.frame_files(built)[1].unlink()
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(partial.query, "listed_page", after_a_file_went)
    wanted = oracle.matching(CAPTURE, "diameter")
    with pytest.raises(DiagdError) as refused:
        partial.frames(building, Frames("diameter", 5, wanted.index(next(n for n in wanted if n > SEGMENT)), None))
    assert refused.value.details.get("index_unanswered") is True


def sink_lines(sink: Sink, *batches: int) -> list[dict[str, object]]:
    said = io.StringIO()
    with redirect_stdout(said):
        first = 1
        for rows in batches:
            numbers = list(range(first, first + rows))
            sink.write(pa.record_batch([pa.array(numbers if c.name == "number" else [None] * rows, sink.types[c.name])
                                        for c in COLUMNS], schema=sink.schema), [])
            first += rows
    return [json.loads(line) for line in said.getvalue().splitlines()]


def test_a_chunk_s_rows_are_vouched_for_only_once_its_frame_count_is_checked(tmp_path: Path) -> None:
    with Sink(tmp_path, [(c.name, c.kind, c.many) for c in COLUMNS], tables, 100) as sink:
        sink.chunked = True
        said = sink_lines(sink, 250)
        assert said[-1]["indexed"] == 0 and sink.indexed == 200  # two files closed, not vouched for
        sink.vouched = sink.frames  # build.py, once the chunk's count is checked
        with redirect_stdout(io.StringIO()) as out:
            sink.say_progress()
        assert json.loads(out.getvalue())["indexed"] == 200
    assert [f.name for f in tables.frame_files(tmp_path)] == [f"{n:012d}.parquet" for n in (1, 101, 201)]


def test_a_failing_build_says_its_own_error(tmp_path: Path) -> None:
    class Full(OSError):
        pass

    with pytest.raises(Full), Sink(tmp_path, [(c.name, c.kind, c.many) for c in COLUMNS], tables, 100) as sink:
        sink._writing().unlink()  # as if its next file could not be begun (ENOSPC)
        raise Full(28, "No space left on device")
