"""The NGAP PDUs of an indexed capture, read without loading it: the one NGAP model (ngap/model.py) of a
capture of any size, and again after a restart in a fraction of a second.

sharkd dissects a capture cut from the file (narrow.py) holding only the frames NGAP's dissection
depends on: every SCTP frame (the associations and their numbering, DATA chunks reassembled across
frames) and every frame between the IP ends of one (fragments of an IP packet carrying SCTP), as
query.records_carrying chooses them. Each NGAP frame's tree is read as answers.ngap_pdus reads it from a
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
import hashlib
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from diagd.actors._paths import replace_whole
from diagd.actors.pcap import ngap
from diagd.actors.pcap.index import filters, narrow, query, workspace
from diagd.actors.pcap.ngap import NgapPdu
from diagd.actors.pcap.ngap.pdus import FRAMES_FILTER
from diagd.actors.pcap.shark.sharkd import Sharkd, SharkdError
from diagd.actors.pcap.shark.wireshark import write_sharkd_config

# Beside the index, named by the reader's version (READER) and the decoding (Decoding.digest).
PDUS_FILE = "ngap-pdus-{}-{}.pickle"
VIEW_FILE = "ngap-{}-{}-{}.json"  # a view of the whole capture's model (ue_sessions, pdu_sessions)
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
        text = json.dumps([list(self.decode_as_entries), [list(p) for p in self.preferences]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _reader_digest() -> str:
    """The source of the code that chooses, cuts and reads the frames and turns trees into PDUs (ngap/,
    index/, shark/'s tree, sharkd and record walk modules): what another version stored is read again."""
    package = Path(ngap.__file__).parents[1]
    sources = sorted([*(package / "ngap").glob("*.py"), *(package / "index").glob("*.py"),
                      *(package / "shark" / name for name in ("tree.py", "sharkd.py", "wireshark.py",
                                                              "recordwalk.py", "_recordwalk.c"))])
    return hashlib.sha256(b"".join(p.read_bytes() for p in sources if p.exists())).hexdigest()[:12]


READER = _reader_digest()


async def pdus(capture: Path, index: Path, frames: int, decoding: Decoding) -> list[NgapPdu]:
    """The capture's NGAP PDUs in frame order: stored beside the index, or read now and stored."""
    stored = index / PDUS_FILE.format(READER, decoding.digest())
    found = await trio.to_thread.run_sync(_load, stored)
    if found is not None:
        return found
    ngap_frames = await trio.to_thread.run_sync(_numbers, index, FRAMES_FILTER)
    read: list[NgapPdu] = []
    if ngap_frames:
        sctp_frames = await trio.to_thread.run_sync(_numbers, index, "sctp")
        read = await _read(capture, index, frames, decoding, {FRAMES_FILTER: ngap_frames, "sctp": sctp_frames})
    await trio.to_thread.run_sync(_store, stored, read)
    return read


def _numbers(index: Path, display_filter: str) -> list[int]:
    where = filters.to_sql(display_filter)
    assert where is not None
    return query.every_match(index, where)


async def _read(capture: Path, index: Path, frames: int, decoding: Decoding, expected: dict[str, list[int]]
                ) -> list[NgapPdu]:
    records = await trio.to_thread.run_sync(query.records_carrying, index, ("sctp",))
    try:
        async with workspace.cut_beside(capture, index, [off for _, off in records], frames) as cut:
            config = cut.parent / "config"
            config.mkdir()
            write_sharkd_config(config, decoding.decode_as_entries)
            numbers = [number for number, _ in records]
            async with trio.open_nursery() as nursery:
                sharkd = await Sharkd.start(nursery, config)
                try:
                    return await _dissect(sharkd, cut, numbers, decoding, expected)
                finally:
                    await sharkd.close()
    except narrow.Uncuttable as exc:
        raise Unanswered(str(exc)) from None


async def _dissect(sharkd: Sharkd, cut: Path, numbers: list[int], decoding: Decoding,
                   expected: dict[str, list[int]]) -> list[NgapPdu]:
    """The NGAP PDUs of the cut, numbered as in the whole capture, once the cut is shown to dissect as the
    whole did: its SCTP frames and its NGAP frames exactly the index's (a reassembly that missed a piece
    left out, a lower layer's fragment without an IP header, would change them)."""
    try:
        # Preferences before the load: association numbering happens in the first pass (pool.py).
        for name, value in decoding.preferences:
            await sharkd.call("setconf", {"name": name, "value": value})
        loaded, complaint = await sharkd.load(str(cut))
        if loaded != len(numbers):
            raise Unanswered(f"sharkd read {loaded} of the {len(numbers)} frames cut ({complaint})")
        found: dict[str, list[int]] = {}
        for display_filter, want in expected.items():
            rows = await sharkd.call("frames", {"filter": display_filter, "column0": "frame.number:0"})
            found[display_filter] = [numbers[int(row["num"]) - 1] for row in rows]
            if found[display_filter] != want:
                missed = sorted(set(want) ^ set(found[display_filter]))[:5]
                raise Unanswered(f"the cut capture's `{display_filter}` frames are not the whole capture's "
                                 f"(first differing: {', '.join(map(str, missed))}): a frame their dissection "
                                 "depends on was not cut")
    except SharkdError as exc:
        raise Unanswered(f"sharkd on the cut capture: {exc.message}") from None
    position = {number: at for at, number in enumerate(numbers, start=1)}
    read: list[NgapPdu] = []
    wanted = [position[n] for n in found[FRAMES_FILTER]]
    for start in range(0, len(wanted), TREE_BATCH):
        batch = wanted[start:start + TREE_BATCH]
        answers = await sharkd.call_many("frame", [{"frame": n, "proto": True} for n in batch])
        for number, answer in zip(batch, answers, strict=True):
            if isinstance(answer, SharkdError):
                raise Unanswered(f"sharkd on frame {numbers[number - 1]}: {answer.message}")
            read.extend(ngap.pdus_in_frame(numbers[number - 1], answer["tree"]))
    return read


def stored_view(index: Path, decoding: Decoding, view: str) -> dict[str, Any] | None:
    """A view of the whole capture's NGAP model rendered before (store_view), or None (blocking)."""
    try:
        found = json.loads((index / VIEW_FILE.format(view, READER, decoding.digest())).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def store_view(index: Path, decoding: Decoding, view: str, answer: dict[str, Any]) -> None:
    """Keep a view of the whole capture's NGAP model beside the index, as JSON (what the tool answers)."""
    _drop_stale(index)
    _replace(index / VIEW_FILE.format(view, READER, decoding.digest()), json.dumps(answer).encode())


def _load(path: Path) -> list[NgapPdu] | None:
    """The PDUs stored at `path`, or None: none stored, or a file that does not read (cut short, written
    by another Python), which is removed to be written again."""
    try:
        with open(path, "rb") as f:
            found = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # whatever a damaged file raises, it is read again from the capture
        path.unlink(missing_ok=True)
        return None
    return found if isinstance(found, list) else None


def _store(path: Path, read: list[NgapPdu]) -> None:
    _drop_stale(path.parent)
    _replace(path, pickle.dumps(read, protocol=pickle.HIGHEST_PROTOCOL))


def _drop_stale(index: Path) -> None:
    """Remove what another version of the reader kept beside the index (its name holds another READER)."""
    for old in index.glob("ngap-*-*-*"):
        if old.name.split("-")[2] != READER:
            old.unlink(missing_ok=True)


def _replace(path: Path, data: bytes) -> None:
    """Written whole or not at all; an index evicted meanwhile keeps none."""
    with contextlib.suppress(OSError):
        replace_whole(path, data)
