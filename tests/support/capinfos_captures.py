"""Captures built record by record for the capinfos readers' tests (halves.py, recordwalk.py): what the
corpus lacks (nanosecond and big-endian pcap, big-endian pcapng, two interfaces of different resolutions,
an earliest packet that is not the first, a tie, a resolution whose printed digits round, a pcap fraction
of a second or more, several sections, no packets, a file cut short), and one capinfos run's table cells
as the reference (kept on disk: tests/support/pcap_oracle.py, keyed by each file's bytes)."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support.pcap_oracle import cached_text

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
    # Interfaces ticking alike (nanoseconds), packets on each, and blocks that are no records between them.
    alike = Pcapng(">")
    for _ in range(3):
        alike.interface(9)
    for i in range(300):
        if i % 50 == 7:
            alike.block(4, struct.pack(">HH", 0, 0))  # name resolution, no records
            alike.block(5, struct.pack(">III", i % 3, 0, 0))  # interface statistics
        alike.packet((T0 + i) * 10**9 + (999_999_999 if i == 123 else i), i % 3)
    files["alike_interfaces_be.pcapng"] = alike.write(out / "alike_interfaces_be.pcapng")
    simple = Pcapng()
    simple.interface()
    for i in range(50):
        simple.packet((T0 + i) * 10**6)
    simple.block(3, struct.pack("<I", len(FRAME)) + _pad(FRAME))  # a simple packet block: no time stamp
    files["simple_packet.pcapng"] = simple.write(out / "simple_packet.pcapng")
    binary = Pcapng()
    binary.interface(0x80 | 20)  # 2^-20 s
    for i in range(50):
        binary.packet((T0 + i) << 20)
    files["power_of_two.pcapng"] = binary.write(out / "power_of_two.pcapng")
    late = Pcapng()
    late.interface(6)
    for i in range(50):
        late.packet((T0 + i) * 10**6)
    late.interface(6)  # described after packets: a record the walk stops at
    late.packet((T0 + 60) * 10**6, 1)
    files["late_interface.pcapng"] = late.write(out / "late_interface.pcapng")
    whole = files["ns.pcap"].read_bytes()
    (out / "cut_short.pcap").write_bytes(whole[:-20])
    files["cut_short.pcap"] = out / "cut_short.pcap"
    return files
