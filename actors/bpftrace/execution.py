"""The state of one bpftrace run, shared by its actor (which writes it) and the tools (which read it, live or
reloaded from disk): status and stop reason, the bounded output buffer, JSON map tracking, paging, and the
meta.json form that `ExecutionStore` persists.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import trio

from diagd.actors.bpftrace.parse import LOST_TEXT, parse_json_line
from diagd.actors.bpftrace.replies import ExecutionState, OutputFormat, PageReply, Summary, Times
from diagd.actors.bpftrace.status import Status, StopReason
from diagd.protocol import utc

PAGE_MAX_BYTES = 4 * 1024 * 1024  # one get_result page


STATUS_FOR_STOP = {StopReason.DURATION: Status.COMPLETED, StopReason.TIMEOUT: Status.TIMED_OUT,
                   StopReason.REQUESTED: Status.STOPPED,
                   StopReason.BUFFER_FULL: Status.STOPPED, StopReason.ACTOR_STOPPED: Status.STOPPED,
                   StopReason.SHUTDOWN: Status.INTERRUPTED, StopReason.DAEMON_DIED: Status.INTERRUPTED}
_MAP_TYPES = ("map", "hist", "stats")


# bpftrace 0.17 prints the log2 bucket [2^31, 2^32) in JSON as min -2147483648, max 0 (it shifts a
# 32-bit int), and its log2() stops at that bucket: every value from 2^31 up is counted there (the
# text output calls it [2G, 4G)). No linear bucket can look like this (lhist takes int arguments).
_MISPRINTED_TOP = {"min": -(2**31), "max": 0}
_TOP_LOG2 = 2**31


def _fix_top_log2_bucket(data: Any) -> Any:
    """A hist's buckets (a list, or a list per key) with that bucket as the open-ended one it is."""
    if isinstance(data, dict):
        return {key: _fix_top_log2_bucket(buckets) for key, buckets in data.items()}
    if isinstance(data, list) and data and isinstance(last := data[-1], dict) \
            and {k: v for k, v in last.items() if k != "count"} == _MISPRINTED_TOP:
        return [*data[:-1], {"min": _TOP_LOG2, "count": last.get("count")}]
    return data


def _iso(ts: float | None) -> str | None:
    return None if ts is None else utc.iso(ts)



