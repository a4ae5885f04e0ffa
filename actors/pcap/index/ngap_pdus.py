"""The NGAP PDUs of an indexed capture, read without loading it: the one NGAP model (ngap/model.py) of a
capture of any size, and again after a restart in a fraction of a second.

sharkd dissects a capture cut from the file (narrow.py) holding only the frames NGAP's dissection
depends on: every SCTP frame (the associations and their numbering, DATA chunks reassembled across
frames) and every frame between the IP ends of one (fragments of an IP packet carrying SCTP), as
query.sctp_records chooses them. Each NGAP frame's tree is read as answers.ngap_pdus reads it from a
loaded capture (pdus_in_frame), under the frame's number in the whole capture; times are Unix times,
the same in the cut. A check on the way: the cut's NGAP frames must be as many as the index's (a frame
whose reassembly missed a piece would not be NGAP there); any difference, and the answer comes from the
whole capture instead (Unanswered, with why).

The PDUs are stored beside the index (PDUS_FILE, pickled: a file of the daemon's own state directory,
like the field catalogue's cache), keyed by the decoding and by this code's own source, so a changed
reader never reads an old file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import trio

from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import filters, narrow, query
from diagd.actors.pcap.index.build import LOCK_FILE, PARTIAL
from diagd.actors.pcap.ngap import NgapPdu
from diagd.actors.pcap.ngap.pdus import FRAMES_FILTER
from diagd.actors.pcap.shark.sharkd import Sharkd, SharkdError
from diagd.actors.pcap.shark.wireshark import write_sharkd_config

PDUS_FILE = "ngap-pdus-{}.pickle"
VIEW_FILE = "ngap-{}-{}.json"  # a view of the whole capture's model (ue_sessions, pdu_sessions), per decoding
TREE_BATCH = 100  # trees asked of sharkd per pipelined batch (as answers.TREE_BATCH)


class Unanswered(Exception):
    """Why the NGAP model of this capture is not read from its index (the whole capture answers)."""


@dataclass(frozen=True)
class Decoding:
    """How the NGAP frames are decoded: the call's decode-as entries (Wireshark's config lines) and
    preferences (the ngap_* tools' own: association numbering, NAS after NEA0)."""

    decode_as_entries: tuple[str, ...]
    preferences: tuple[tuple[str, str], ...]

    def digest(self) -> str:
        text = json.dumps([list(self.decode_as_entries), [list(p) for p in self.preferences], READER_DIGEST])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reader_digest() -> str:
    """The source of the code that turns trees into PDUs (ngap/ and shark/tree.py): a stored file of
    another version is read again from the capture."""
    sources = sorted(Path(ngap.__file__).parent.glob("*.py"))
    sources.append(Path(ngap.__file__).parents[1] / "shark" / "tree.py")
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()


READER_DIGEST = _reader_digest()


async def pdus(capture: Path, index: Path, frames: int, decoding: Decoding) -> list[NgapPdu]:
    """The capture's NGAP PDUs in frame order: stored beside the index, or read now and stored."""
    stored = index / PDUS_FILE.format(decoding.digest())
    found = await trio.to_thread.run_sync(_load, stored)
    if found is not None:
        return found
    where = filters.to_sql(FRAMES_FILTER)
    assert where is not None
    expected = await trio.to_thread.run_sync(query.count, index, where)
    read: list[NgapPdu] = []
    if expected:
        read = await _read(capture, index, frames, decoding, expected)
    await trio.to_thread.run_sync(_store, stored, read)
    return read


async def _read(capture: Path, index: Path, frames: int, decoding: Decoding, expected: int) -> list[NgapPdu]:
    records = await trio.to_thread.run_sync(query.sctp_records, index)
    work, lock = await trio.to_thread.run_sync(_workspace, index)
    try:
        cut = work / ("cut" + capture.suffix)
        try:
            await trio.to_thread.run_sync(narrow.cut, capture, [off for _, off in records], frames, cut)
        except narrow.Uncuttable as exc:
            raise Unanswered(str(exc)) from None
        config = work / "config"
        config.mkdir()
        write_sharkd_config(config, decoding.decode_as_entries)
        numbers = [number for number, _ in records]
        async with trio.open_nursery() as nursery:
            sharkd = await Sharkd.start(nursery, config)
            try:
                return await _dissect(sharkd, cut, numbers, decoding, expected)
            finally:
                await sharkd.close()
    finally:
        await trio.to_thread.run_sync(lambda: shutil.rmtree(work, ignore_errors=True))
        lock.close()


async def _dissect(sharkd: Sharkd, cut: Path, numbers: list[int], decoding: Decoding, expected: int
                   ) -> list[NgapPdu]:
    try:
        # Preferences before the load: association numbering happens in the first pass (pool.py).
        for name, value in decoding.preferences:
            await sharkd.call("setconf", {"name": name, "value": value})
        loaded, complaint = await sharkd.load(str(cut))
        if loaded != len(numbers):
            raise Unanswered(f"sharkd read {loaded} of the {len(numbers)} frames cut ({complaint})")
        rows = await sharkd.call("frames", {"filter": FRAMES_FILTER, "column0": "frame.number:0"})
    except SharkdError as exc:
        raise Unanswered(f"sharkd on the cut capture: {exc.message}") from None
    found = [int(row["num"]) for row in rows]
    if len(found) != expected:
        raise Unanswered(f"{len(found)} NGAP frames in the cut capture, {expected} in the whole one: a frame "
                         "NGAP's dissection depends on was not cut")
    read: list[NgapPdu] = []
    for start in range(0, len(found), TREE_BATCH):
        batch = found[start:start + TREE_BATCH]
        answers = await sharkd.call_many("frame", [{"frame": n, "proto": True} for n in batch])
        for number, answer in zip(batch, answers, strict=True):
            if isinstance(answer, SharkdError):
                raise Unanswered(f"sharkd on frame {numbers[number - 1]}: {answer.message}")
            read.extend(ngap.pdus_in_frame(numbers[number - 1], answer["tree"]))
    return read


def stored_view(index: Path, decoding: Decoding, view: str) -> dict[str, Any] | None:
    """A view of the whole capture's NGAP model rendered before (store_view), or None (blocking)."""
    try:
        found = json.loads((index / VIEW_FILE.format(view, decoding.digest())).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def store_view(index: Path, decoding: Decoding, view: str, answer: dict[str, Any]) -> None:
    """Keep a view of the whole capture's NGAP model beside the index, as JSON (what the tool answers)."""
    _replace(index / VIEW_FILE.format(view, decoding.digest()), json.dumps(answer).encode())


def _workspace(index: Path) -> tuple[Path, BinaryIO]:
    """A folder of this reading's own beside the index, locked while in use: removed at its end, or by
    IndexStore.sweep after a daemon killed meanwhile (a partial folder nobody holds the lock of)."""
    work = Path(tempfile.mkdtemp(dir=index.parent, prefix=index.name + PARTIAL))
    lock = open(work / LOCK_FILE, "wb")  # noqa: SIM115 - held while the folder is in use
    fcntl.flock(lock, fcntl.LOCK_EX)
    return work, lock


def _load(path: Path) -> list[NgapPdu] | None:
    try:
        with open(path, "rb") as f:
            found = pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None
    return found if isinstance(found, list) else None


def _store(path: Path, read: list[NgapPdu]) -> None:
    _replace(path, pickle.dumps(read, protocol=pickle.HIGHEST_PROTOCOL))


def _replace(path: Path, data: bytes) -> None:
    """Written whole or not at all (a new file renamed over); an index evicted meanwhile keeps none."""
    with contextlib.suppress(OSError):
        fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(partial, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)
