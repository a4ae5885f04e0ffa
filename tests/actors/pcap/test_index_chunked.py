"""A chunked build (index/stitch.py: one tshark pass per run of records, stitched) against one pass over
the whole file, on every corpus capture split into chunks of a few frames (far smaller than any real
chunk, so that every kind of seam occurs): every frame that is not a seam frame has exactly the row
tshark gives it reading the whole file (its packet-list columns, stream numbers and offsets, checked
against `tshark -T fields` itself, and every column against the one-pass index), the same layer rows,
and the seam frames are named with why."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import pytest

from diagd.actors.pcap.index import filters, query, stitch
from diagd.actors.pcap.index.schema import COLUMNS
from diagd.actors.pcap.index.tables import LAYERS_FILE, frame_files, frames_table
from diagd.actors.pcap.shark import recordwalk
from tests.pcaps import corpus
from tests.support import pcap_oracle as oracle
from tests.support.index_builds import build

pytestmark = [
    pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark (Wireshark) is not installed"),
    pytest.mark.skipif(not recordwalk.available(), reason="diagd was installed without its C record walker"),
]

CHUNKS = 6  # each corpus capture in about this many chunks
# Checked against tshark's own text: (index column, tshark field).
TEXT = (("number", "frame.number"), ("info", "_ws.col.Info"), ("protocol", "_ws.col.Protocol"),
        ("protocols", "frame.protocols"), ("tcp_stream", "tcp.stream"), ("udp_stream", "udp.stream"),
        ("file_off", "frame.file_off"), ("src", "_ws.col.Source"), ("dst", "_ws.col.Destination"))


def tshark_text(capture: Path) -> list[dict[str, str]]:
    """tshark's own text of these fields, two-pass over the whole file, with this process's environment
    (as the builds here run it); kept on disk by the capture, argv and that environment (pcap_oracle)."""
    fields = [field for _, field in TEXT]
    argv = ["tshark", "-r", str(capture), "-n", "-2", "-o", "frame.show_file_off:TRUE", "-T", "fields", "-E",
            "occurrence=a", "-E", "aggregator=,", *[arg for field in fields for arg in ("-e", field)]]
    out = oracle.cached_text(capture, [*argv, oracle.config_key()],
                             lambda: subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    return [dict(zip(fields, line.split("\t"), strict=True)) for line in out.splitlines()]


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(x) for x in value)
    return str(value)


def rows(folder: Path, name: str) -> list[dict[str, Any]]:
    return duckdb.sql(f"SELECT * FROM read_parquet('{folder / name}')").to_arrow_table().to_pylist()


def frame_rows(folder: Path) -> list[dict[str, Any]]:
    """The frames table's rows as stored: its files in their order (the order DuckDB reads a list in)."""
    return duckdb.sql(f"SELECT * FROM {frames_table(frame_files(folder))}").to_arrow_table().to_pylist()


@pytest.mark.parametrize("capture", corpus(), ids=lambda p: p.name)
def test_every_frame_but_the_seams_is_what_one_pass_over_the_whole_file_gives(capture: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    chunk_bytes = capture.stat().st_size // CHUNKS + 1
    whole = build(capture, tmp_path / "whole", 0)
    chunked = build(capture, tmp_path / "chunked", chunk_bytes)
    assert whole["chunks"] is None and chunked["chunks"] is not None and len(chunked["chunks"]) > 1
    assert chunked["chunks"][0][0] == 1
    assert sum(count for _, count in chunked["chunks"]) == whole["frames"] == chunked["frames"]
    seams = {row["number"]: row["why"] for row in rows(tmp_path / "chunked", stitch.SEAMS_FILE)}
    assert chunked["seam_frames"] == len(seams)
    assert set(seams.values()) <= {"tcp", "udp", "sctp", "icmp", "fragment", "arp", "doubted", "numbering"}

    one_pass = frame_rows(tmp_path / "whole")
    stitched = frame_rows(tmp_path / "chunked")
    assert [row["number"] for row in stitched] == list(range(1, whole["frames"] + 1))
    said = tshark_text(capture)
    names = [col.name for col in COLUMNS]
    for expected, got, text in zip(one_pass, stitched, said, strict=True):
        if got["number"] in seams:
            continue
        assert {n: got[n] for n in names} == {n: expected[n] for n in names}, got["number"]
        assert {field: as_text(got[name]) for name, field in TEXT} == text, got["number"]

    def layer_rows(folder: Path) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for row in rows(folder, LAYERS_FILE) if row["number"] not in seams]

    assert layer_rows(tmp_path / "chunked") == layer_rows(tmp_path / "whole")
    # Frames whose layers cannot be aligned are counted once, by the whole file's numbers.
    assert chunked["unaligned"] == whole["unaligned"]
    # What the build keeps of the whole capture is what an index without it reads from its frames.
    for folder, meta in ((tmp_path / "whole", whole), (tmp_path / "chunked", chunked)):
        assert query.summary(folder, meta) == query.summary(folder, {"frames": meta["frames"]})
    assert ({k: chunked["summary"][k] for k in ("first_epoch", "last_epoch")}
            == {k: whole["summary"][k] for k in ("first_epoch", "last_epoch")})

    # The pages of a filter's matches, kept as their numbers or (many) as counts per block of frames
    # (blocks of 7 here), are the frames whose protocols tshark's own text names, page after page.
    monkeypatch.setattr(query, "BLOCK", 7)
    for layer in ("ip", "udp", "tcp", "sctp"):
        where = filters.to_sql(layer)
        assert where is not None
        expected = [int(text["frame.number"]) for text in said if layer in text["frame.protocols"].split(":")]
        for kept in (len(expected), len(expected) - 1):
            matches = query.matching(tmp_path / "whole", where, kept)
            assert matches.total == len(expected) and (matches.numbers is None) == (kept < len(expected))
            step = len(expected) // 9 + 3  # ~10 pages, each across blocks (a page's first block cut)
            paged = [n for offset in range(0, len(expected) + step, step)
                     for (n,) in query.matched_rows(tmp_path / "whole", where, matches, offset, step)]
            assert paged == expected, (layer, kept)
        assert query.every_match(tmp_path / "whole", where) == expected
