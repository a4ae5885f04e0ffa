"""Tool-call visibility: the audit log (JSON lines, rotated) and in-memory call statistics.

A call is written twice, with one `call_id`: a "started" record when it begins and its outcome
when it ends, so a call that hangs shows in `diagd logs` and as "running" in `diagd_calls`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import structlog

from diagd.actors import statefile
from diagd.daemon.server.replies import CallInfo
from diagd.protocol.errors import DiagdError

log = structlog.get_logger("diagd.daemon")


@dataclass
class CallRecord:
    """One call as the audit log, `diagd_calls` and `diagd call` show it.

    Each call gives two records with one `call_id`: outcome "started" when it begins (so a call
    that hangs is visible) and its outcome (ok | error | cancelled) when it ends.
    """

    ts: float
    client: str
    tool: str
    arguments: dict[str, Any]
    duration_ms: float
    queue_ms: float
    outcome: str  # ok | error | cancelled
    code: str | None
    bytes: int
    truncated: bool
    call_id: str | None = None
    details: dict[str, Any] | None = None  # a refused call's: the JSON-RPC code it got, did_you_mean
    # The call's own arguments and its client's directory, for the web view to run it again (its view,
    # ui/feed.py); never written, printed or sent (to_json leaves it out: the audit keeps `arguments`).
    replay: tuple[Any, str | None] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> CallInfo:
        data: CallInfo = {"ts": self.ts, "client": self.client, "tool": self.tool, "arguments": self.arguments,
                          "duration_ms": self.duration_ms, "queue_ms": self.queue_ms, "outcome": self.outcome,
                          "code": self.code, "bytes": self.bytes, "truncated": self.truncated}
        if self.call_id is not None:  # records made without them keep their old shape
            data["call_id"] = self.call_id
        if self.details is not None:
            data["details"] = self.details
        return data


def log_call(record: CallRecord) -> None:
    """The daemon log's line for a finished call (a registry observer, beside the audit log's)."""
    log.info("tool call", tool=record.tool, client=record.client, outcome=record.outcome, code=record.code,
             duration_ms=record.duration_ms, queue_ms=record.queue_ms, bytes=record.bytes)




class AuditLog:
    """Appends one JSON line per record (a call's start, then its end); rotates audit.jsonl -> .1 ... .keep."""

    def __init__(self, path: Path, *, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        statefile.ensure_dir(path.parent)
        self._file: TextIO | None = self._open()
        for i in range(1, keep + 1):  # rotated logs an older diagd wrote world-readable
            _tighten(path.with_name(f"{path.name}.{i}"))

    def write(self, record: CallRecord) -> None:
        # ASCII-only: one record is one line whatever the arguments hold. Raw U+2028, U+0085 or \x1e are
        # valid inside JSON strings but are line breaks to str.splitlines() and to many log readers;
        # a lone surrogate could not be written as UTF-8 at all.
        if self._file is None:
            return  # disabled: a link was planted where the rotated log goes (logged once, coded)
        line = json.dumps(record.to_json(), separators=(",", ":"), default=str)
        self._file.write(line + "\n")
        self._file.flush()
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        for i in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        try:
            self._file = self._open()
        except DiagdError as exc:
            log.error("audit log disabled", code=str(exc.code), error=exc.message)

    def _open(self) -> TextIO:
        """Append to the log, owner-only: it holds every call's arguments (paths, programs, payloads).

        Created 0600 whatever the umask, never through a symlink; a log left 0644 by an older diagd
        is tightened through the fd (rotation renames files, so older rotated logs keep the mode they
        were written with, which is this one from now on).
        """
        fd = statefile.open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # a link: PERMISSION_DENIED
        try:
            if os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
            return os.fdopen(fd, "a", encoding="utf-8")
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _tighten(path: Path) -> None:
    """Make an existing file of ours owner-only (through its fd: never follows a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return  # absent, or a symlink: nothing of ours to fix
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


RECENT_CALLS = 500  # finished calls kept for `diagd_calls` ...
RECENT_BYTES = 2 * 1024 * 1024  # ... and at most this many bytes of their arguments (as JSON)
DURATIONS_PER_TOOL = 1024  # latency samples per tool for p50/p95 (the latest)
MAX_TOOL_NAMES = 256  # tool names with statistics of their own; further names share OTHER_TOOLS
OTHER_TOOLS = "(other tool names)"


@dataclass
class _ToolStats:
    count: int = 0
    failures: int = 0
    cancelled: int = 0
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=DURATIONS_PER_TOOL))


class CallStats:
    """Per-tool counts and mean/p50/p95 durations, a ring of recent calls and the calls still running.

    Everything here is bounded whatever the clients send, for a daemon that runs for weeks: the ring by
    `recent` calls and `recent_bytes` of arguments, the latency samples per tool, the tool names (a call
    to a name no tool has is recorded too, so a client inventing names would otherwise add entries), and
    the running calls by the calls in flight (each leaves at its end).
    """

    def __init__(self, recent: int = RECENT_CALLS, recent_bytes: int = RECENT_BYTES,
                 max_tools: int = MAX_TOOL_NAMES) -> None:
        self._tools: dict[str, _ToolStats] = {}
        self.recent: deque[CallRecord] = deque(maxlen=recent)
        self._sizes: deque[int] = deque(maxlen=recent)  # each recent record's arguments, bytes as JSON
        self.recent_bytes = 0
        self.max_recent_bytes = recent_bytes
        self.max_tools = max_tools
        self._running: dict[str, CallRecord] = {}
        self.total = 0

    def running(self) -> list[CallRecord]:
        """Calls started and not ended, oldest first, as "running" records with their time so far."""
        now = time.time()
        return [dataclasses.replace(r, outcome="running", duration_ms=round((now - r.ts) * 1000, 3))
                for r in self._running.values()]

    def running_count(self) -> int:
        return len(self._running)

    def tool_names(self) -> int:
        return len(self._tools)

    def observe(self, record: CallRecord) -> None:
        if record.outcome == "started":
            if record.call_id is not None:
                self._running[record.call_id] = record
            return
        if record.call_id is not None:
            self._running.pop(record.call_id, None)
        name = record.tool if record.tool in self._tools or len(self._tools) < self.max_tools - 1 else OTHER_TOOLS
        stats = self._tools.setdefault(name, _ToolStats())
        stats.count += 1
        self.total += 1
        if record.outcome == "error":
            stats.failures += 1
        elif record.outcome == "cancelled":
            stats.cancelled += 1
        stats.durations.append(record.duration_ms)
        self._remember(record)

    def _remember(self, record: CallRecord) -> None:
        size = len(json.dumps(record.arguments, separators=(",", ":"), default=str))
        if len(self.recent) == self.recent.maxlen:
            self.recent_bytes -= self._sizes[0]  # append drops the oldest of both
        self.recent.append(record)
        self._sizes.append(size)
        self.recent_bytes += size
        while self.recent_bytes > self.max_recent_bytes and len(self.recent) > 1:
            self.recent.popleft()
            self.recent_bytes -= self._sizes.popleft()

    def summary(self) -> dict[str, Any]:
        return {
            name: {
                "count": s.count,
                "failures": s.failures,
                "cancelled": s.cancelled,
                "failure_rate": round(s.failures / s.count, 4) if s.count else 0.0,
                "mean_ms": round(sum(s.durations) / len(s.durations), 3) if s.durations else None,
                "p50_ms": percentile(s.durations, 50),
                "p95_ms": percentile(s.durations, 95),
            }
            for name, s in sorted(self._tools.items())
        }


def percentile(values: deque[float] | list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1))))
    return round(ordered[rank], 3)
