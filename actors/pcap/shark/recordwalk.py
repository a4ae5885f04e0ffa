"""capinfos' count and time span of a capture from the file's own record headers, walked in C
(_recordwalk.c), beside capinfos reading the file's header alone for its words for the file type and
encapsulation and each interface's time resolution.

capinfos reads every record through wiretap (~22 ms for 55 MB, 4.5 ms of it its start); the walk reads
only the headers (a few ms) while the header-only capinfos starts, so a fresh capture's pcap_info waits
for the shorter of the two. The answer is capinfos' own or none (None: the caller runs capinfos, which
also says why a file is damaged or cut short); it is given only when every record is one wiretap reads
the same way:
- a plain pcap (2.4; micro- or nanosecond magic) whose records each have a fraction under a second, a
  captured length no longer than the length on the wire nor than 256 KiB, and which ends on a record end;
- a pcapng of one section whose interfaces (all described before the first packet) share one
  resolution, 10^-6 or 10^-9 s (capinfos on the header must say the same), with no time offset, holding
  only enhanced packet blocks of those interfaces (and name resolution and statistics blocks, which are
  no records), ending on a block end;
- at least one packet, and times that print as dates.
Differential tests hold it to one capinfos run on every corpus capture and on built edge cases
(tests/actors/pcap/test_recordwalk.py).
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import trio

from diagd.actors.pcap.shark import halves

_recordwalk: ModuleType | None
try:
    from diagd.actors.pcap.shark import _recordwalk
except ImportError:  # built without a C compiler: capinfos answers alone
    _recordwalk = None

DIGITS = {10**6: 6, 10**9: 9}  # the resolutions walked, and the digits capinfos prints for them
_SHB, _IDB = 0x0A0D0D0A, 1
_OPT_TSRESOL, _OPT_TSOFFSET = 9, 14
STOP_END, STOP_CUT_SHORT = 0, 1  # how _recordwalk.walk stopped: at the file's end, in a record cut short
HEAD_BYTES = 1 << 16  # a pcapng header (section and interface blocks) longer than this is not walked
LAST_DATE_S = 253402300799  # 9999-12-31 23:59:59: later times do not print as capinfos' dates


def available() -> bool:
    """Whether the C walker was built with this install (`diagd doctor` says so)."""
    return _recordwalk is not None


@dataclass(frozen=True)
class Layout:
    """What the walk needs from the file's header: where records start, in which byte order and format,
    and how many ticks a second their time stamps count."""

    header: bytes
    start: int
    pcapng: bool
    big_endian: bool
    ticks: int
    interfaces: int = 0  # pcapng: how many the header describes


@dataclass(frozen=True)
class Walked:
    packets: int
    first: int  # earliest and latest time stamp, in ticks
    last: int


def layout(data: bytes, *, any_ticks: bool = False) -> Layout | None:
    """The header of a plain pcap, or of a pcapng whose interfaces tick alike, that the walk may follow (else
    None). `any_ticks`: a pcapng whose interfaces tick in any way (several resolutions, a time offset) is
    followed too, block by block, for what needs its records but not their times (a cut: index/narrow.py);
    its Layout's `ticks` then means nothing."""
    magic = bytes(data[:4])
    if magic in halves.PCAP_MAGIC:
        pcap_order, fraction_ticks = halves.PCAP_MAGIC[magic]
        if len(data) < 24 or struct.unpack_from(pcap_order + "HH", data, 4) != (2, 4):
            return None
        return Layout(bytes(data[:24]), 24, False, pcap_order == ">", fraction_ticks)
    if magic != struct.pack("<I", _SHB) or len(data) < 28:
        return None
    order = halves.BYTE_ORDER.get(bytes(data[8:12]))
    if order is None:
        return None
    section = struct.unpack_from(order + "I", data, 4)[0]
    if struct.unpack_from(order + "H", data, 12)[0] != 1 or section % 4 or not 28 <= section <= len(data) - 20:
        return None
    at, ticks = section, []
    while at + 8 <= len(data) and struct.unpack_from(order + "I", data, at)[0] == _IDB:
        length = struct.unpack_from(order + "I", data, at + 4)[0]
        if length < 20 or length % 4 or at + length > len(data):
            return None
        ticks.append(_interface_ticks(bytes(data[at + 16:at + length - 4]), order))
        at += length
    if any_ticks and ticks:
        return Layout(bytes(data[:at]), at, True, order == ">", 10**6, len(ticks))
    shared = set(ticks)
    if len(shared) != 1:  # no interface, or interfaces that tick differently (or a resolution not walked)
        return None
    one = shared.pop()
    return None if one is None else Layout(bytes(data[:at]), at, True, order == ">", one, len(ticks))


