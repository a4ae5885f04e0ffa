"""Where indexes live: `<state>/index/<sha256>-<decoding>/` (frames/*.parquet, meta.json), a disk budget.

Keyed by the file's content (sha256) and how it is decoded, not by its path: a capture copied or
renamed keeps its index, one rewritten in place gets a new one. The least recently used indexes go
when the budget is exceeded (used = meta.json's mtime, touched on every answer).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors._paths import replace_whole
from diagd.actors.pcap.index.build import LOCK_FILE, META_FILE, PARTIAL
from diagd.actors.pcap.index.schema import SCHEMA_VERSION
from diagd.actors.pcap.index.tables import FRAMES_DIR


def tshark_identity() -> str:
    """This machine's tshark as a file version (path, size, mtime): an upgrade of Wireshark replaces it.
    Read in microseconds, where its version text needs a tshark start (a restart's first answer waits for it)."""
    found = shutil.which("tshark")
    if found is None:
        return "no tshark"
    real = os.path.realpath(found)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def decoding_digest(decode_as: Sequence[str], preferences: Sequence[tuple[str, str]], tshark: str) -> str:
    """What changes the rows besides the file: decode-as rules, preferences, tshark (tshark_identity), the schema."""
    text = json.dumps([list(decode_as), [list(p) for p in preferences], tshark, SCHEMA_VERSION])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


NAME = re.compile(r"^[0-9a-f]{64}-[0-9a-f]{12}$")  # <sha256>-<decoding>: the only names an index has


@dataclass(frozen=True)
class Stored:
    """One index on disk."""

    path: Path
    meta: dict[str, Any]

    @property
    def bytes(self) -> int:
        return int(self.meta.get("bytes", 0))

    @property
    def capture(self) -> str | None:
        """The file the index was built from (tshark's `-r`; it may have moved since: the index is
        found by content)."""
        argv = [str(a) for a in self.meta.get("tshark_argv") or []]
        return argv[argv.index("-r") + 1] if "-r" in argv[:-1] else None

    def disk_bytes(self) -> int:
        """What its folder takes now: the build's files and what answers kept beside them (NGAP PDUs)."""
        total = 0
        for folder, _, files in os.walk(self.path):  # the frames table's files are in a folder of their own
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(folder, name)).st_size
        return total

    def describe(self) -> dict[str, Any]:
        try:
            used = (self.path / META_FILE).stat().st_mtime
        except OSError:  # evicted meanwhile: said, not raised into diagd status
            return {"index": self.path.name, "gone": True}
        built_at = float(self.meta.get("built_at", 0))
        return {"index": self.path.name, "frames": self.meta.get("frames"), "bytes": self.bytes,
                "built_at": built_at, "age_s": round(time.time() - built_at),
                "last_used_s_ago": round(time.time() - used), "build_s": self.meta.get("build_s")}


class IndexStore:
    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = root
        self.budget_bytes = budget_bytes

    def path_for(self, sha256: str, decoding: str) -> Path:
        return self.root / f"{sha256}-{decoding}"

    def ready(self, path: Path) -> Stored | None:
        """The index at `path` if it was built whole with this schema (else None: build it)."""
        try:
            meta = json.loads((path / META_FILE).read_text())
        except (OSError, ValueError):
            return None
        if meta.get("schema_version") != SCHEMA_VERSION or not (path / FRAMES_DIR).is_dir():
            return None
        return Stored(path, meta)

    # A file version (device, inode, size, mtime: wireshark.file_identity) -> its index, so that a
    # restarted daemon finds a big capture's index without hashing the whole file first (seconds a GB).
    def _identity_file(self, identity: str, decoding: str) -> Path:
        name = hashlib.sha256(f"{identity}|{decoding}".encode()).hexdigest()[:24]
        return self.root / "identities" / name

    def by_identity(self, identity: str, decoding: str) -> Path | None:
        """The index recorded for this file version and decoding, if it is still there whole."""
        try:
            name = self._identity_file(identity, decoding).read_text().strip()
        except OSError:
            return None
        path = self.root / name
        return path if NAME.match(name) and self.ready(path) is not None else None

    def remember(self, identity: str, decoding: str, path: Path) -> None:
        target = self._identity_file(identity, decoding)
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_whole(target, path.name.encode())

    def touch(self, path: Path) -> None:
        try:
            os.utime(path / META_FILE)
        except OSError:
            pass

    def listing(self) -> list[Stored]:
        found = []
        if self.root.is_dir():
            for entry in sorted(self.root.iterdir()):
                if entry.is_dir() and NAME.match(entry.name) and (stored := self.ready(entry)):
                    found.append(stored)
        return found

    def evict(self, keep: Path, in_use: frozenset[Path] = frozenset()) -> list[str]:
        """Remove least recently used indexes (never `keep`, nor one a running actor answers from) until
        the rest fit the budget; their names. Stale partial builds go first (sweep)."""
        self.sweep()

        def used(stored: Stored) -> float:
            try:
                return (stored.path / META_FILE).stat().st_mtime
            except OSError:
                return 0.0

        stored = sorted(self.listing(), key=used)
        sizes = {s.path: s.disk_bytes() for s in stored}  # with what answers kept beside the build's files
        total = sum(sizes.values())
        gone = []
        for old in stored:
            if total <= self.budget_bytes:
                break
            if old.path == keep or old.path in in_use:
                continue
            shutil.rmtree(old.path, ignore_errors=True)
            total -= sizes[old.path]
            gone.append(old.path.name)
        return gone

    def sweep(self) -> list[str]:
        """Remove the folders of builds that ended without finishing (their builder killed with its
        process group on a stop): those whose lock nobody holds. Their names."""
        gone: list[str] = []
        if not self.root.is_dir():
            return gone
        for entry in self.root.iterdir():
            if PARTIAL not in entry.name or not entry.is_dir():
                continue
            try:
                with open(entry / LOCK_FILE, "rb") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a build runs there
            except BlockingIOError:
                continue
            except FileNotFoundError:
                # A build that has not locked it yet, or has just finished: only an old one is a leftover.
                if time.time() - _mtime(entry) < 60:
                    continue
            except OSError:
                continue
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry.name)
        return gone


def _mtime(path: Path) -> float:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime
    return 0.0
