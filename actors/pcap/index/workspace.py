"""A cut of a capture (narrow.py) in a folder of one reading's own beside the capture's index, and tshark
over it under a memory bound the kernel holds: what the NGAP reading (ngap_pdus.py), the PFCP and SBI rows
(core_rows.py) and a narrowed filter (narrowing.py) read. Apart from narrow.py, which the build imports
(its folder names are the build's)."""

from __future__ import annotations

import fcntl
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import trio

from diagd.actors._subprocess import Head, head
from diagd.actors.pcap.index import narrow
from diagd.actors.pcap.index.build import LOCK_FILE, PARTIAL
from diagd.protocol.errors import DiagdError, ErrorCode

# The address space tshark may take reading a cut (prlimit: the kernel stops it there): its two-pass
# memory grows with the frames cut (0.85 to 2.8 bytes a byte of capture), so that a big cut (a million DNS
# frames of 10 GB: 1.6 GB) fails at the bound and the loaded capture answers, the daemon and its children
# staying under their 1.5 GB.
CUT_MAX_AS = 1280 * 2**20
# How long tshark may read a cut: a minute, and a second per 5,000 frames cut (eight times slower than its
# two-pass reading here, ~40,000 frames a second). Past it (a dissector looping on a crafted packet), the
# reading ends and the loaded capture answers: never a daemon-wide cut limiter held for good.
CUT_BASE_S = 60.0
CUT_FRAMES_PER_S = 5_000
# How tshark says it met the bound when no signal stopped it: the loader failing to map a library (a bound
# below what tshark needs to start at all), or a failed allocation reported before an exit.
_OUT_OF_MEMORY = re.compile(r"failed to allocate|failed to map segment|Cannot allocate memory")


@asynccontextmanager
async def cut_beside(capture: Path, index: Path, offsets: Sequence[int], frames: int) -> AsyncIterator[Path]:
    """The records at `offsets` cut from `capture` (of `frames` records; its index at `index`) into a folder
    of this reading's own beside the index, locked while in use and removed at the end, even when cancelled
    (the cut is as big as the frames chosen), or by IndexStore.sweep after a daemon killed meanwhile (a
    partial folder nobody holds the lock of). Raises Uncuttable."""
    work, lock = await trio.to_thread.run_sync(_workspace, index)
    try:
        out = work / ("cut" + capture.suffix)
        await trio.to_thread.run_sync(narrow.cut, capture, offsets, frames, out)
        yield out
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(lambda: shutil.rmtree(work, ignore_errors=True))
            finally:
                lock.close()


def _workspace(index: Path) -> tuple[Path, BinaryIO]:
    work = Path(tempfile.mkdtemp(dir=index.parent, prefix=index.name + PARTIAL))
    lock = open(work / LOCK_FILE, "wb")  # noqa: SIM115 - held while the folder is in use
    fcntl.flock(lock, fcntl.LOCK_EX)
    return work, lock


def reading(argv: list[str], cut: Path) -> list[str]:
    """A capture's own tshark command (`-r` its file, its decoding), reading the cut instead."""
    at = argv.index("-r") + 1
    return [*argv[:at], str(cut), *argv[at + 1:]]


async def bounded_head(argv: list[str], frames: int, purpose: str, limit: int | None, *, max_line: int,
                       on_line: Callable[[str], None]) -> Head:
    """`head` of a tshark command over a cut of `frames` frames, its address space bounded by the kernel
    (prlimit, CUT_MAX_AS) and its time by CUT_BASE_S and CUT_FRAMES_PER_S. A command stopped by a bound
    (a signal when an allocation fails, an allocation failure it reports, the time) or no prlimit to bound
    it: NOT_FOUND with `index_unanswered`, naming the `purpose` ("narrow this filter"): the loaded capture
    answers instead. Any other failure is the caller's to read (a refused filter)."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise DiagdError(ErrorCode.NOT_FOUND, f"the index cannot {purpose}: prlimit (util-linux) is not installed "
                                              "to bound tshark's memory", index_unanswered=True)
    allowed_s = CUT_BASE_S + frames / CUT_FRAMES_PER_S
    with trio.move_on_after(allowed_s) as bound:
        done = await head([prlimit, f"--as={CUT_MAX_AS}", "--", *argv], limit, max_line=max_line, on_line=on_line)
    if bound.cancelled_caught:
        raise DiagdError(ErrorCode.NOT_FOUND, f"the index cannot {purpose}: tshark over the {frames} frames cut "
                         f"took longer than {allowed_s:.0f} s", index_unanswered=True)
    code = done.returncode or 0
    if not done.stopped and (code < 0 or code >= 128 or (code and _OUT_OF_MEMORY.search(done.stderr))):
        # Stopped by a signal (an abort or a fault when an allocation fails at the bound) or out of memory.
        raise DiagdError(ErrorCode.NOT_FOUND, f"the index cannot {purpose}: tshark over the {frames} frames cut "
                         f"stopped ({code}), as when it needs more than {CUT_MAX_AS >> 20} MB",
                         index_unanswered=True)
    return done
