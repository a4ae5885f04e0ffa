"""A daemon that indexes captures bigger than its `index_chunk_mb` in chunks (index/stitch.py), asked
through MCP: every corpus capture over 1 MiB, read in 1 MiB chunks. Each page row is tshark's own row
(one pass over the whole file), but the seam frames' Source, Destination, Protocol and Info, which it must mark
`provisional` (the page then says why and is not `exact`); every conversation and endpoint row is
sharkd's own tap's; pcap_index says how the capture was read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DaemonProcess
from tests.e2e.test_pcap_differential import session
from tests.e2e.test_pcap_index import NARROWED_FILTERS, TABLES, corpus_daemon, sharkd_tables
from tests.e2e.test_pcap_oracle import row_of
from tests.pcaps import PCAPS, corpus
from tests.support import pcap_oracle as oracle

CHUNK_MB = 1
PAGE = 1000
PER_FRAME = ("number", "time_relative", "length")


def big_captures() -> list[Path]:
    found = [path for path in corpus() if path.stat().st_size > 2 * CHUNK_MB * 2**20]
    if not found:
        pytest.skip(f"no real capture over {2 * CHUNK_MB} MiB in {PCAPS}")
    return found


@pytest.fixture(scope="module")
def chunking_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from corpus_daemon(tmp_path_factory, "chunkd", f"[pcap]\nindex_chunk_mb = {CHUNK_MB}\n")


@pytest.mark.parametrize("path", big_captures(), ids=lambda p: p.name)
async def test_a_chunked_index_answers_tsharks_rows_and_marks_its_seam_frames(chunking_daemon: DaemonProcess,
                                                                              path: Path) -> None:
    table = oracle.columns(path)
    theirs = sharkd_tables(path)
    async with session(chunking_daemon) as call:
        built = await call("pcap_index", pcap_path=str(path), wait_s=240)
        assert not built["_is_error"] and built["state"] == "ready", built
        how = built["chunked"]
        assert how["chunks"] == -(-path.stat().st_size // (CHUNK_MB * 2**20)) and how["chunk_mb"] == CHUNK_MB, how
        got: list[dict[str, Any]] = []
        while True:
            page = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter="", limit=PAGE,
                              offset=len(got))
            assert not page["_is_error"] and page["served_by"] == "index", page
            marked = [row for row in page["frames"] if "provisional" in row]
            assert page["exact"] is not bool(marked), page.get("note")
            if marked:
                assert f"{len(marked)} seam frames" in page["note"], page["note"]
            got += page["frames"]
            if not page["has_more"]:
                break
        # A filter the index does not translate, matched by tshark over the frames cut by the index's rows.
        for flt in [flts[0] for layer, flts in NARROWED_FILTERS.items() if layer in oracle.layers(path)]:
            narrowed = await call("pcap_frames_by_filter", pcap_path=str(path), display_filter=flt, limit=5000)
            assert narrowed["served_by"] == "index" and "matched by tshark -Y over " in narrowed["note"], narrowed
            assert ("seam frames' layers and streams may differ" in narrowed["note"]) == bool(how["seam_frames"])
            assert [f["number"] for f in narrowed["frames"]] == oracle.matching(path, flt)[:5000], (path.name, flt)
        timeline = await call("pcap_timeline", pcap_path=str(path), fields=["ip.src", "_ws.col.Info"],
                              display_filter="", limit=PAGE)
        assert not timeline["_is_error"] and timeline["served_by"] == "index", timeline
        for (kind, layer), expected in theirs.items():
            if layer not in TABLES or layer in built.get("tables_from_sharkd", {}):
                continue
            answer = await call("pcap_stats", pcap_path=str(path), kind=kind, protocol=layer, limit=5000)
            assert answer["method"].startswith("index:"), answer
            exact = [row for row in answer["rows"] if "provisional" not in row]
            # Every row without seam frames is the tap's own; the others say they count some.
            assert all(row in expected for row in exact), (path.name, kind, layer)
            marked = [row for row in answer["rows"] if "provisional" in row]
            assert all(row["seam_frames"] > 0 for row in marked)
            assert ("chunks" in answer["method"]) == bool(how["seam_frames"]), answer["method"]
            if not how["seam_frames"]:
                assert answer["rows"] == expected, (path.name, kind, layer)
    assert [f["number"] for f in got] == sorted(table)
    seams = [frame for frame in got if "provisional" in frame]
    assert len(seams) == how["seam_frames"], path.name
    for frame in got:
        expected = row_of(table[frame["number"]])
        if "provisional" in frame:
            assert frame.pop("provisional") == ["dst", "info", "protocol", "src"]
            assert {k: frame[k] for k in PER_FRAME} == {k: expected[k] for k in PER_FRAME}, path.name
        else:
            assert frame == expected, path.name
    timed = {row["frame.number"]: row for row in timeline["rows"]}
    for number, row in timed.items():
        assert ("provisional" in row) == any(f["number"] == number for f in seams)