def _interface_ticks(options: bytes, order: str) -> int | None:
    """An interface's ticks a second from its options (10^6 when none says), None for a resolution the
    walk does not serve or a time offset (wiretap adds it to every time stamp)."""
    ticks, at = 10**6, 0
    while at + 4 <= len(options):
        code, length = struct.unpack_from(order + "HH", options, at)
        if code == 0:
            break
        value = options[at + 4:at + 4 + length]
        if code == _OPT_TSOFFSET:
            return None
        if code == _OPT_TSRESOL:
            if length != 1 or value[0] & 0x80:
                return None
            ticks = 10 ** value[0]
        at += 4 + length + (-length % 4)
    return ticks if ticks in DIGITS else None


def read_layout(path: Path, *, any_ticks: bool = False) -> Layout | None:
    """The layout of the file's first 64 KiB (blocking: a worker thread's)."""
    with open(path, "rb") as f:
        return layout(f.read(HEAD_BYTES), any_ticks=any_ticks)


def is_walkable(path: Path) -> bool:
    """Whether the file starts with a header the walk follows: a capture of packets for wiretap, whatever
    its records hold (blocking: a worker thread's; False when it cannot be read: the caller's check says why)."""
    try:
        return read_layout(path) is not None
    except OSError:
        return False


def walk(path: Path, found: Layout) -> Walked | None:
    """The walk of all the file's records behind the header `found` (blocking: a worker thread's), None
    when the file's header is no longer that one or a record is not one the walk follows."""
    walked = _walk(path, found, 0)
    if walked is None:
        return None
    packets, first, last, _, stop, _, _ = walked
    return Walked(packets, first, last) if stop == 0 and packets else None


def _walk(path: Path, found: Layout, every: int) -> tuple[int, int, int, int, int, list[tuple[int, int]], int] | None:
    """_recordwalk.walk over the file behind the header `found` and the file's size, None when the file's
    header is no longer that one."""
    assert _recordwalk is not None
    fd = os.open(path, os.O_RDONLY)
    try:
        if os.pread(fd, len(found.header), 0) != found.header:
            return None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        packets, first, last, end, stop, marks = _recordwalk.walk(fd, found.start, found.pcapng, found.big_endian,
                                                                  found.ticks, found.interfaces, every)
        return packets, first, last, end, stop, marks, os.fstat(fd).st_size
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Chunk:
    """A run of consecutive records: from the file offset `start` (a record's) to `end`, holding the
    packets numbered `first` + 1 ... `first` + `packets`."""

    start: int
    end: int
    first: int
    packets: int


def chunks(path: Path, found: Layout, every: int) -> list[Chunk] | None:
    """The file's records behind the header `found` in runs of about `every` bytes (each ends where a
    record starts; the last at the file's end, with a last record cut short if the file ends in one:
    tshark reads up to it, as from the whole file), or None when the walk stops at a record it does not
    follow (the file cannot be split by its records: read it whole). Blocking: a worker thread's."""
    assert every > 0
    walked = _walk(path, found, every)
    if walked is None:
        return None
    packets, _, _, end, stop, marks, size = walked
    if stop not in (STOP_END, STOP_CUT_SHORT) or not packets:
        return None
    bounds = [*marks, (size if stop == STOP_CUT_SHORT else end, packets)]
    return [Chunk(start, stop_at, first, following - first)
            for (start, first), (stop_at, following) in itertools.pairwise(bounds)]


def stamp(ticks_since_epoch: int, ticks: int) -> str | None:
    """A time stamp as capinfos prints it (TZ=UTC), None past year 9999."""
    seconds, fraction = divmod(ticks_since_epoch, ticks)
    if seconds > LAST_DATE_S:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + f".{fraction:0{DIGITS[ticks]}d}"


def cells(found: Layout, walked: Walked, said: halves.Half) -> tuple[str, str, str, str, str, str] | None:
    """capinfos' table cells (file type to last time) from the walk and capinfos' reading of the header,
    None unless capinfos read the header as the walk did (one interface, the same resolution, one section)."""
    if said.ticks != (found.ticks,) * max(1, found.interfaces) or said.sections != 1 or said.packets != 0:
        return None
    start, end = stamp(walked.first, found.ticks), stamp(walked.last, found.ticks)
    if start is None or end is None:
        return None
    seconds, fraction = divmod(walked.last - walked.first, found.ticks)
    duration = f"{seconds}.{fraction:0{DIGITS[found.ticks]}d}"
    return said.file_type, said.encapsulation, str(walked.packets), duration, start, end


async def count(path: Path, env: dict[str, str]) -> tuple[str, str, str, str, str, str] | None:
    """capinfos' table cells for the whole file from the walk, or None (not walked: capinfos' path)."""
    if _recordwalk is None:
        return None
    walked: Walked | None = None
    said: halves.Half | None = None
    try:
        found = await trio.to_thread.run_sync(read_layout, path)
        if found is None:
            return None
        head = found

        async def walk_records() -> None:
            nonlocal walked
            walked = await trio.to_thread.run_sync(walk, path, head)

        async def read_header() -> None:
            nonlocal said
            said = await halves.read_prefix(head.header, env)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(walk_records)
            nursery.start_soon(read_header)
    except (OSError, ValueError):  # gone, empty or changed under the reads: capinfos says what it is
        return None
    return cells(found, walked, said) if walked is not None and said is not None else None
