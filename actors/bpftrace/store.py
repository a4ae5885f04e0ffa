"""Persistence of executions under `<state_dir>/bpftrace/<id>/`, so results outlive the actor and the daemon:
writing and loading them, pruning old ones, and at daemon start marking in-flight runs interrupted and
reaping a bpftrace a killed daemon left behind (identified by pid *and* start time).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import structlog

from diagd.actors import statefile
from diagd.actors.bpftrace.execution import Execution
from diagd.actors.bpftrace.status import Status, StopReason
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.bpftrace")

EXECUTION_ID = re.compile(r"^bt-[0-9a-f]{8}$")


def proc_starttime(pid: int) -> int | None:
    """The process's start time in clock ticks: with the pid, it names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class ExecutionStore:
    """`<root>/<id>/meta.json` (small, replaced atomically), `output.txt` (appended every
    FLUSH_INTERVAL_S while running) and, for JSON runs, `maps.json` (the map summary, at the end).

    Writes are small and go to the page cache, so they are made on the event loop without fsync;
    whole-file reads (up to the output byte limit) go to a worker thread.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, execution_id: str) -> Path:
        if not EXECUTION_ID.fullmatch(execution_id):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not an execution id: {execution_id!r}")
        return self.root / execution_id

    def exists(self, execution_id: str) -> bool:
        return (self.path(execution_id) / "meta.json").exists()

    def create(self, ex: Execution) -> None:
        try:
            statefile.ensure_dir(self.root)
            statefile.ensure_dir(self.path(ex.id))
            for name in ("output.txt", "times.txt"):
                os.close(statefile.open_file(self.path(ex.id) / name, os.O_WRONLY | os.O_CREAT))
        except (OSError, DiagdError) as exc:  # the run goes on; its results just will not outlive the actor
            log.warning("cannot persist execution", execution_id=ex.id, error=str(exc),
                        code=str(getattr(exc, "code", "")) or None)
            return
        self.save(ex)

    def append(self, ex: Execution) -> None:
        """Append the output lines not written yet."""
        if ex.flushed >= len(ex.lines):
            return
        try:
            new = "".join(line + "\n" for line in ex.lines[ex.flushed:])
            statefile.append_text(self.path(ex.id) / "output.txt", new, errors="surrogateescape")
            if ex.line_ts is not None:  # one arrival time per line, beside output.txt
                statefile.append_text(self.path(ex.id) / "times.txt",
                                      "".join(f"{ts:.6f}\n" for ts in ex.line_ts[ex.flushed:]), encoding="ascii")
            ex.flushed = len(ex.lines)
        except (OSError, DiagdError) as exc:
            log.warning("cannot persist execution output", execution_id=ex.id, error=str(exc))

    def save(self, ex: Execution) -> None:
        """Append the pending lines, then replace meta.json (and maps.json once the run has ended)."""
        self.append(ex)
        directory = self.path(ex.id)
        try:
            if ex.finished and ex.output_format == "json":
                write_atomically(directory / "maps.json", json.dumps(ex.maps, separators=(",", ":")))
            write_atomically(directory / "meta.json", json.dumps(ex.to_meta(), separators=(",", ":")))
        except (OSError, DiagdError) as exc:
            log.warning("cannot persist execution", execution_id=ex.id, error=str(exc))

    def load(self, execution_id: str) -> Execution | None:
        directory = self.path(execution_id)
        try:
            meta = json.loads(statefile.read_text(directory / "meta.json"))
        except (OSError, ValueError, DiagdError):
            return None
        try:
            maps = json.loads(statefile.read_text(directory / "maps.json"))
        except (OSError, ValueError, DiagdError):
            maps = None
        try:
            text = statefile.read_text(directory / "output.txt", errors="surrogateescape")
        except (OSError, DiagdError):
            text = ""
        # Split on "\n" only: str.splitlines() would also split on \x0b, \x1c, U+2028 ...
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return Execution.from_meta(meta, lines, maps if isinstance(maps, dict) else None, _times(directory))

    def metas(self) -> list[dict[str, Any]]:
        out = []
        for meta_file in self.root.glob("bt-*/meta.json"):
            try:
                if meta_file.parent.is_symlink():
                    raise statefile.refused(meta_file.parent, "it is a symlink")
                out.append(json.loads(statefile.read_text(meta_file)))
            except (OSError, ValueError, DiagdError):
                continue
        return out

    def recover(self) -> list[str]:
        """At daemon start: runs recorded as running were interrupted; reap what they left behind."""
        recovered = []
        for meta in self.metas():
            if meta.get("status") != Status.RUNNING:
                continue
            ex = self.load(meta["id"])
            if ex is None:
                continue
            leftover = _kill_leftover(ex.pid, ex.pid_start)
            ex.status = Status.INTERRUPTED
            ex.stop_reason = ex.stop_reason or StopReason.DAEMON_DIED
            ex.error = ("the daemon stopped while this execution was running; output up to that point is kept"
                        + (f" (bpftrace pid {ex.pid} was still running and has been killed)" if leftover else ""))
            ex.ended_at = ex.ended_at or time.time()
            self.save(ex)
            recovered.append(ex.id)
        return recovered

    def prune(self, keep: int, protect: set[str]) -> None:
        if sum(1 for _ in self.root.glob("bt-*")) <= keep:
            return  # the common case: no meta file read at all
        metas = sorted(self.metas(), key=lambda m: m.get("created_at", 0), reverse=True)
        for meta in metas[keep:]:
            if meta.get("id") in protect or meta.get("status") == Status.RUNNING:
                continue
            shutil.rmtree(self.root / meta["id"], ignore_errors=True)


def _times(directory: Path) -> list[float] | None:
    """The lines' arrival times (times.txt), or None: missing (a run from before diagd kept them) or unreadable."""
    try:
        return [float(x) for x in statefile.read_text(directory / "times.txt", encoding="ascii").split()]
    except (OSError, ValueError, DiagdError):
        return None


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(statefile.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)  # replaces a link planted at `path` itself, never writes through it


def _kill_leftover(pid: int | None, pid_start: int | None) -> bool:
    """SIGKILL the process group of a bpftrace a killed daemon left behind (same pid *and* start time)."""
    if pid is None or pid_start is None or proc_starttime(pid) != pid_start:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    log.warning("killed a bpftrace left behind by a previous daemon", pid=pid)
    return True
