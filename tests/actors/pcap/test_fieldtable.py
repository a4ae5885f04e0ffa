"""FieldTable answers the same with its text in memory or spilled to a file (issue 12)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import trio

from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.fieldtable import FieldTable

ROWS = [
    ("ngap.Cause", ("Cause", "FT_UINT32", "ngap")),
    ("ngap.cause", ("cause (lower)", "FT_UINT32", "ngap")),
    ("ngap.AMF_UE_NGAP_ID", ("AMF UE NGAP ID", "FT_UINT64", "ngap")),
    ("sip.Call-ID", ("Call-ID", "FT_STRING", "sip")),
    ("xx.micro", ("\u00b5s since start", "FT_DOUBLE", "xx")),  # non-ASCII: kept aside
    ("eth.addr", ("Address", "FT_ETHER", "eth")),
    ("ngap.Cause", ("Cause again", "FT_UINT32", "ngap")),  # listed twice: first place, last value
    ("empty.desc", ("", "FT_NONE", "empty")),
]


def tables(tmp_path: Path) -> tuple[FieldTable, FieldTable]:
    memory, spilled = FieldTable.from_rows(ROWS), FieldTable.from_rows(ROWS)
    assert spilled.spill(tmp_path) and spilled.spilled and not memory.spilled
    assert list(tmp_path.iterdir()) == []  # an unlinked file: nothing is left behind
    return memory, spilled


def test_a_spilled_table_answers_as_the_one_in_memory(tmp_path: Path) -> None:
    memory, spilled = tables(tmp_path)
    assert dict(spilled.items()) == dict(memory.items()) == dict(ROWS)
    assert list(spilled) == list(memory) and len(spilled) == len(memory) == 7
    assert spilled.text == memory.text
    for name, _ in ROWS:
        assert spilled[name] == memory[name] and name in spilled
    assert "ngap.nope" not in spilled and spilled.get("ngap.nope") is None
    assert spilled.alias("ngap.cause") == memory.alias("ngap.cause") == "ngap.cause"
    assert spilled.alias("sip.call-id") == "sip.Call-ID"
    assert spilled.with_prefix("ngap.") == memory.with_prefix("ngap.") == [0, 1, 2]
    assert spilled.with_prefix("NGAP.", lower=False) == []
    assert spilled.non_ascii == memory.non_ascii == (4,)
    assert [spilled.row(i) for i in range(7)] == [memory.row(i) for i in range(7)]
    assert spilled.slice(0, 20) == memory.text[:20]


def test_a_spilled_table_pickles_with_its_text(tmp_path: Path) -> None:
    _, spilled = tables(tmp_path)
    copy = pickle.loads(pickle.dumps(spilled))
    assert not copy.spilled and dict(copy.items()) == dict(ROWS)


def test_a_directory_that_cannot_be_made_leaves_the_text_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    table = FieldTable.from_rows(ROWS)
    assert not table.spill(blocker / "sub") and not table.spilled
    assert dict(table.items()) == dict(ROWS)


def test_the_daemons_catalogue_is_spilled() -> None:
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    cat = trio.run(Wireshark().catalogue)
    assert cat.table.spilled
    assert cat.fields["frame.number"][1] == "FT_UINT32" and "ngap.procedureCode" in cat.fields


def test_rows_at_reads_the_rows_asked_for(tmp_path: Path) -> None:
    memory, spilled = tables(tmp_path)
    for positions in ([], [0], [1, 4, 6], list(range(7))):
        assert spilled.rows_at(positions) == memory.rows_at(positions) == [memory.row(i) for i in positions]