@dataclass
class Execution:
    """The state of one run; the actor that owns the process writes it, the tools read it."""

    id: str
    program: str
    output_format: OutputFormat
    timeout_s: float
    max_lines: int = 10_000
    max_bytes: int = 16 * 1024 * 1024
    created_at: float = field(default_factory=time.time)
    status: Status = Status.RUNNING
    stop_reason: StopReason | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    attached_probes: int | None = None
    lines: list[str] = field(default_factory=list)
    # Wall-clock time each kept line was read from bpftrace (Unix s), for diagd_timeline. None for a
    # run saved before diagd recorded it (its times.txt is missing or does not match its lines).
    line_ts: list[float] | None = field(default_factory=list)
    output_bytes: int = 0
    lines_dropped: int = 0
    buffer_full: bool = False
    lost_events: int = 0
    maps: dict[str, Any] = field(default_factory=dict)
    pid: int | None = None
    pid_start: int | None = None
    started_clock: float | None = None  # trio clock at the spawn; None once loaded from disk
    attached_clock: float | None = None  # trio clock when bpftrace announced its probes
    flushed: int = 0  # lines already appended to output.txt
    _changed: trio.Event | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status != Status.RUNNING

    @property
    def stopping(self) -> bool:
        return self.stop_reason is not None and not self.finished

    def elapsed_s(self) -> float:
        """Seconds since the probes attached (since the spawn if they never did)."""
        if self.duration_s is not None:
            return self.duration_s
        since = self.attached_clock if self.attached_clock is not None else self.started_clock
        return 0.0 if since is None else round(trio.current_time() - since, 3)

    # -- change notification (for get_result wait_s and stop_execution)

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_changed(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    # -- output

    def add_line(self, line: str) -> bool:
        """Buffer one output line; False once the buffer is full (the run must stop)."""
        if self.output_format == "json":
            self._observe_json(line)
        elif lost := LOST_TEXT.match(line):
            self.lost_events += int(lost[1])
        size = len(line) + 1
        if self.buffer_full or len(self.lines) >= self.max_lines or self.output_bytes + size > self.max_bytes:
            self.buffer_full = True
            self.lines_dropped += 1
            return False
        self.lines.append(line)
        if self.line_ts is not None:
            self.line_ts.append(round(time.time(), 6))
        self.output_bytes += size
        self.notify()
        if len(self.lines) >= self.max_lines:
            self.buffer_full = True
            return False
        return True

    def _observe_json(self, line: str) -> None:
        # Maps are tracked even past the buffer limit: the final maps still come back as data.
        if not line.startswith('{"type": "'):
            return
        kind = line[10:line.find('"', 10)]
        if kind not in (*_MAP_TYPES, "lost_events"):
            return
        event = parse_json_line(line)
        data = event.get("data")
        if kind == "lost_events" and isinstance(data, dict):
            self.lost_events += int(data.get("events", 0))
        elif isinstance(data, dict):
            for name, value in data.items():
                self.maps[name] = {"type": kind, "data": _fix_top_log2_bucket(value) if kind == "hist" else value}

    def page(self, offset: int, limit: int, max_bytes: int = PAGE_MAX_BYTES, *, times: bool = False
             ) -> PageReply:
        chosen: list[str] = []
        size = 0
        for line in self.lines[offset:offset + limit]:
            if chosen and size + len(line) > max_bytes:
                break
            chosen.append(line)
            size += len(line) + 1
        output: list[Any] = [parse_json_line(x) for x in chosen] if self.output_format == "json" else chosen
        end = offset + len(chosen)
        total = len(self.lines)
        extra: Times = {}
        if times:  # null: this run's lines were recorded without their times
            extra["line_ts"] = None if self.line_ts is None else self.line_ts[offset:end]
        return {
            "execution_id": self.id,
            "status": self.status,
            "output_format": self.output_format,
            "offset": offset,
            "lines_total": total,
            "lines_returned": len(chosen),
            "output": output,
            "has_more": end < total,
            "next_offset": min(end, total),
            "maps": self.maps if self.output_format == "json" else None,
            **extra,
            **self._state(),
        }

    def _state(self) -> ExecutionState:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "error": self.error,
            "warnings": self.warnings,
            "notices": self.notices,
            "buffer_full": self.buffer_full,
            "lines_dropped": self.lines_dropped,
            "truncated": self.buffer_full,
            "lost_events": self.lost_events,
            "attached_probes": self.attached_probes,
            "stop_reason": self.stop_reason,
            "stopping": self.stopping,
            "timeout_s": self.timeout_s,
            "elapsed_s": self.elapsed_s(),
            "created_at": _iso(self.created_at),
            "ended_at": _iso(self.ended_at),
        }

    def summary(self) -> Summary:
        program = self.program if len(self.program) <= 200 else self.program[:200] + "…"
        return {"execution_id": self.id, "status": self.status, "program": program,
                "output_format": self.output_format, "lines_total": len(self.lines), **self._state()}

    # -- persistence

    def to_meta(self) -> dict[str, Any]:
        return {
            "version": 1, "id": self.id, "program": self.program, "output_format": self.output_format,
            "timeout_s": self.timeout_s, "max_lines": self.max_lines, "max_bytes": self.max_bytes,
            "created_at": self.created_at, "status": str(self.status),
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "ended_at": self.ended_at, "duration_s": self.duration_s, "exit_code": self.exit_code,
            "signal": self.signal, "error": self.error, "warnings": self.warnings, "notices": self.notices,
            "attached_probes": self.attached_probes, "lines_total": len(self.lines),
            "output_bytes": self.output_bytes, "lines_dropped": self.lines_dropped, "buffer_full": self.buffer_full,
            "lost_events": self.lost_events, "pid": self.pid, "pid_start": self.pid_start,
        }

    @classmethod
    def from_meta(cls, meta: dict[str, Any], lines: list[str], maps: dict[str, Any] | None = None,
                  line_ts: list[float] | None = None) -> Execution:
        ex = cls(id=meta["id"], program=meta["program"], output_format=meta["output_format"],
                 timeout_s=float(meta["timeout_s"]), max_lines=int(meta.get("max_lines", 10_000)),
                 max_bytes=int(meta.get("max_bytes", 16 * 1024 * 1024)), created_at=float(meta["created_at"]))
        ex.status = Status(meta["status"])
        ex.stop_reason = StopReason(meta["stop_reason"]) if meta.get("stop_reason") else None
        for name in ("ended_at", "duration_s", "exit_code", "signal", "error", "attached_probes", "pid",
                     "pid_start"):
            setattr(ex, name, meta.get(name))
        ex.warnings = list(meta.get("warnings", []))
        ex.notices = list(meta.get("notices", []))
        ex.lines = lines
        ex.line_ts = line_ts if line_ts is not None and len(line_ts) == len(lines) else None
        ex.flushed = len(lines)
        ex.output_bytes = sum(len(x) + 1 for x in lines)
        ex.lines_dropped = int(meta.get("lines_dropped", 0))
        ex.buffer_full = bool(meta.get("buffer_full", False))
        ex.lost_events = int(meta.get("lost_events", 0))
        if maps is not None:
            ex.maps = maps
        elif ex.output_format == "json":  # not saved yet (the daemon died mid-run): rebuild from the lines
            for line in lines:
                ex._observe_json(line)
        return ex
