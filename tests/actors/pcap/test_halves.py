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

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from diagd.actors.pcap.shark import halves
from diagd.actors.pcap.shark import tshark as cold
from tests.pcaps import corpus
from tests.support.pcap_oracle import cached_text

pytestmark = pytest.mark.skipif(shutil.which("capinfos") is None, reason="capinfos (Wireshark) is not installed")
TABLE = ["capinfos", "-M", "-T", "-r", "-t", "-E", "-c", "-u", "-a", "-e"]
ENV = {**os.environ, "TZ": "UTC"}
FRAME = bytes.fromhex("ffffffffffff" "020000000001" "0800") + bytes(46)  # Ethernet, padded to 60 bytes


def reference(path: Path) -> tuple[str, ...]:
    """The cells of one capinfos run over the whole file (file type to last time), or its exit status."""
    def compute() -> str:
        done = subprocess.run([*TABLE, str(path)], capture_output=True, text=True, env=ENV, check=False)
        return done.stdout if done.returncode == 0 else f"exit {done.returncode}"
    text = cached_text(path, [*TABLE, str(path)], compute)
    return tuple(text.strip().rsplit("\t", 6)[1:]) if not text.startswith("exit") else (text,)


async def combined(path: Path, near: float) -> tuple[str, ...] | None:
    cut = halves.plan(path, near)
    return await halves.count(path, ENV, cut) if cut is not None else None


# ------------------------------------------------------------------------------------------ built files


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


class Pcapng:
    """A pcapng file written block by block, in one byte order."""

    def __init__(self, order: str = "<") -> None:
        self.order, self.data = order, bytearray()
        self.section()

    def block(self, kind: int, body: bytes) -> None:
        length = 12 + len(body)
        self.data += struct.pack(self.order + "II", kind, length) + body + struct.pack(self.order + "I", length)

    def section(self) -> None:
        self.block(0x0A0D0D0A, struct.pack(self.order + "IHHq", 0x1A2B3C4D, 1, 0, -1))

    def interface(self, tsresol: int | None = None, tsoffset: int | None = None) -> None:
        options = b""
        if tsresol is not None:
            options += struct.pack(self.order + "HH", 9, 1) + _pad(bytes([tsresol]))
        if tsoffset is not None:
            options += struct.pack(self.order + "HHq", 14, 8, tsoffset)
        if options:
            options += struct.pack(self.order + "HH", 0, 0)
        self.block(1, struct.pack(self.order + "HHI", 1, 0, 65535) + options)

    def packet(self, ticks: int, interface: int = 0) -> None:
        self.block(6, struct.pack(self.order + "IIIII", interface, ticks >> 32, ticks & 0xFFFFFFFF, len(FRAME),
                                  len(FRAME)) + _pad(FRAME))

    def write(self, path: Path) -> Path:
        path.write_bytes(bytes(self.data))
        return path


def pcap(path: Path, times: list[tuple[int, int]], *, order: str = "<", nanos: bool = False) -> Path:
    data = struct.pack(order + "IHHiIII", 0xA1B23C4D if nanos else 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    for seconds, fraction in times:
        data += struct.pack(order + "IIII", seconds, fraction, len(FRAME), len(FRAME)) + FRAME
    path.write_bytes(data)
    return path


T0 = 1_786_000_000  # 2026-08-06


def two_resolutions(path: Path, order: str = "<", slow: int = 6) -> Path:
    """Interfaces of 10^-slow and 10^-9 s, packets alternating; the earliest (on the 10^-9 s one) is in
    the last quarter, the latest (10^-slow s) in the first."""
    f = Pcapng(order)
    f.interface(slow)
    f.interface(9)
    for i in range(200):
        if i == 20:
            f.packet((T0 + 500) * 10**slow + 7, 0)  # the latest
        elif i == 170:
            f.packet((T0 - 5) * 10**9 + 123_456_789, 1)  # the earliest
        elif i % 2:
            f.packet((T0 + i) * 10**9 + 999_999_999, 1)
        else:
            f.packet((T0 + i) * 10**slow + 1, 0)
    return f.write(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("halves")
    files = {
        "ns.pcap": pcap(out / "ns.pcap", [(T0 + i // 3, 7 * i + 1) for i in range(300)], nanos=True),
        "be.pcap": pcap(out / "be.pcap", [(T0 + i, 999_999 - i) for i in range(300)], order=">"),
        # The earliest packet is late in the file, the first is not the earliest.
        "out_of_order.pcap": pcap(out / "out_of_order.pcap",
                                  [(T0 - 100 if i == 250 else T0 + i, 10 * i) for i in range(300)]),
        "two_resolutions.pcapng": two_resolutions(out / "two_resolutions.pcapng"),
        "two_resolutions_be.pcapng": two_resolutions(out / "two_resolutions_be.pcapng", ">"),
        "milliseconds.pcapng": two_resolutions(out / "milliseconds.pcapng", slow=3),
    }
    # A tie between the halves: the same first time on a microsecond and a nanosecond interface, the
    # microsecond one first in the file (capinfos keeps the first: six digits).
    tie = Pcapng()
    tie.interface(6)
    tie.interface(9)
    for i in range(200):
        if i in (10, 150):
            tie.packet(T0 * 10**6 + 123_456 if i == 10 else T0 * 10**9 + 123_456_000, 0 if i == 10 else 1)
        else:
            tie.packet((T0 + 1 + i) * 10**6, 0)
    files["tie.pcapng"] = tie.write(out / "tie.pcapng")
    offset = Pcapng()
    offset.interface(tsoffset=3600)
    for i in range(200):
        offset.packet((T0 + i) * 10**6 + 42)
    files["tsoffset.pcapng"] = offset.write(out / "tsoffset.pcapng")
    # 10^-4 s ticks print as milliseconds in capinfos 4.0: a printed time is not the time, never combined.
    rounded = Pcapng()
    rounded.interface(4)
    for i in range(200):
        rounded.packet((T0 + i) * 10**4 + 7)
    files["rounded.pcapng"] = rounded.write(out / "rounded.pcapng")
    sections = Pcapng()
    sections.interface(6)
    for i in range(100):
        sections.packet((T0 + i) * 10**6)
    sections.section()
    sections.interface(9)
    for i in range(100):
        sections.packet((T0 - 1000 + i) * 10**9 + 5)
    files["two_sections.pcapng"] = sections.write(out / "two_sections.pcapng")
    empty = Pcapng()
    empty.interface()
    files["no_packets.pcapng"] = empty.write(out / "no_packets.pcapng")
    # The latest record's microseconds are 1.5 s: capinfos prints that time with seven digits.
    files["unnormalized.pcap"] = pcap(out / "unnormalized.pcap",
                                      [(T0 + i, 1_500_000 if i == 299 else i) for i in range(300)])
    whole = files["ns.pcap"].read_bytes()
    (out / "cut_short.pcap").write_bytes(whole[:-20])
    files["cut_short.pcap"] = out / "cut_short.pcap"
    return files


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
