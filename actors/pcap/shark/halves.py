"""capinfos' count and time span of a big capture from two capinfos runs side by side, one per half.

One capinfos run reads every record of the file on one core (about 0.4 s for 1 GB here), and a fresh
capture's pcap_info waits for it; no reader in this process comes near it (CPython walks record headers
at about half its speed). A pcap or pcapng file is cut instead at a record boundary near its middle,
found from the file's own headers, and each half is piped to a capinfos of its own, the second behind the
file's header (pcap: its 24 bytes; pcapng: the first section header and the interface blocks after it).
The two answers are combined into what one run over the whole file prints, or not at all (None: the
caller runs capinfos once, which also says why a file is damaged or cut short):
- the first half ends cleanly at the cut: capinfos read records up to it and none across it, so the cut
  is a record boundary (the header walk only guessed it);
- both halves name one file type and one encapsulation, hold packets with time stamps, in one section;
- every interface ticks 1, 10, 100, 1,000 or 1,000,000 times a second or at least 10^9 times: each
  printed time is then the exact time, so the earlier first time (the first half's on a tie: capinfos
  keeps the first packet it saw), the later last time, and the duration between them at the finer of
  their precisions are what one run prints.
"""

from __future__ import annotations

import calendar
import contextlib
import fcntl
import mmap
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from diagd.actors._subprocess import open_process, run
from diagd.protocol.errors import DiagdError

SPLIT_MIN_BYTES = 48 * 2**20  # below, two start-ups and the piping cost what half a pass saves (46 MB: even)
SEARCH_BYTES = 1 << 20  # how far past the middle a record boundary is looked for
CHAIN = 8  # consecutive well-formed records a boundary must start
YEARS_10 = 10 * 366 * 86400
PIPE_BYTES = 1 << 20  # pipe buffer asked for (64 KiB by default: 16x more wake-ups)
HALF_ARGV = ("capinfos", "-M", "-t", "-E", "-c", "-a", "-e", "-I", "-")  # long form: each interface's ticks
EXACT_TICKS = frozenset({1, 10, 100, 1000, 10**6})  # and any from 10**9 up: printed digits hold the whole time

PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": ("<", 10**6), b"\xa1\xb2\xc3\xd4": (">", 10**6),
         b"\x4d\x3c\xb2\xa1": ("<", 10**9), b"\xa1\xb2\x3c\x4d": (">", 10**9)}
_SHB, _IDB, _EPB = 0x0A0D0D0A, 1, 6
BYTE_ORDER = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}
_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?")
_DIGITS = frozenset({0, 1, 2, 3, 6, 9})  # capinfos 4.0's precisions (of EXACT_TICKS and 10**9 up)


@dataclass(frozen=True)
class Cut:
    """Where the file is cut and what the second half is read behind."""

    header: bytes
    at: int


@dataclass(frozen=True)
class Half:
    """What capinfos printed for one half (its long form, -M)."""

    file_type: str
    encapsulation: str
    packets: int
    start: str | None  # None: no time stamps (or no line for them)
    end: str | None
    ticks: tuple[int, ...]  # each interface's time ticks per second
    sections: int


