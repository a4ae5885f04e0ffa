"""A capture as one file the pcap tools read (`capture:<id>`, the back end's declared reference): its
packets written so far while it runs, the whole ring once it has ended.

A running capture's current file grows under dumpcap: the view copies its complete pcapng blocks (a
block whose trailing length is on disk) into `<capture dir>/views/`, so every tool of one call sees the
same frames, up to the last one written, never half a block. A ring of several files is one file
through `mergecap -a` (concatenated in ring order: the files follow each other in time). A finished
capture of one file is that file itself. Views are named by what they hold (the ring's file names and
the bytes copied), so an unchanged capture gives the same view (its loaded worker is reused); the
newest VIEWS_KEPT of a capture stay (counted by the disk budget, removed with the capture's files).
`capture:<recording id>` is the capture of a recording (recording.py).
"""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import trio

from diagd.actors import statefile, system
from diagd.actors._paths import create_new
from diagd.actors._subprocess import run
from diagd.actors.capture.record import Capture
from diagd.actors.capture.recording import RECORDING_ID, RecordingStore, not_found
from diagd.actors.runtime import Resolved
from diagd.actors.tooling import current_call, current_groups
from diagd.protocol.errors import DiagdError, ErrorCode

SECTION_HEADER = 0x0A0D0D0A
PACKET_BLOCKS = (0x00000002, 0x00000003, 0x00000006)  # packet (obsolete), simple packet, enhanced packet
VIEWS_KEPT = 3
MERGE_TIMEOUT_S = 300.0
COPY_CHUNK = 1 << 20


