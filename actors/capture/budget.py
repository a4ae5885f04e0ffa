"""The disk budget made a bound dumpcap itself keeps: each capture gets a share of `[capture] max_bytes`
before it starts, and its dumpcap arguments are derived from that share, so its files can never pass it.

The budget used to be checked after the fact (every second, and at the next start): a fast capture
wrote 95 MB on disk for a 32 MiB budget before it was stopped. Now, at start:
- the room is the budget less every capture's files and views and the unfilled reservations of the
  running ones (`room`);
- a capture reserves its share (`plan`): what its stop condition (`bytes`) or its ring (file size x
  files) needs, else the room divided among the captures that may still start (max_concurrent less
  the running ones); a ring or byte limit that needs more than the room is refused with what is free;
- dumpcap is told the bound: for a ring, its file size and count (`-b filesize`, `-b files`: when it is
  full dumpcap deletes its oldest file and goes on, so the newest traffic is kept); for one file,
  `-a filesize` (dumpcap stops by itself: at the `bytes` asked, else at the share, saying disk_budget).
  A file can pass its size by one packet and the pcapng blocks around it: `file_margin` per file is
  kept for that.
Views of a running or ringed capture (copies for the pcap tools) are made only when they fit too
(`views.Views` asks the backend for the room first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagd.protocol.errors import DiagdError, ErrorCode

BLOCK_MARGIN = 16 * 1024  # section and interface headers, the statistics blocks at the end of a file
DEFAULT_RING_FILES = 4  # a ring given no file count (or no ring at all) keeps this many files
MIN_FILE_KB = 64  # dumpcap's smallest sensible file (it checks the size once per packet written)


def file_margin(snaplen: int) -> int:
    """How far one file may pass its size: the packet that crossed it, and the blocks around."""
    return snaplen + BLOCK_MARGIN


@dataclass(frozen=True)
class Plan:
    """What a capture may write and the dumpcap arguments that hold it to that."""

    reserved_bytes: int  # its share of the budget, its files' bound (views aside)
    args: list[str]  # -b ... or -a filesize:...
    autostop_kb: int | None  # one file: dumpcap stops when it reaches this size (disk_budget)
    ring: dict[str, Any]  # the ring as run (the caller's values and the derived ones)


def plan(*, ring: dict[str, Any], stop_bytes: int | None, snaplen: int, room: int, share: int) -> Plan:
    """The capture's reservation and dumpcap's bound, or INVALID_ARGUMENT / BUSY saying what would fit."""
    margin = file_margin(snaplen)
    smallest = MIN_FILE_KB * 1024 + margin
    if room < smallest:
        raise DiagdError(ErrorCode.BUSY, f"the captures' disk budget has {max(room, 0)} bytes free, less than one "
                         f"file of {smallest} bytes", free_bytes=max(room, 0),
                         hint="stop a running capture, or raise [capture] max_bytes")
    size_kb, files = ring.get("file_size_kb"), ring.get("ring_files")
    if size_kb is not None and files is not None:
        need = files * (size_kb * 1024 + margin)
        _fits(need, room, f"a ring of {files} files of {size_kb} kB")
        return Plan(need, ["-b", f"filesize:{size_kb}", "-b", f"files:{files}", *_duration(ring)], None, dict(ring))
    want = min(share, room)
    if not ring:
        # One file (as dumpcap writes it without a ring: its statistics blocks at the end): dumpcap stops
        # by itself at the byte limit asked, else at the capture's share (the capture says disk_budget).
        if stop_bytes is not None:
            _fits(stop_bytes + margin, room, f"bytes = {stop_bytes}")
            autostop_kb = max(MIN_FILE_KB, -(-stop_bytes // 1024))
        else:
            autostop_kb = max(MIN_FILE_KB, (want - margin) // 1024)
        return Plan(autostop_kb * 1024 + margin, ["-a", f"filesize:{autostop_kb}"], autostop_kb, {})
    # A ring of the share: what is not given of size and count is derived from it. When the ring is
    # full dumpcap drops its oldest file and goes on, so the newest traffic is always kept.
    if size_kb is not None:
        _fits(size_kb * 1024 + margin, room, f"one file of {size_kb} kB")
        files = max(1, want // (size_kb * 1024 + margin))
    else:
        # Fewer files than the default when the share holds fewer of the smallest size.
        files = files or max(1, min(DEFAULT_RING_FILES, want // (MIN_FILE_KB * 1024 + margin)))
        size_kb = max(MIN_FILE_KB, (want // files - margin) // 1024)
        _fits(files * (size_kb * 1024 + margin), room, f"a ring of {files} files")
    derived = {**ring, "file_size_kb": size_kb, "ring_files": files}
    return Plan(files * (size_kb * 1024 + margin),
                ["-b", f"filesize:{size_kb}", "-b", f"files:{files}", *_duration(ring)], None, derived)


def wanted(*, ring: dict[str, Any], stop_bytes: int | None, snaplen: int, share: int) -> int:
    """What a capture would like free before it starts (finished captures are evicted for it): what its
    ring or byte limit needs, else an equal share of the budget."""
    margin = file_margin(snaplen)
    if ring.get("file_size_kb") is not None and ring.get("ring_files") is not None:
        return int(ring["ring_files"]) * (int(ring["file_size_kb"]) * 1024 + margin)
    if stop_bytes is not None and not ring:
        return stop_bytes + margin
    return share


def _duration(ring: dict[str, Any]) -> list[str]:
    seconds = ring.get("file_duration_s")
    return [] if seconds is None else ["-b", f"duration:{max(1, round(seconds))}"]


def _fits(need: int, room: int, what: str) -> None:
    if need > room:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what} needs up to {need} bytes on disk; the captures' disk "
                         f"budget has {room} free", needed_bytes=need, free_bytes=room,
                         hint="ask for fewer or smaller files (or a bytes limit), stop a capture, or raise "
                              "[capture] max_bytes")