def plan(path: Path, near: float = 0.5) -> Cut | None:
    """A cut at a record boundary of a plain pcap or pcapng file, the first after `near` (its share of the
    file's bytes) that its headers show (None for any other file, or when none shows up near there)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 64:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            magic = mm[:4]
            if magic in PCAP_MAGIC:
                return _pcap_cut(mm, size, int(size * near), *PCAP_MAGIC[magic])
            if magic == struct.pack("<I", _SHB):
                return _pcapng_cut(mm, size, int(size * near))
    return None


def _pcap_cut(mm: mmap.mmap, size: int, near: int, order: str, frac_limit: int) -> Cut | None:
    major, minor, _, _, snaplen = struct.unpack_from(order + "HHiII", mm, 4)
    if (major, minor) != (2, 4):
        return None
    record = struct.Struct(order + "IIII")
    biggest = max(snaplen, 262144)
    first = record.unpack_from(mm, 24)[0]

    def starts_records(at: int) -> bool:
        for _ in range(CHAIN):
            if at + 16 > size:
                return False
            seconds, frac, caplen, length = record.unpack_from(mm, at)
            # Within ten years of the first packet, a fraction under a second, a length on the wire.
            if abs(seconds - first) > YEARS_10 or frac >= frac_limit or length == 0 or caplen > min(length, biggest):
                return False
            at += 16 + caplen
        return at <= size

    # A record header's fraction, captured and original lengths are all under 2^24: their top bytes are 0.
    zeros = rb"(?s)(?=.{7}\x00.{3}\x00.{3}\x00)" if order == "<" else rb"(?s)(?=.{4}\x00.{3}\x00.{3}\x00)"
    middle = max(24, near)
    window = mm[middle:min(size, middle + SEARCH_BYTES)]
    for found in re.finditer(zeros, window):
        if starts_records(middle + found.start()):
            return Cut(bytes(mm[:24]), middle + found.start())
    return None


def _pcapng_cut(mm: mmap.mmap, size: int, near: int) -> Cut | None:
    order = BYTE_ORDER.get(mm[8:12])
    if order is None:
        return None
    word = struct.Struct(order + "I")
    block = struct.Struct(order + "II")
    at = word.unpack_from(mm, 4)[0]  # past the section header
    if struct.unpack_from(order + "H", mm, 12)[0] != 1 or at % 4 or not 28 <= at <= size:
        return None
    while at + 8 <= size and block.unpack_from(mm, at)[0] == _IDB:
        length = block.unpack_from(mm, at)[1]
        if length < 20 or length % 4:
            return None
        at += length
    header_end = at
    if header_end == word.unpack_from(mm, 4)[0] or header_end > size // 2:
        return None  # no interface, or a header that is most of the file

    def well_formed(at: int) -> int | None:
        """The end of a well-formed block at `at` (its two lengths agree), else None."""
        if at + 12 > size:
            return None
        length: int = block.unpack_from(mm, at)[1]
        if length < 12 or length % 4 or at + length > size or word.unpack_from(mm, at + length - 4)[0] != length:
            return None
        return at + length

    def starts_blocks(at: int) -> bool:
        before = word.unpack_from(mm, at - 4)[0]  # the block before ends here: its two lengths agree too
        if before < 12 or before % 4 or at - before < header_end or well_formed(at - before) != at:
            return False
        for _ in range(CHAIN):
            end = well_formed(at)
            if end is None:
                return False
            at = end
        return True

    epb = word.pack(_EPB)
    at = max(header_end + 4, near) & ~3
    stop = min(size, at + SEARCH_BYTES)
    while (at := mm.find(epb, at, stop)) >= 0:
        if at % 4 == 0 and starts_blocks(at):
            return Cut(bytes(mm[:header_end]), at)
        at += 1
    return None


def _feed(source: int, sink: int, prefix: bytes, start: int, end: int) -> None:
    """Write `prefix`, then bytes [start, end) of `source` (spliced: no copy through this process), into
    the pipe `sink`. A reader that is gone (capinfos stopped) ends the feeding."""
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(sink, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        view = memoryview(prefix)
        while view:
            view = view[os.write(sink, view):]
        while start < end:
            try:
                moved = os.splice(source, sink, min(end - start, PIPE_BYTES), offset_src=start)
            except OSError as exc:
                if exc.errno not in (22, 38):  # EINVAL, ENOSYS: no splice from this file system
                    raise
                moved = os.write(sink, os.pread(source, min(end - start, PIPE_BYTES), start))
            if moved == 0:
                break
            start += moved
    except BrokenPipeError:
        pass


async def _read_half(source: int, prefix: bytes, start: int, end: int, env: dict[str, str]) -> Half | None:
    """capinfos' answer for `prefix` + bytes [start, end) of `source`, piped to it (None: it failed)."""
    reader, writer = os.pipe()
    reader_open, fed = True, True

    def close_reader() -> None:
        nonlocal reader_open
        if reader_open:
            reader_open = False
            os.close(reader)

    async def spawn(argv: Sequence[str], *, env: dict[str, str] | None = None) -> trio.Process:
        try:
            return await open_process(argv, stdin=reader, env=env)
        finally:
            close_reader()  # capinfos holds it now: when capinfos is gone, the feeder's writes fail

    async def feed() -> None:
        nonlocal fed
        try:
            await trio.to_thread.run_sync(_feed, source, writer, prefix, start, end)
        except OSError:
            fed = False
        finally:
            os.close(writer)

    done = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        try:
            done = await run(HALF_ARGV, env=env, spawn=spawn)
        except DiagdError:
            pass
        finally:
            close_reader()  # never started: the feeder must not wait on a pipe nobody reads
    return parse(done.out) if fed and done is not None and done.returncode == 0 else None


