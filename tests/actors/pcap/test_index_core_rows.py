"""The PFCP and SBI rows the NGAP procedures view links (index/core_rows.py), read by tshark from a cut of
an indexed capture, against the same `tshark -T fields` two-pass read of the whole file, on every corpus
capture carrying PFCP, HTTP or HTTP/2 (with its decode-as rules): every row (but users' HTTP inside GTP-U,
which core_links skips) and every field equal, frame numbers and response links the whole file's, but
tcp.stream (the cut's own numbering, only ever a key).
Then an index read in chunks, and a cut tshark cannot read within its memory bound."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import core_rows, workspace
from diagd.actors.pcap.shark.tshark import AGGREGATOR, FIELDS_OPTIONS, base_argv
from diagd.protocol.errors import DiagdError
from tests.e2e.test_pcap_index import captures
from tests.support import pcap_oracle as oracle
from tests.support.index_builds import build

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

CARRIERS = {"pfcp", "http", "http2"}


def carrying() -> list[Path]:
    return [p for p in captures() if CARRIERS & set(oracle.layers(p))]


def whole_file(argv: list[str]) -> list[dict[str, str]]:
    """tshark's own rows over the whole file, as answers.core_rows reads them for the loaded capture."""
    fields = [arg for name in ngap.CORE_FIELDS for arg in ("-e", name)]
    out = oracle.run([*argv, "-Y", ngap.CORE_FILTER, *FIELDS_OPTIONS, *fields])
    return [dict(zip(ngap.CORE_FIELDS, line.replace(AGGREGATOR, ",").split("\t"), strict=True))
            for line in out.splitlines()]


def keys(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows but users' HTTP inside GTP-U (which core_links skips and the cut need not hold), without
    tcp.stream (the cut's own numbering)."""
    return [{k: v for k, v in row.items() if k != "tcp.stream"} for row in rows if not row["gtp.teid"]]


async def read(path: Path, tmp_path: Path, chunk_bytes: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    argv = base_argv(path, oracle.decode_as(path), [])
    meta = build(path, tmp_path / "index", chunk_bytes, argv)
    got = await core_rows.core_rows(path, tmp_path / "index", int(meta["frames"]), argv)
    return got, whole_file(argv)


@pytest.mark.parametrize("path", carrying(), ids=lambda p: p.name)
async def test_rows_from_a_cut_are_the_whole_files(path: Path, tmp_path: Path) -> None:
    got, want = await read(path, tmp_path, 0)
    assert keys(got) == keys(want)
    # A connection is told apart by its stream in the cut as in the whole file: the same rows share one.
    sbi = [[row for row in rows if not row["gtp.teid"]] for rows in (got, want)]
    pairs = {(g.get("tcp.stream"), w.get("tcp.stream")) for g, w in zip(*sbi, strict=True)}
    assert len({g for g, _ in pairs}) == len({w for _, w in pairs}) == len(pairs)


async def test_rows_from_an_index_read_in_chunks(tmp_path: Path) -> None:
    path = max(carrying(), key=lambda p: p.stat().st_size)
    got, want = await read(path, tmp_path, path.stat().st_size // 5)
    assert want and keys(got) == keys(want)


async def test_a_cut_past_the_memory_bound_is_left_to_the_loaded_capture(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = max(carrying(), key=lambda p: p.stat().st_size)
    monkeypatch.setattr(workspace, "CUT_MAX_AS", 32 * 2**20)  # less than tshark needs to start
    with pytest.raises(DiagdError, match="as when it needs more than 32 MB") as refused:
        await read(path, tmp_path, 0)
    assert refused.value.details.get("index_unanswered") is True