def complete_prefix(f: BinaryIO, size: int) -> tuple[int, int]:
    """(bytes, packets) of the complete pcapng blocks at the start of `f` (of `size` bytes now)."""
    order, offset, packets = "<", 0, 0
    while offset + 12 <= size:
        f.seek(offset)
        head = f.read(12)
        if len(head) < 12:
            break
        if struct.unpack("<I", head[:4])[0] == SECTION_HEADER:
            order = "<" if head[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
        block_type, length = struct.unpack(order + "II", head[:8])
        if length < 12 or length % 4 or offset + length > size:
            break
        f.seek(offset + length - 4)
        if f.read(4) != head[4:8]:  # its trailing length is not written yet (or the file is no pcapng)
            break
        packets += block_type in PACKET_BLOCKS
        offset += length
    return offset, packets


def _copy_prefix(source: Path, views: Path) -> tuple[Path, int]:
    """A view of the complete blocks of the growing `source` (blocking): its path and packets."""
    with open(statefile.open_file(source, os.O_RDONLY), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        length, packets = complete_prefix(f, size)
        if length == 0:
            raise DiagdError(ErrorCode.NOT_FOUND, f"{source.name} holds no complete pcapng block yet",
                             hint="dumpcap has just opened it: ask again in a moment")
        target = views / f"{source.stem}-upto-{length}.pcapng"
        if target.exists():
            return target, packets
        tmp = views / f".{target.name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        with os.fdopen(create_new(tmp), "wb") as out:
            f.seek(0)
            left = length
            while left:
                chunk = f.read(min(COPY_CHUNK, left))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
        os.replace(tmp, target)
        return target, packets


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _fresh(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.close(create_new(path))


def _prune(views: Path, keep: set[Path]) -> None:
    """Keep the newest VIEWS_KEPT views (and `keep`): a view a call has just resolved stays readable."""
    found = sorted((p for p in views.glob("*.pcapng")), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[VIEWS_KEPT:]:
        if old not in keep:
            old.unlink(missing_ok=True)


class Captures(Protocol):
    """What views need of the back end (backend.CaptureBackend): a capture's record by id, whether a client
    is still connected (who sees a recording)."""

    async def capture(self, capture_id: str) -> Capture: ...

    def owner_connected(self, owner: str | None) -> bool: ...

    async def make_room(self, size: int, what: str, *, keep: str) -> None: ...


class Views:
    """The views of every capture (one lock per capture: two calls make one view, not two)."""

    def __init__(self, captures: Captures, recordings: RecordingStore) -> None:
        self._captures = captures
        self._recordings = recordings
        self._locks: dict[str, trio.Lock] = {}

    async def resolve(self, ident: str) -> Resolved:
        """`capture:<capture id>`, or `capture:<recording id>` (that recording's capture, for a client that may
        see the recording: recording.py; else NOT_FOUND, as for an id never made)."""
        if RECORDING_ID.fullmatch(ident):
            rec = await trio.to_thread.run_sync(self._recordings.load, ident)
            ctx, connected = current_call.get(), self._captures.owner_connected(rec.owner)
            if ctx is None or not rec.visible_to(ctx.client, current_groups.get(), connected):
                raise not_found(ident)
            if rec.capture_id is None:
                raise DiagdError(ErrorCode.NOT_FOUND, f"recording {ident} has no capture", recording_id=ident)
            ident = rec.capture_id
        cap = await self._captures.capture(ident)
        lock = self._locks.setdefault(cap.id, trio.Lock())
        async with lock:
            return await self._resolve(cap)

    async def _resolve(self, cap: Capture) -> Resolved:
        if cap.evicted:
            raise DiagdError(ErrorCode.NOT_FOUND, f"the files of capture {cap.id} were removed for the disk budget",
                             capture_id=cap.id, hint="[capture] max_bytes: the oldest finished captures go first")
        running = cap.running
        files = [Path(p) for p in cap.files]
        if not files:
            raise DiagdError(ErrorCode.NOT_FOUND, f"capture {cap.id} has no file on disk", capture_id=cap.id)
        views = Path(cap.dir) / "views"
        if running:
            # A copy of the last file's complete blocks, and (below) a merge of the ring: both counted by
            # the disk budget, and made only when they fit.
            await self._captures.make_room(_size(files[-1]), f"a view of running capture {cap.id}", keep=cap.id)
            await trio.to_thread.run_sync(lambda: statefile.ensure_dir(views))
            current, packets = await trio.to_thread.run_sync(_copy_prefix, files[-1], views)
            parts = [*files[:-1], current]
        else:
            parts, packets = files, None
        path = parts[0] if len(parts) == 1 else await self._merge(cap, parts, views)
        keep = {path, *parts}
        if views.is_dir():
            await trio.to_thread.run_sync(_prune, views, keep)
        about: dict[str, Any] = {"capture_id": cap.id, "status": cap.status, "running": running,
                                 "ring_files": [str(p) for p in files], "interfaces": cap.interfaces}
        if running:
            about["last_file_packets"] = packets
        return Resolved(str(path), about)

    async def _merge(self, cap: Capture, parts: list[Path], views: Path) -> Path:
        """The ring's files as one (mergecap -a: in ring order), made once per content."""
        await trio.to_thread.run_sync(lambda: statefile.ensure_dir(views))
        sizes = [p.stat().st_size for p in parts]
        digest = hashlib.sha1(repr([(p.name, s) for p, s in zip(parts, sizes, strict=True)]).encode()).hexdigest()
        target = views / f"{cap.id}-ring-{digest[:12]}.pcapng"
        if target.exists():
            return target
        await self._captures.make_room(sum(sizes), f"the merged ring of capture {cap.id}", keep=cap.id)
        tmp = views / f".{target.name}.tmp"
        # Made here (never through a link, never over a file); mergecap then writes this regular file.
        await trio.to_thread.run_sync(_fresh, tmp)
        done = await run(["mergecap", "-a", "-F", "pcapng", "-w", str(tmp), *map(str, parts)],
                         timeout_s=MERGE_TIMEOUT_S, fix=system.APT_HINT.format(pkg="wireshark-common"))
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"mergecap could not merge the ring of {cap.id}: "
                             f"{done.stderr.strip()[:500]}", capture_id=cap.id)
        os.replace(tmp, target)
        return target
