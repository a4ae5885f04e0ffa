"""One capture's record and its store: what it captures, its files and counters, how it ended;
persisted as `<state>/capture/captures/<id>.json`, its files under `<state>/capture/exports/<id>/`.

Only the capture's actor writes a live record (the tools read it); the store keeps finished ones
across daemon restarts. A capture that was running when the daemon stopped is `interrupted`: its
files and its counters as last saved (at most a second old) stay, the process does not.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from diagd.actors import statefile
from diagd.actors.capture.replies import CaptureSummary, Status
from diagd.protocol.errors import DiagdError, ErrorCode

CAPTURE_ID = re.compile(r"^cap-[0-9a-f]{8}$")
RUNNING = ("starting", "running")


@dataclass
class Capture:
    id: str
    owner: str
    interfaces: list[str]
    filter: str
    snaplen: int
    ring: dict[str, Any]  # files, file_size_kb, file_duration_s (those given)
    stop_on: dict[str, Any]  # duration_s, packets, bytes (those given)
    dir: str
    created_at: float = field(default_factory=time.time)
    status: Status = "starting"
    stop_reason: str | None = None  # duration, packets, bytes, requested, disk_budget, shutdown, exited, ...
    stopped_by: str | None = None
    error: str | None = None
    pid: int | None = None
    files: list[str] = field(default_factory=list)  # the ring's files, oldest first, as dumpcap opened them
    file_sizes: dict[str, int] = field(default_factory=dict)  # every file it wrote (the ring drops the oldest)
    packets: int = 0
    drops_kernel: dict[str, int] | None = None  # per interface, from dumpcap at the end
    interface_stats: dict[str, dict[str, int]] | None = None  # the last file's statistics blocks
    started_at: float | None = None
    ended_at: float | None = None
    evicted: bool = False  # its files were removed for the disk budget
    # diagd's own traffic, left out whatever `filter` says: the TCP ports of its HTTP listener (bearer
    # tokens), and the filter dumpcap runs with them ("" in a record made before: `filter` then)
    excluded_tcp_ports: list[int] = field(default_factory=list)
    applied_filter: str = ""
    # Its share of the disk budget, which dumpcap's own bound keeps it within (budget.py), and, for one
    # file, the size at which dumpcap stops by itself.
    reserved_bytes: int = 0
    autostop_kb: int | None = None

    def __post_init__(self) -> None:
        self._changed = trio.Event()

    @property
    def running(self) -> bool:
        return self.status in RUNNING

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def refresh_files(self) -> None:
        """The ring's files still on disk and the bytes of every file seen (blocking: small stat calls)."""
        present = []
        for path in self.files:
            try:
                self.file_sizes[path] = os.stat(path).st_size
                present.append(path)
            except OSError:
                pass  # removed by the ring buffer (its size as last seen stays counted)
        self.files = present

    @property
    def bytes_written(self) -> int:
        return sum(self.file_sizes.values())

    def bytes_on_disk(self) -> int:
        return sum(self.file_sizes.get(p, 0) for p in self.files)

    def views_bytes(self) -> int:
        """Bytes of the views made of it for the pcap tools (views.py: copies of a running capture's
        complete blocks, merged rings), half-written ones too (blocking: a few stat calls)."""
        views = Path(self.dir) / "views"
        try:
            entries = list(os.scandir(views))
        except OSError:
            return 0
        total = 0
        for entry in entries:
            try:
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass  # pruned meanwhile
        return total

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Capture:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def summary(self, owner_connected: bool | None = None) -> CaptureSummary:
        kernel = None if self.drops_kernel is None else sum(self.drops_kernel.values())
        interface = None if self.interface_stats is None else sum(
            s.get("interface_drops", 0) for s in self.interface_stats.values())
        elapsed_end = self.ended_at if self.ended_at is not None else time.time()
        return {
            "capture_id": self.id, "status": self.status, "running": self.running, "stop_reason": self.stop_reason,
            "stopped_by": self.stopped_by, "error": self.error, "owner": self.owner,
            "owner_connected": owner_connected, "interfaces": self.interfaces, "filter": self.filter,
            "applied_filter": self.applied_filter or self.filter, "excluded_tcp_ports": self.excluded_tcp_ports,
            "snaplen": self.snaplen, "ring": self.ring, "stop_on": self.stop_on,
            "packets": self.packets, "bytes_written": self.bytes_written, "bytes_on_disk": self.bytes_on_disk(),
            "drops": {"kernel": kernel, "interface": interface, "by_interface": self.drops_kernel,
                      "interface_statistics": self.interface_stats},
            "files": list(self.files), "current_file": self.files[-1] if self.files else None,
            "files_written": len(self.file_sizes), "evicted": self.evicted, "dir": self.dir,
            "created_at": _iso(self.created_at), "started_at": _iso(self.started_at), "ended_at": _iso(self.ended_at),
            "elapsed_s": round(elapsed_end - (self.started_at or self.created_at), 3), "pid": self.pid,
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    seconds, micros = divmod(round(ts * 1e6), 1_000_000)  # rounded to the microsecond (x.000001 % 1 is below 1e-6)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


class CaptureStore:
    """Records as JSON files and capture directories under the back end's state dir."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir
        self.meta_dir = state_dir / "captures"
        self.data_dir = state_dir / "exports"

    def new_id(self, taken: set[str]) -> str:
        while True:
            candidate = f"cap-{secrets.token_hex(4)}"
            if candidate not in taken and not self.meta_path(candidate).exists():
                return candidate

    def meta_path(self, capture_id: str) -> Path:
        if not CAPTURE_ID.fullmatch(capture_id):  # fullmatch: `$` alone passes a trailing newline
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not a capture id: {capture_id!r}",
                             hint="capture ids look like cap-1a2b3c4d (start_capture, list_captures)")
        return self.meta_dir / f"{capture_id}.json"

    def make_dir(self, capture_id: str) -> Path:
        statefile.ensure_dir(self.meta_dir)
        statefile.ensure_dir(self.data_dir)
        path = self.data_dir / capture_id
        return statefile.ensure_dir(path)

    def save(self, capture: Capture) -> None:
        statefile.ensure_dir(self.meta_dir)
        path = self.meta_path(capture.id)
        tmp = path.with_name(path.name + ".tmp")
        with open(statefile.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as f:
            json.dump(capture.to_json(), f)
        os.replace(tmp, path)

    def load(self, capture_id: str) -> Capture | None:
        try:
            return Capture.from_json(json.loads(statefile.read_text(self.meta_path(capture_id))))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError):
            return None

    def all(self) -> list[Capture]:
        if not self.meta_dir.is_dir():
            return []
        found = []
        for path in sorted(self.meta_dir.glob("cap-*.json")):
            capture = self.load(path.stem)
            if capture is not None:
                found.append(capture)
        return sorted(found, key=lambda c: c.created_at)

    def recover(self) -> list[str]:
        """Captures that were running when the daemon stopped: `interrupted`, files and counters kept."""
        interrupted = []
        for capture in self.all():
            if capture.running:
                capture.status, capture.stop_reason = "interrupted", "daemon_stopped"
                capture.ended_at = capture.ended_at or time.time()
                capture.pid = None
                capture.refresh_files()
                self.save(capture)
                interrupted.append(capture.id)
        return interrupted

    def evict_files(self, capture: Capture) -> int:
        """Remove a finished capture's files and views (the record stays, marked evicted); the bytes freed."""
        freed = capture.bytes_on_disk() + capture.views_bytes()
        shutil.rmtree(capture.dir, ignore_errors=True)
        capture.files = []
        capture.evicted = True
        self.save(capture)
        return freed

    def forget(self, capture: Capture) -> None:
        shutil.rmtree(capture.dir, ignore_errors=True)
        self.meta_path(capture.id).unlink(missing_ok=True)
