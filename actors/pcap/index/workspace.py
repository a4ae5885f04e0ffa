"""A cut of a capture (narrow.py) in a folder of one reading's own beside the capture's index: what the
NGAP reading (ngap_pdus.py) and a narrowed filter (narrowing.py) read with sharkd or tshark. Apart from
narrow.py, which the build imports (its folder names are the build's)."""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import BinaryIO

import trio

from diagd.actors.pcap.index import narrow
from diagd.actors.pcap.index.build import LOCK_FILE, PARTIAL


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
