"""A capture of chosen frames cut from the file: the file's own header, then the chosen records copied
byte for byte, in order. Wireshark dissects each chosen frame as it did in the whole file when every
frame its dissection depends on is chosen too (the caller's rule: query.records_carrying).

Cut only from a file whose records are all packets read alone (recordwalk.walk follows it to its end):
a plain pcap, or a pcapng of one section whose interfaces (of any time resolution or offset: the times
are copied, never read) are all described before the first packet,
with nothing between packets but name resolution and statistics blocks (which change no dissection:
diagd reads captures with `-n`). A decryption secrets block, a late interface or a second section
would be lost in the cut: such a file is not cut (Uncuttable, with why), and the caller reads it whole.
Blocking: a worker thread's.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Sequence
from pathlib import Path

from diagd.actors.pcap.shark import recordwalk

MAX_RECORD = 1 << 20  # longer than any record the walk follows (recordwalk: 256 KiB of packet)


class Uncuttable(Exception):
    """Why frames cannot be cut from this file (its answer then comes from the whole capture)."""


def cut(capture: Path, offsets: Sequence[int], frames: int, out: Path) -> int:
    """Write the records starting at `offsets` (ascending, as the index's file_off gives them) into the
    new file `out`, behind the capture's header; the capture must hold exactly `frames` records (the
    index's count: the index is of this very file). Returns the bytes written."""
    if not recordwalk.available():
        raise Uncuttable("diagd was installed without its C record walker")
    found = recordwalk.read_layout(capture, any_ticks=True)  # the times are copied, never read
    if found is None:
        raise Uncuttable("the file is neither a plain pcap nor a pcapng of one section whose interfaces are "
                         "described before its first packet")
    walked = recordwalk.walk(capture, found)
    if walked is None:
        raise Uncuttable("the file holds blocks between its packets that a cut would lose (decryption secrets, "
                         "a late interface, a second section) or records the walk does not follow")
    if walked.packets != frames:
        raise Uncuttable(f"the file holds {walked.packets} records, its index {frames} frames: it changed")
    order = ">" if found.big_endian else "<"
    written = len(found.header)
    fd = os.open(capture, os.O_RDONLY)
    try:
        with open(out, "xb") as sink:
            sink.write(found.header)
            last = -1
            for offset in offsets:
                if offset <= last or offset < found.start:
                    raise Uncuttable(f"record offset {offset} is not after the last ({last}) and the header")
                last = offset
                record = read_record(fd, offset, found.pcapng, order)
                sink.write(record)
                written += len(record)
    except BaseException:
        out.unlink(missing_ok=True)  # never half a capture
        raise
    finally:
        os.close(fd)
    return written


def read_record(fd: int, offset: int, pcapng: bool, order: str) -> bytes:
    """The whole record at `offset`: a pcap record header and its bytes, or a pcapng block."""
    head = os.pread(fd, 16, offset)
    if len(head) < 16:
        raise Uncuttable(f"no record at offset {offset}: the file is shorter")
    if pcapng:
        kind, length = struct.unpack_from(order + "II", head)
        if kind != 6:
            raise Uncuttable(f"the block at offset {offset} is not an enhanced packet block (type {kind})")
    else:
        length = 16 + struct.unpack_from(order + "I", head, 8)[0]
    if length > MAX_RECORD:  # the walk read no such record: the offset is not one of this file's records
        raise Uncuttable(f"no record of at most {MAX_RECORD} bytes at offset {offset}")
    record = os.pread(fd, length, offset)
    if len(record) != length:
        raise Uncuttable(f"the record at offset {offset} is cut short")
    return record


def write_chunk(capture: Path, found: recordwalk.Layout, chunk: recordwalk.Chunk, replayed: Sequence[int],
                out: Path) -> None:
    """A file of the run of records `chunk` (recordwalk.chunks) behind the capture's header, and before
    them the records at the offsets `replayed` (a chunked build's: the capture's first packet, for the
    relative times, and the frames that set up conversations: index/stitch.py). Copied byte for byte."""
    fd = os.open(capture, os.O_RDONLY)
    try:
        with open(out, "xb") as sink:
            sink.write(found.header)
            for offset in replayed:
                sink.write(read_record(fd, offset, found.pcapng, ">" if found.big_endian else "<"))
            sink.flush()
            _copy_range(fd, sink.fileno(), chunk.start, chunk.end)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


COPY_BLOCK = 1 << 20


def _copy_range(source: int, sink: int, start: int, end: int) -> None:
    """Bytes [start, end) of `source` appended to `sink`: in the kernel where it can (copy_file_range),
    else read and written (another file system: EXDEV since Linux 5.19; tmpfs, NFS)."""
    at = start
    try:
        while at < end:
            copied = os.copy_file_range(source, sink, end - at, at)
            if copied == 0:
                raise Uncuttable(f"the file ends before offset {end}: it changed")
            at += copied
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
            raise
    while at < end:
        block = os.pread(source, min(COPY_BLOCK, end - at), at)
        if not block:
            raise Uncuttable(f"the file ends before offset {end}: it changed")
        os.write(sink, block)
        at += len(block)
