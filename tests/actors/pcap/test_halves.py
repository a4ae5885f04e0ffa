"""A capture's count and span from two capinfos runs over its halves (halves.py) against one capinfos run
over the whole file: the same table cells, or none (then pcap_info runs capinfos once).

Every capture of both corpora is cut at a record boundary after a quarter, half and three quarters of
its bytes; built files add what the corpus lacks: nanosecond and big-endian pcap, big-endian pcapng,
two interfaces of different resolutions, an earliest packet that is not the first, a tie between the
halves, a resolution whose printed digits round (10^-4 s: never combined), a pcap fraction of a second
or more, several sections, no packets, a file cut short, a cut that is no record boundary. The
reference runs are kept on disk (tests/support/pcap_oracle.py, keyed by each file's bytes).
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from diagd.actors.pcap.shark import halves
from diagd.actors.pcap.shark import tshark as cold
from tests.pcaps import corpus
from tests.support.capinfos_captures import ENV, T0, built, pcap, reference

pytestmark = pytest.mark.skipif(shutil.which("capinfos") is None, reason="capinfos (Wireshark) is not installed")
__all__ = ["built"]  # the fixture, used by name


async def combined(path: Path, near: float) -> tuple[str, ...] | None:
    cut = halves.plan(path, near)
    return await halves.count(path, ENV, cut) if cut is not None else None


# Built files the halves must combine (not only leave to one run): every cut of each gives the cells.
COMBINED = ["ns.pcap", "be.pcap", "out_of_order.pcap", "two_resolutions.pcapng", "two_resolutions_be.pcapng",
            "milliseconds.pcapng", "tie.pcapng", "tsoffset.pcapng"]


@pytest.mark.parametrize("name", COMBINED)
async def test_built_captures_are_combined_into_one_runs_cells(built: dict[str, Path], name: str) -> None:
    path = built[name]
    for near in (0.25, 0.5, 0.75):
        assert await combined(path, near) == reference(path), (name, near)


async def test_what_a_built_capture_holds_is_what_it_was_built_for(built: dict[str, Path]) -> None:
    assert reference(built["ns.pcap"])[0] == "nsecpcap" and reference(built["be.pcap"])[0] == "pcap"
    # First time on the nanosecond interface, last on the other: nine digits, six (three), nine.
    for name, digits in (("two_resolutions.pcapng", 6), ("two_resolutions_be.pcapng", 6), ("milliseconds.pcapng", 3)):
        _, _, _, duration, start, end = reference(built[name])
        assert start.endswith(".123456789") and len(end.rsplit(".")[1]) == digits, name
        assert len(duration.rsplit(".")[1]) == 9, name
    assert reference(built["tie.pcapng"])[4].endswith(":40.123456")  # the microsecond one, first in the file
    assert reference(built["out_of_order.pcap"])[4] == "2026-08-06 07:05:00.002500"  # packet 251 of 300
    assert reference(built["tsoffset.pcapng"])[4] == "2026-08-06 08:06:40.000042"  # an hour of offset
    assert reference(built["rounded.pcapng"])[4] == "2026-08-06 07:06:40.000"  # 0.0007 s printed as 0.000
    assert reference(built["cut_short.pcap"]) == ("exit 1",)
    assert reference(built["unnormalized.pcap"])[5].endswith(".1500000")


@pytest.mark.parametrize("name", ["rounded.pcapng", "two_sections.pcapng", "cut_short.pcap", "unnormalized.pcap"])
async def test_what_cannot_be_combined_exactly_is_left_to_one_run(built: dict[str, Path], name: str) -> None:
    path = built[name]
    for near in (0.25, 0.5, 0.75):
        cut = halves.plan(path, near)
        assert cut is not None, (name, near)  # the file is cut: the halves themselves say no
        assert await halves.count(path, ENV, cut) is None, (name, near)


async def test_a_cut_that_is_no_record_boundary_is_refused_by_the_first_half(built: dict[str, Path]) -> None:
    path = built["two_resolutions.pcapng"]
    cut = halves.plan(path)
    assert cut is not None and await halves.count(path, ENV, cut) is not None
    assert await halves.count(path, ENV, halves.Cut(cut.header, cut.at + 4)) is None
    assert halves.plan(built["no_packets.pcapng"]) is None


def test_files_that_are_not_plain_pcap_or_pcapng_are_not_cut(tmp_path: Path) -> None:
    (tmp_path / "text").write_text("not a capture\n" * 100)
    modified = bytearray(pcap(tmp_path / "modified.pcap", [(T0 + i, i) for i in range(50)]).read_bytes())
    modified[:4] = struct.pack("<I", 0xA1B2CD34)  # Kuznetzov's modified pcap: capinfos alone knows it
    (tmp_path / "modified.pcap").write_bytes(modified)
    assert halves.plan(tmp_path / "text") is None and halves.plan(tmp_path / "modified.pcap") is None


async def test_every_corpus_capture_gives_one_runs_cells_from_its_halves() -> None:
    files = corpus()
    if not files:
        pytest.skip("no corpus capture in the cache")
    combined_files = 0
    for path in files:
        want = reference(path)
        for near in (0.25, 0.5, 0.75):
            got = await combined(path, near)
            assert got is None or got == want, (path.name, near)
            combined_files += got is not None
    assert combined_files >= 2 * len(files)  # combined, not only left to one run (a 16-packet capture may not cut)


async def test_capture_facts_split_or_not_are_the_same(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Through capture_facts, a split read (any size here) gives the facts of one run, warning included."""
    monkeypatch.setattr(halves, "SPLIT_MIN_BYTES", 0)
    capinfos = cold.Capinfos()
    for name, path in built.items():
        size = path.stat().st_size
        one = await capinfos.capture_facts(path, f"one-{path}", size)
        two = await capinfos.capture_facts(path, f"two-{path}", size, split=True)
        assert one == two, name
    cut_short = await capinfos.capture_facts(built["cut_short.pcap"], "short", 1, split=True)
    assert cut_short.warning and cold.TRUNCATED in cut_short.warning


async def test_a_call_that_answers_with_the_count_has_the_check_read_it(built: dict[str, Path]) -> None:
    """A big file's check only opens it (captype), unless the call wants the count (pcap_info): then the
    check runs capinfos (split) and keeps its facts, so the call does not wait for a second read."""
    path = built["two_resolutions.pcapng"]
    capinfos = cold.Capinfos()
    await capinfos.check_capture(path, "checked-only", cold.BIG_FILE)
    assert capinfos.known_facts("checked-only") is None
    with cold.facts_wanted():
        await capinfos.check_capture(path, "counted", cold.BIG_FILE)
    facts = capinfos.known_facts("counted")
    assert facts is not None and (facts.file_type, facts.packets, facts.start) == (
        "pcapng", 200, reference(path)[4])