async def read_prefix(prefix: bytes, env: dict[str, str]) -> Half | None:
    """capinfos' answer for `prefix` alone (a file's header: its type, encapsulation and interfaces' ticks)."""
    return await _read_half(-1, prefix, 0, 0, env)  # no bytes of a file follow: `source` is never read


async def count(path: Path, env: dict[str, str], cut: Cut) -> tuple[str, str, str, str, str, str] | None:
    """capinfos' table cells (file type, encapsulation, packets, duration, first and last time) for the
    whole file from its two halves read side by side, or None when they cannot be combined exactly."""
    source = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(source).st_size
        halves: list[Half | None] = [None, None]

        async def read(i: int, prefix: bytes, start: int, end: int) -> None:
            halves[i] = await _read_half(source, prefix, start, end, env)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, 0, b"", 0, cut.at)
            nursery.start_soon(read, 1, cut.header, cut.at, size)
    finally:
        os.close(source)
    first, second = halves
    return combine(first, second) if first is not None and second is not None else None


def parse(text: str) -> Half | None:
    """One half's capinfos long form (-M -t -E -c -a -e -I); None for anything else."""
    fields: dict[str, str] = {}
    ticks: list[int] = []
    sections = 1
    for line in text.splitlines():
        if line.startswith(" "):
            key, _, value = line.strip().partition(" = ")
            if key == "Time ticks per second":
                if not value.isdigit():
                    return None
                ticks.append(int(value))
        elif line.startswith("Section ") and line.endswith(":"):
            sections = max(sections, 2)
        else:
            key, sep, value = line.partition(":")
            if sep and key not in fields:
                fields[key] = value.strip()
    packets = fields.get("Number of packets", "")
    if "File type" not in fields or "File encapsulation" not in fields or not packets.isdigit():
        return None
    return Half(fields["File type"], fields["File encapsulation"], int(packets), fields.get("First packet time"),
                fields.get("Last packet time"), tuple(ticks), sections)


def _ns(text: str) -> tuple[int, int] | None:
    """(nanoseconds since the epoch, digits printed) of a capinfos time (TZ=UTC); None for a time it
    printed from a fraction of a second or more (a pcap record's: 7 digits of microseconds)."""
    m = _TIME.fullmatch(text)
    if m is None or len(m.group(7) or "") not in _DIGITS:
        return None
    seconds = calendar.timegm((*(int(g) for g in m.groups()[:6]), 0, 0, 0))
    fraction = m.group(7) or ""
    return seconds * 10**9 + int(fraction.ljust(9, "0") or 0), len(fraction)


def combine(first: Half, second: Half) -> tuple[str, str, str, str, str, str] | None:
    """What one capinfos run over the whole file prints, from its two halves' answers (None: not exactly)."""
    if (first.file_type, first.encapsulation) != (second.file_type, second.encapsulation) or \
            first.sections != 1 or second.sections != 1 or not first.packets or not second.packets:
        return None
    ticks = first.ticks + second.ticks
    if not ticks or any(t not in EXACT_TICKS and t < 10**9 for t in ticks):
        return None
    times = [first.start, first.end, second.start, second.end]
    parsed = [_ns(t) for t in times if t is not None]
    if len(parsed) != 4 or any(p is None for p in parsed):
        return None
    (s1, e1, s2, e2) = [p for p in parsed if p is not None]
    start, start_text = (s2, second.start) if s2[0] < s1[0] else (s1, first.start)
    end, end_text = (e2, second.end) if e2[0] > e1[0] else (e1, first.end)
    assert start_text is not None and end_text is not None
    digits = max(start[1], end[1])
    seconds, nanos = divmod(end[0] - start[0], 10**9)
    duration = f"{seconds}.{nanos // 10**(9 - digits):0{digits}d}" if digits else str(seconds)
    return (first.file_type, first.encapsulation, str(first.packets + second.packets), duration, start_text,
            end_text)
