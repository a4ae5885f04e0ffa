"""The bpftrace actor: one actor per execution, owning its bpftrace process and output buffer.

`exec_program` starts an actor (kind "bpftrace", resource = execution id) whose `start()` spawns
bpftrace and returns once bpftrace has announced its probes ("Attaching N probes...", or
`attached_probes` in JSON mode) or has exited. That announcement comes after bpftrace's own
parser and semantic analyser have passed, so a syntax error, an unknown tracepoint or an unsafe
builtin comes back at once as a coded error with line and column, at no extra cost. (bpftrace
0.17 has no `--dry-run`; `-d` runs the same passes plus LLVM codegen and dumps the AST and IR, a
second full compile per program.) The run then continues in the actor's nursery; the tools page
through its buffered output while it runs. Since exec_program returns at once, progress
notifications belong to `get_result` with `wait_s`: it long-polls for new output (or, with
until=done, for the end) and reports the tracing time against the timeout every 0.5 s.

Limits come from the `[bpftrace]` config table (see `BpftraceSettings`): run time (counted from
the attach: compiling and attaching are bounded by start_timeout_s), buffered lines and bytes
(then a graceful stop flagged `buffer_full`), and concurrent executions (the next one is refused
with BUSY). The actor's idle timeout covers the whole run, so it cannot expire mid-run; once the
run has ended it retires itself after linger_s.

Stopping is SIGINT first, so bpftrace detaches and prints its final maps, then SIGKILL. The grace
period grows with the number of attached probes: detaching costs one RCU grace period per probe
(about 75 ms each on a 2-vCPU VM, so ~27 s for 360 syscall tracepoints, and SIGKILL does not make
the kernel side any faster).

Executions (metadata and output lines) are persisted under `<state_dir>/bpftrace/<id>/`, so
`get_result` works after the actor expired and after a daemon restart; a run that was in flight
when the daemon stopped is reported as `interrupted`, and a bpftrace left behind by a daemon
that was killed is reaped at the next start.
"""

from __future__ import annotations

import contextlib
import enum
import fnmatch
import gzip
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from diagd.actors._subprocess import TERM_THEN_KILL, LineSplitter, Step, Tail, drain, open_process, stop_process
from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy
from diagd.daemon import doctor
from diagd.daemon.tools import CallContext, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.daemon.server import Daemon

log = structlog.get_logger("diagd.bpftrace")

KIND = "bpftrace"
Spawn = Callable[[Sequence[str]], Awaitable[trio.Process]]

MAX_LINE_BYTES = 4 * 1024 * 1024  # one JSON map dump is one line
PAGE_MAX_BYTES = 4 * 1024 * 1024  # one get_result page
STDERR_TAIL_BYTES = 64 * 1024
FLUSH_INTERVAL_S = 0.5
PIPE_EOF_GRACE_S = 2.0  # after exit, a grandchild (system()) may still hold the pipes
MAX_SIGINT_GRACE_S = 60.0
MAX_KILL_WAIT_S = 60.0
SHUTDOWN_SIGINT_S = 3.0  # daemon shutdown: short SIGINT grace, then SIGKILL
SHUTDOWN_KILL_S = 10.0
STOP_WAIT_MAX_S = 85.0
PROGRESS_INTERVAL_S = 0.5
MAX_WARNINGS = 50
EXECUTION_ID = re.compile(r"^bt-[0-9a-f]{8}$")


# ---------------------------------------------------------------------------------------------
# Settings: the [bpftrace] table


@dataclass(frozen=True)
class BpftraceSettings:
    path: str = "bpftrace"
    privileged_helper: str = ""  # e.g. "sudo -n": prefixed to every bpftrace command
    allow_unsafe: bool = False  # pass --unsafe (system(), signal(), override())
    max_run_s: float = 60.0
    default_timeout_s: float = 10.0
    max_lines: int = 10_000
    max_output_bytes: int = 16 * 1024 * 1024
    max_concurrent: int = 5
    stop_grace_s: float = 5.0  # SIGINT -> SIGKILL, plus stop_s_per_probe per attached probe
    stop_s_per_probe: float = 0.15
    start_timeout_s: float = 20.0  # exec_program waits this long for bpftrace to attach
    linger_s: float = 60.0  # a finished execution's actor stays this long, then results come from disk
    keep_executions: int = 200  # persisted executions kept on disk
    probe_cache_s: float = 30.0

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> BpftraceSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown [bpftrace] config keys: {unknown}",
                             known=sorted(known))
        values: dict[str, Any] = {}
        for name, value in raw.items():
            default = getattr(cls, name)
            if not _same_kind(value, default):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] {name} must be "
                                 f"{_KIND_NAMES[type(default)]}", key=name, value=repr(value))
            numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
            if numeric and (value < 0 or (value == 0 and name not in _MAY_BE_ZERO)):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] {name} must be positive", key=name)
            values[name] = float(value) if isinstance(default, float) else value
        settings = cls(**values)
        if settings.default_timeout_s > settings.max_run_s:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "[bpftrace] default_timeout_s exceeds max_run_s")
        try:
            shlex.split(settings.privileged_helper)
        except ValueError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] privileged_helper: {exc}") from None
        return settings

    @property
    def helper_argv(self) -> list[str]:
        argv = shlex.split(self.privileged_helper)
        # sudo must never wait for a password: -n makes it fail instead (stdin is /dev/null anyway).
        if argv and os.path.basename(argv[0]) == "sudo" and not {"-n", "--non-interactive"} & set(argv):
            argv.insert(1, "-n")
        return argv

    def command(self, *args: str) -> list[str]:
        return [*self.helper_argv, self.path, *args]

    def stop_steps(self, probes: int | None) -> tuple[Step, Step]:
        """SIGINT, then SIGKILL: both waits grow with the probes bpftrace must detach."""
        per_probe = self.stop_s_per_probe * (probes or 0)
        return (Step("sigint", signal.SIGINT, min(self.stop_grace_s + per_probe, MAX_SIGINT_GRACE_S)),
                Step("sigkill", signal.SIGKILL, min(5.0 + per_probe, MAX_KILL_WAIT_S)))


_MAY_BE_ZERO = frozenset({"linger_s", "stop_s_per_probe"})
_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, str)


def check_privileges(settings: BpftraceSettings) -> None:
    """Refuse early, saying what is needed, when bpftrace cannot possibly load programs."""
    if settings.helper_argv:
        return  # the helper (sudo -n ...) decides; its refusal is mapped from its stderr
    check = doctor.check_bpf_privileges()
    if not check.ok:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"bpftrace needs privileges: {check.detail}; bpftrace 0.17 "
                         "runs only as root (euid 0)", fix=check.fix)


# ---------------------------------------------------------------------------------------------
# bpftrace's stderr: located diagnostics, harmless notices, everything else


@dataclass(frozen=True)
class Diagnostic:
    level: str  # "error" | "warning"
    message: str
    line: int | None = None
    column: int | None = None
    end_column: int | None = None
    source: str | None = None  # the program line bpftrace quoted

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}: " if self.line is not None else ""
        return f"{where}{self.message}"


@dataclass
class StderrReport:
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([*(str(e) for e in self.errors), *self.other])


_LOCATED = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+)(?:-(?P<end>\d+))?: "
                      r"(?P<level>ERROR|WARNING): (?P<msg>.*)$")
_CARET = re.compile(r"^[ \t~]*$")  # under the quoted line; all blanks for an error at end of input
# bpftrace 0.17 prints this as an ERROR on every run here; since Linux 5.11 BPF memory is charged
# to the cgroup and RLIMIT_MEMLOCK no longer matters.
_MEMLOCK = re.compile(r"ERROR: Unknown error -?\d+: couldn't set RLIMIT_MEMLOCK for bpftrace\.[^\n]*")
# Printed without a trailing newline, so it runs into the next message.
_TRACEABLE = re.compile(r"Error while reading traceable functions from (\S+): (.*?)(?=ERROR:|WARNING:|\n|$)")
_UNSAFE = re.compile(r"(\w+)\(\) is an unsafe function being used in safe mode")


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def parse_stderr(text: str) -> StderrReport:
    report = StderrReport()

    def memlock(match: re.Match[str]) -> str:
        if _kernel_at_least(5, 11):
            report.notices.append("bpftrace could not raise RLIMIT_MEMLOCK (harmless: this kernel charges BPF "
                                  "memory to the cgroup)")
            return "\n"
        return match[0] + "\n"

    def traceable(match: re.Match[str]) -> str:
        report.notices.append(f"bpftrace cannot read {match[1]} ({match[2].strip()}): kprobe names are not "
                              "checked before attaching")
        return "\n"

    text = _TRACEABLE.sub(traceable, _MEMLOCK.sub(memlock, text))
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.strip():
            continue
        located = _LOCATED.match(line)
        if located:
            source = None
            if i + 1 < len(lines) and _CARET.match(lines[i + 1]):
                source = lines[i]
                i += 2
            diag = Diagnostic("error" if located["level"] == "ERROR" else "warning", located["msg"].strip(),
                              int(located["line"]), int(located["col"]),
                              int(located["end"]) if located["end"] else None, source)
            (report.errors if diag.level == "error" else report.warnings).append(diag)
        elif line.startswith("ERROR: ") or line.startswith("FATAL: "):
            report.errors.append(Diagnostic("error", line.split(": ", 1)[1].strip()))
        elif line.startswith("WARNING: "):
            report.warnings.append(Diagnostic("warning", line[len("WARNING: "):].strip()))
        else:
            report.other.append(line)
    return report


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _tracefs_fix() -> str:
    return doctor.check_tracefs().fix


def _tracefs_error(what: str, **details: Any) -> DiagdError:
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                      f"tracefs is not mounted (no /sys/kernel/tracing/available_events), so {what}: fix as root "
                      f"with `{_tracefs_fix()}` (diagd doctor checks it)", fix=_tracefs_fix(), **details)


def classify_failure(report: StderrReport, returncode: int | None, *, before_attach: bool,
                     doing: str = "before attaching its probes") -> DiagdError:
    """Turn bpftrace's refusal into the coded error the caller should see."""
    everything = "\n".join([*(d.message for d in report.errors), *report.other])
    details: dict[str, Any] = {"exit_code": returncode, "stderr": report.text()[-4000:]}
    if "only supports running as the root user" in everything:
        return DiagdError(ErrorCode.PERMISSION_DENIED, "bpftrace 0.17 runs only as root (euid 0; CAP_BPF+CAP_PERFMON "
                          "are not enough for this version): run diagd as root or set [bpftrace] privileged_helper "
                          "= \"sudo -n\" with a NOPASSWD sudoers rule for bpftrace", **details)
    if re.search(r"sudo: (a password is required|a terminal is required|.*not allowed)", everything):
        return DiagdError(ErrorCode.PERMISSION_DENIED, "the privileged helper refused to run bpftrace without a "
                          "password: add a NOPASSWD sudoers rule for bpftrace (diagd never answers prompts)",
                          **details)
    unsafe = sorted({m[1] for d in report.errors if (m := _UNSAFE.search(d.message))})
    if unsafe:
        return DiagdError(ErrorCode.PERMISSION_DENIED, f"the program uses unsafe builtin(s) {', '.join(unsafe)}(), "
                          "refused: set [bpftrace] allow_unsafe = true to allow them", unsafe=unsafe,
                          errors=[d.to_json() for d in report.errors], **details)
    if "tracepoint not found" in everything and doctor.tracefs_dir() is None:
        return _tracefs_error("bpftrace cannot find any tracepoint", **details)
    located = [d for d in report.errors if d.line is not None]
    if located and before_attach:
        first = located[0]
        return DiagdError(ErrorCode.INVALID_ARGUMENT, f"bpftrace rejected the program: {first}", line=first.line,
                          column=first.column, end_column=first.end_column, source=first.source,
                          errors=[d.to_json() for d in report.errors], **details)
    if returncode is not None and returncode < 0:
        message = f"bpftrace was killed by {_signal_name(returncode)} {doing}"
    else:
        message = f"bpftrace failed {doing}: " + (everything.strip() or f"exit status {returncode}")
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, message, **details)


# ---------------------------------------------------------------------------------------------
# One execution: status, output buffer, persistence format


class Status(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"


class StopReason(enum.StrEnum):
    REQUESTED = "stop_execution"
    TIMEOUT = "timeout"
    BUFFER_FULL = "buffer_full"
    ACTOR_STOPPED = "actor_stopped"  # diagd_stop_actor, or the actor crashed
    SHUTDOWN = "daemon_shutdown"
    DAEMON_DIED = "daemon_exited"  # found in flight at the next start


STATUS_FOR_STOP = {StopReason.TIMEOUT: Status.TIMED_OUT, StopReason.REQUESTED: Status.STOPPED,
                   StopReason.BUFFER_FULL: Status.STOPPED, StopReason.ACTOR_STOPPED: Status.STOPPED,
                   StopReason.SHUTDOWN: Status.INTERRUPTED, StopReason.DAEMON_DIED: Status.INTERRUPTED}
_ATTACH_TEXT = re.compile(r"^Attaching (\d+) probes?\.\.\.$")
_LOST_TEXT = re.compile(r"^Lost (\d+) events$")
_MAP_TYPES = ("map", "hist", "stats")


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def parse_json_line(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    return event if isinstance(event, dict) else {"type": "text", "data": line}


@dataclass
class Execution:
    """The state of one run; the actor that owns the process writes it, the tools read it."""

    id: str
    program: str
    output_format: str
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
        elif lost := _LOST_TEXT.match(line):
            self.lost_events += int(lost[1])
        size = len(line) + 1
        if self.buffer_full or len(self.lines) >= self.max_lines or self.output_bytes + size > self.max_bytes:
            self.buffer_full = True
            self.lines_dropped += 1
            return False
        self.lines.append(line)
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
                self.maps[name] = {"type": kind, "data": value}

    def page(self, offset: int, limit: int, max_bytes: int = PAGE_MAX_BYTES) -> dict[str, Any]:
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
        return {
            "execution_id": self.id,
            "status": str(self.status),
            "output_format": self.output_format,
            "offset": offset,
            "lines_total": total,
            "lines_returned": len(chosen),
            "output": output,
            "has_more": end < total,
            "next_offset": min(end, total),
            "maps": self.maps if self.output_format == "json" else None,
            **self._state(),
        }

    def _state(self) -> dict[str, Any]:
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
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "stopping": self.stopping,
            "timeout_s": self.timeout_s,
            "elapsed_s": self.elapsed_s(),
            "created_at": _iso(self.created_at),
            "ended_at": _iso(self.ended_at),
        }

    def summary(self) -> dict[str, Any]:
        program = self.program if len(self.program) <= 200 else self.program[:200] + "…"
        return {"execution_id": self.id, "status": str(self.status), "program": program,
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
    def from_meta(cls, meta: dict[str, Any], lines: list[str], maps: dict[str, Any] | None = None) -> Execution:
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


def _proc_starttime(pid: int) -> int | None:
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
        if not EXECUTION_ID.match(execution_id):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"not an execution id: {execution_id!r}")
        return self.root / execution_id

    def exists(self, execution_id: str) -> bool:
        return (self.path(execution_id) / "meta.json").exists()

    def create(self, ex: Execution) -> None:
        try:
            self.path(ex.id).mkdir(parents=True, exist_ok=True, mode=0o700)
            (self.path(ex.id) / "output.txt").touch(mode=0o600)
        except OSError as exc:  # the run goes on; its results just will not outlive the actor
            log.warning("cannot persist execution", execution_id=ex.id, error=str(exc))
            return
        self.save(ex)

    def append(self, ex: Execution) -> None:
        """Append the output lines not written yet."""
        if ex.flushed >= len(ex.lines):
            return
        try:
            with open(self.path(ex.id) / "output.txt", "a", encoding="utf-8", errors="surrogateescape") as out:
                out.write("".join(line + "\n" for line in ex.lines[ex.flushed:]))
            ex.flushed = len(ex.lines)
        except OSError as exc:
            log.warning("cannot persist execution output", execution_id=ex.id, error=str(exc))

    def save(self, ex: Execution) -> None:
        """Append the pending lines, then replace meta.json (and maps.json once the run has ended)."""
        self.append(ex)
        directory = self.path(ex.id)
        try:
            if ex.finished and ex.output_format == "json":
                _write_atomically(directory / "maps.json", json.dumps(ex.maps, separators=(",", ":")))
            _write_atomically(directory / "meta.json", json.dumps(ex.to_meta(), separators=(",", ":")))
        except OSError as exc:
            log.warning("cannot persist execution", execution_id=ex.id, error=str(exc))

    def load(self, execution_id: str) -> Execution | None:
        directory = self.path(execution_id)
        try:
            meta = json.loads((directory / "meta.json").read_text())
        except (OSError, ValueError):
            return None
        try:
            maps = json.loads((directory / "maps.json").read_text())
        except (OSError, ValueError):
            maps = None
        try:
            text = (directory / "output.txt").read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            text = ""
        # Split on "\n" only: str.splitlines() would also split on \x0b, \x1c, U+2028 ...
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return Execution.from_meta(meta, lines, maps if isinstance(maps, dict) else None)

    def metas(self) -> list[dict[str, Any]]:
        out = []
        for meta_file in self.root.glob("bt-*/meta.json"):
            try:
                out.append(json.loads(meta_file.read_text()))
            except (OSError, ValueError):
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


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _kill_leftover(pid: int | None, pid_start: int | None) -> bool:
    """SIGKILL the process group of a bpftrace a killed daemon left behind (same pid *and* start time)."""
    if pid is None or pid_start is None or _proc_starttime(pid) != pid_start:
        return False
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    log.warning("killed a bpftrace left behind by a previous daemon", pid=pid)
    return True


# ---------------------------------------------------------------------------------------------
# The actor


class _ActorGone(DiagdError):
    """The execution's actor expired between lookup and call: read the store instead."""


class _GoneActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY, max_restarts=0)

    async def start(self, nursery: trio.Nursery) -> None:
        raise _ActorGone(ErrorCode.NOT_FOUND, f"execution {self.resource} has no live actor")

    async def handle(self, request: Request) -> dict[str, Any]:  # pragma: no cover - never started
        raise _ActorGone(ErrorCode.NOT_FOUND, "gone")


class Slot:
    """One of the max_concurrent places; held from before the spawn until the process is reaped."""

    def __init__(self, backend: BpftraceBackend) -> None:
        self._backend = backend
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._backend.reserved -= 1


class BpftraceExecution(Actor):
    kind = KIND
    # An execution is never restarted: a crash ends the run (its output is kept).
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY, max_restarts=0,
                               stop_grace_s=SHUTDOWN_SIGINT_S + SHUTDOWN_KILL_S + 5)

    def __init__(self, execution: Execution, backend: BpftraceBackend, settings: BpftraceSettings,
                 argv: Sequence[str], slot: Slot) -> None:
        super().__init__(execution.id, settings)
        self.execution = execution
        self.backend = backend
        self.config = settings
        self.argv = list(argv)
        self.slot = slot
        self.proc: trio.Process | None = None
        # The run's timer: its deadline is set once the probes are attached (compiling and
        # attaching are bounded by start_timeout_s instead), so `timeout` is tracing time.
        self.timer = trio.CancelScope()
        self.stop_step: str | None = None
        self.accepted = False
        self.stderr = Tail(STDERR_TAIL_BYTES)
        self._stdout_lines = LineSplitter(self._on_stdout, max_line=MAX_LINE_BYTES)
        self._attached_or_exited = trio.Event()
        self._decided = trio.Event()  # start() accepted or refused the run
        self._wake = trio.Event()  # a stop was requested, or the process exited
        self._stdout_eof = trio.Event()
        self._stderr_eof = trio.Event()
        self._finished = False

    # -- lifecycle

    async def start(self, nursery: trio.Nursery) -> None:
        ex = self.execution
        try:
            try:
                self.proc = await self.backend.spawn(self.argv)
            except FileNotFoundError:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {self.argv[0]!r}",
                                 fix=doctor.APT_HINT.format(pkg="bpftrace")) from None
            except PermissionError as exc:
                raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot execute {self.argv[0]!r}: {exc}") from None
            ex.pid = self.proc.pid
            ex.pid_start = _proc_starttime(self.proc.pid)
            ex.started_clock = trio.current_time()
            nursery.start_soon(self._run)
            with trio.move_on_after(self.config.start_timeout_s):
                await self._attached_or_exited.wait()
            self.timer.deadline = trio.current_time() + ex.timeout_s
            if ex.attached_probes is None and self.proc.returncode is not None:
                # Exited before we saw the attach line: read both pipes to the end before deciding.
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stdout_eof.wait()
                    await self._stderr_eof.wait()
                if ex.attached_probes is None and self.proc.returncode != 0:
                    raise classify_failure(parse_stderr(self.stderr.text()), self.proc.returncode,
                                           before_attach=True)
            self.accepted = True
            self.backend.accepted(self)
            nursery.start_soon(self._flush_periodically)
        finally:
            self._decided.set()

    async def _run(self) -> None:
        proc = self.proc
        assert proc is not None
        try:
            async with trio.open_nursery() as pipes:
                pipes.start_soon(self._read_stdout)
                pipes.start_soon(self._read_stderr)
                pipes.start_soon(self._reap)
                with self.timer:
                    await self._wake.wait()
                if self.timer.cancelled_caught and proc.returncode is None:
                    self.request_stop(StopReason.TIMEOUT)
                if proc.returncode is None:
                    self.stop_step = await stop_process(proc, self.config.stop_steps(self.execution.attached_probes))
                    if self.stop_step == "unreaped":
                        await proc.wait()  # SIGKILL is sent: the kernel is still detaching probes
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stdout_eof.wait()
                    await self._stderr_eof.wait()
                pipes.cancel_scope.cancel(reason="bpftrace exited")
            await self._decided.wait()
            if self.accepted:
                self._finish()
                await trio.sleep(self.config.linger_s)
                self.backend.retire(self)
        finally:
            if not self._finished:
                with trio.CancelScope(shield=True):
                    await self._abort()

    async def _abort(self) -> None:
        """The actor is being stopped (daemon shutdown, diagd_stop_actor, start failure): bounded cleanup."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.request_stop(StopReason.SHUTDOWN if self.backend.shutting_down() else StopReason.ACTOR_STOPPED)
            steps = (Step("sigint", signal.SIGINT, SHUTDOWN_SIGINT_S), Step("sigkill", signal.SIGKILL, SHUTDOWN_KILL_S))
            with trio.move_on_after(SHUTDOWN_SIGINT_S + SHUTDOWN_KILL_S + PIPE_EOF_GRACE_S):
                async with trio.open_nursery() as pipes:
                    # The readers were cancelled with the actor: bpftrace prints its final maps now.
                    pipes.start_soon(self._read_stdout)
                    pipes.start_soon(self._read_stderr)
                    self.stop_step = await stop_process(proc, steps)
                    with trio.move_on_after(PIPE_EOF_GRACE_S):
                        await self._stdout_eof.wait()
                        await self._stderr_eof.wait()
                    pipes.cancel_scope.cancel()
            if self.stop_step == "unreaped":
                log.warning("bpftrace still detaching probes after SIGKILL; init will reap it", pid=proc.pid,
                            execution_id=self.execution.id)
        if self.accepted:
            self._finish()

    async def stop(self) -> None:
        if self.proc is not None:
            if self.proc.returncode is None:  # start() failed before _run took charge
                await stop_process(self.proc, (Step("sigkill", signal.SIGKILL, SHUTDOWN_KILL_S),))
            await _close_pipes(self.proc)
        self.slot.release()
        self.backend.forget(self)

    async def _reap(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        self._attached_or_exited.set()
        self._wake.set()

    async def _read_stdout(self) -> None:
        assert self.proc is not None
        await drain(self.proc.stdout, self._stdout_lines.feed)
        self._stdout_lines.flush()
        self._stdout_eof.set()

    async def _read_stderr(self) -> None:
        assert self.proc is not None

        def sink(chunk: bytes | bytearray) -> None:
            self.stderr.feed(chunk)

        await drain(self.proc.stderr, sink)
        self._stderr_eof.set()

    async def _flush_periodically(self) -> None:
        while not self._finished:
            await trio.sleep(FLUSH_INTERVAL_S)
            if not self._finished:
                self.backend.store.append(self.execution)

    def _on_stdout(self, line: str) -> None:
        ex = self.execution
        if ex.attached_probes is None:
            probes = _attach_count(line, ex.output_format)
            if probes is not None:
                ex.attached_probes = probes
                ex.attached_clock = trio.current_time()
                self._attached_or_exited.set()
                ex.notify()
                return
        if ex.output_format == "json" and not line.strip():
            return  # bpftrace separates map dumps with blank lines even in JSON mode
        if not ex.add_line(line) and ex.stop_reason is None:
            self.request_stop(StopReason.BUFFER_FULL)

    def request_stop(self, reason: StopReason) -> None:
        ex = self.execution
        if ex.stop_reason is None and not ex.finished:
            ex.stop_reason = reason
            log.info("stopping bpftrace", execution_id=ex.id, reason=str(reason))
            ex.notify()
        self._wake.set()

    def _finish(self) -> None:
        """Record how the run ended (the process is gone or being torn down) and persist it."""
        if self._finished:
            return
        self._finished = True
        ex = self.execution
        rc = None if self.proc is None else self.proc.returncode
        report = parse_stderr(self.stderr.text())
        ex.exit_code = rc if rc is not None and rc >= 0 else None
        ex.signal = _signal_name(rc) if rc is not None and rc < 0 else None
        if ex.stop_reason is not None:
            ex.status = STATUS_FOR_STOP[ex.stop_reason]
            if self.stop_step == "sigkill":
                ex.error = ("bpftrace did not exit after SIGINT within the grace period and was killed: "
                            "its final maps may be missing")
            elif self.stop_step == "unreaped":
                ex.error = "bpftrace was sent SIGKILL and was still detaching its probes when diagd stopped"
        elif rc == 0:
            ex.status = Status.COMPLETED
        else:
            ex.status = Status.FAILED
            if rc is not None and rc < 0:
                ex.error = f"bpftrace was killed by {ex.signal} (not by diagd)"
            else:
                reason = report.text().strip() or "no message on stderr"
                ex.error = f"bpftrace exited with status {rc}: {reason}"
                if doctor.tracefs_dir() is None and ("tracing" in reason or "tracepoint" in reason):
                    ex.error += f" (tracefs is not mounted: {_tracefs_fix()})"
        self._apply_diagnostics(report)
        ex.duration_s = ex.elapsed_s()
        ex.ended_at = time.time()
        self.slot.release()
        self.backend.finished(self)
        ex.notify()
        self._wake.set()

    def _apply_diagnostics(self, report: StderrReport) -> None:
        ex = self.execution
        items = [str(w) for w in report.warnings]
        if ex.status != Status.FAILED:  # a failed run shows these in `error`
            items += [f"error: {e}" for e in report.errors] + report.other
        ex.warnings = items[:MAX_WARNINGS]
        ex.notices = report.notices

    # -- requests

    async def handle(self, request: Request) -> dict[str, Any]:
        ex = self.execution
        if request.op == "result":
            if not self._finished:
                self._apply_diagnostics(parse_stderr(self.stderr.text()))
            return ex.page(int(request.args.get("offset", 0)), int(request.args.get("limit", 1000)))
        if request.op == "stop":
            self.request_stop(StopReason.REQUESTED)
            return ex.summary()
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown bpftrace op {request.op!r}")

    def statistics(self) -> dict[str, Any]:
        ex = self.execution
        return {"execution_id": ex.id, "status": str(ex.status), "pid": ex.pid, "lines_total": len(ex.lines),
                "attached_probes": ex.attached_probes, "elapsed_s": ex.elapsed_s(), "stopping": ex.stopping}

    def __repr__(self) -> str:
        return f"<BpftraceExecution {self.execution.id} [{self.execution.status}, lines: {len(self.execution.lines)}]>"


async def _close_pipes(proc: trio.Process) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()


def _attach_count(line: str, output_format: str) -> int | None:
    if output_format == "json":
        if not line.startswith('{"type": "attached_probes"'):
            return None
        data = parse_json_line(line).get("data")
        return int(data.get("probes", 0)) if isinstance(data, dict) else None
    found = _ATTACH_TEXT.match(line)
    return int(found[1]) if found else None


# ---------------------------------------------------------------------------------------------
# Short bpftrace commands: -l, --version, the helper check


async def run_command(argv: Sequence[str], timeout_s: float = 30.0, spawn: Spawn = open_process,
                      ) -> tuple[int, str, str]:
    """Run a short bpftrace command to completion: (exit code, stdout, stderr); always reaped."""
    try:
        proc = await spawn(argv)
    except FileNotFoundError:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {argv[0]!r}",
                         fix=doctor.APT_HINT.format(pkg="bpftrace")) from None
    out, err = bytearray(), bytearray()
    try:
        with trio.fail_after(timeout_s):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(drain, proc.stdout, out.extend)
                nursery.start_soon(drain, proc.stderr, err.extend)
                await proc.wait()
    except trio.TooSlowError:
        raise DiagdError(ErrorCode.TIMEOUT, f"{shlex.join(argv)[:200]} did not finish within {timeout_s:g} s") from None
    finally:
        await stop_process(proc, TERM_THEN_KILL)
        with trio.CancelScope(shield=True):
            await _close_pipes(proc)
    rc = proc.returncode
    return -1 if rc is None else rc, out.decode(errors="replace"), err.decode(errors="replace")


# ---------------------------------------------------------------------------------------------
# Probes


PROBE_ALIASES = {
    "t": "tracepoint", "k": "kprobe", "kr": "kretprobe", "u": "uprobe", "ur": "uretprobe", "U": "usdt",
    "s": "software", "h": "hardware", "p": "profile", "i": "interval", "f": "kfunc", "fr": "kretfunc",
    "w": "watchpoint", "aw": "asyncwatchpoint", "it": "iter",
}
PROBE_TYPES = frozenset({*PROBE_ALIASES.values(), "BEGIN", "END"})


def normalize_filter(raw: str) -> tuple[str | None, str]:
    """(the pattern to hand to `bpftrace -l`, or None to filter the full listing; the shown filter).

    bpftrace 0.17 aborts (SIGABRT) on `-l` patterns without a probe type such as `syscalls:*read*`,
    so those are matched here against the full listing instead.
    """
    text = raw.strip()
    head, sep, rest = text.partition(":")
    if sep and (head in PROBE_TYPES or head in PROBE_ALIASES):
        normalized = f"{PROBE_ALIASES.get(head, head)}:{rest}"
        return normalized, normalized
    return None, text


def _listing_warning(message: str) -> str:
    if "available_filter_functions" in message:
        return f"kprobe functions cannot be listed: {message}"
    if "available_events" in message:
        return f"tracepoints cannot be listed: {message}"
    return message


def match_listing(probes: list[str], pattern: str) -> list[str]:
    if not pattern:
        return probes
    if not any(c in pattern for c in "*?["):
        pattern = f"*{pattern}*"
    return [p for p in probes if fnmatch.fnmatchcase(p, pattern) or fnmatch.fnmatchcase(p.partition(":")[2], pattern)]


def tracepoint_args(probe: str) -> list[str] | None:
    """A tracepoint's fields from tracefs (what `bpftrace -lv` prints), without the common_ ones."""
    root = doctor.tracefs_dir()
    kind, _, rest = probe.partition(":")
    category, _, name = rest.partition(":")
    if root is None or kind != "tracepoint" or not name:
        return None
    try:
        text = (root / "events" / category / name / "format").read_text()
    except OSError:
        return None
    decls = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("field:"):
            decl = line[len("field:"):].split(";", 1)[0].strip()
            if not decl.rsplit(" ", 1)[-1].lstrip("*").startswith("common_"):
                decls.append(decl)
    return decls


# ---------------------------------------------------------------------------------------------
# Helpers (builtins and functions): a table for 0.17, checked against the installed binary


@dataclass(frozen=True)
class Helper:
    name: str
    kind: str  # builtin | map_function | function
    description: str
    signatures: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # unsafe, async, compile_time
    type: str | None = None  # builtins: the value type

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "description": self.description}
        if self.signatures:
            out["signatures"] = list(self.signatures)
        if self.flags:
            out["flags"] = list(self.flags)
        if self.type:
            out["type"] = self.type
        return out


def _b(name: str, type_: str, description: str) -> Helper:
    return Helper(name, "builtin", description, type=type_)


def _f(name: str, sig: str | tuple[str, ...], description: str, *flags: str, kind: str = "function") -> Helper:
    return Helper(name, kind, description, (sig,) if isinstance(sig, str) else sig, flags)


def _m(name: str, sig: str, description: str, *flags: str) -> Helper:
    return _f(name, sig, description, *flags, kind="map_function")


# bpftrace 0.17, from its man page and verified against the 0.17.0 binary (debugf, args, ctx and
# username work but are missing from the man page). At run time every name is checked again
# against the installed binary, and names only the installed man page knows are added.
HELPERS_0_17: tuple[Helper, ...] = (
    _b("$1, $2, ...$n", "int64", "Positional parameters (0 when absent; str($1) for strings)."),
    _b("$#", "int64", "Number of positional parameters."),
    _b("arg0, arg1, ...argn", "int64", "Arguments of the traced function, from registers (kprobe, uprobe, usdt)."),
    _b("sarg0, sarg1, ...sargn", "int64", "Arguments read from the stack (kprobe, uprobe)."),
    _b("args", "struct", "Arguments as a struct: args->filename (tracepoint, kfunc, uprobe with DWARF)."),
    _b("ctx", "pointer", "The probe's raw context (pt_regs, or the tracepoint record)."),
    _b("cgroup", "uint64", "cgroup v2 ID of the current task."),
    _b("comm", "string[16]", "Name of the current task, as in /proc/<pid>/comm."),
    _b("cpid", "uint32", "PID of the child started with -c (diagd does not use -c)."),
    _b("cpu", "uint32", "CPU running the probe."),
    _b("curtask", "uint64", "Pointer to the current task's struct task_struct."),
    _b("elapsed", "uint64", "Nanoseconds since bpftrace started."),
    _b("func", "string", "Name of the traced function (kprobe, uprobe, kfunc)."),
    _b("gid", "uint64", "Group ID of the current task."),
    _b("kstack", "kstack", "Kernel stack trace of the current task."),
    _b("nsecs", "uint64", "Nanoseconds since boot (including suspend where ktime_get_boot_ns exists)."),
    _b("numaid", "uint32", "NUMA node running the probe."),
    _b("pid", "uint64", "Process ID (thread group ID) of the current task."),
    _b("probe", "string", "Full name of the probe that fired."),
    _b("rand", "uint32", "A pseudo-random number."),
    _b("retval", "int64", "Return value of the traced function (kretprobe, uretprobe, kretfunc)."),
    _b("tid", "uint64", "Thread ID of the current task."),
    _b("uid", "uint64", "User ID of the current task."),
    _b("username", "string", "User name of the current task's UID."),
    _b("ustack", "ustack", "User-space stack trace of the current task."),
    _m("avg", "avg(int64 n)", "Running average of n."),
    _m("clear", "clear(map m)", "Remove every key of a map.", "async"),
    _m("count", "count()", "Count events (per-CPU map: cheaper than @++)."),
    _m("delete", "delete(map m[key])", "Delete one key of a map."),
    _m("hist", "hist(int64 n)", "Power-of-2 histogram of n."),
    _m("lhist", "lhist(int64 n, int64 min, int64 max, int64 step)", "Linear histogram of n over [min, max)."),
    _m("max", "max(int64 n)", "Largest n seen."),
    _m("min", "min(int64 n)", "Smallest n seen."),
    _m("stats", "stats(int64 n)", "Count, average and total of n in one map."),
    _m("sum", "sum(int64 n)", "Sum of n."),
    _m("zero", "zero(map m)", "Set every value of a map to zero.", "async"),
    _f("bswap", "uintN bswap(uintN n)", "Reverse the byte order of an integer."),
    _f("buf", "buf_t buf(void *data, [int64 length])", "Bytes at data, printable with %r (hex for non-ASCII)."),
    _f("cat", "void cat(string namefmt, [...args])", "Print a file's contents (printf-style name).", "async"),
    _f("cgroup_path", "cgroup_path_t cgroup_path(int cgroupid, [string filter])", "Path of a cgroup ID."),
    _f("cgroupid", "uint64 cgroupid(const string path)", "cgroup v2 ID of the cgroup at path.", "compile_time"),
    _f("debugf", "void debugf(string fmt, ...)", "printf to the kernel trace pipe (bpf_trace_printk), not stdout."),
    _f("exit", "void exit()", "Stop bpftrace as on SIGINT: END runs and maps are printed.", "async"),
    _f("join", "void join(char *arr[], [char *sep])", "Print a string array (e.g. argv) joined by sep.", "async"),
    _f("kaddr", "uint64 kaddr(const string name)", "Address of a kernel symbol.", "compile_time"),
    _f("kptr", "T *kptr(T *ptr)", "Mark a pointer as a kernel address space pointer."),
    _f("ksym", "ksym_t ksym(uint64 addr)", "Name of the kernel function containing addr.", "async"),
    _f("kstack", "kstack_t kstack([StackMode mode, ][int limit])", "Kernel stack with mode (bpftrace, perf, raw) "
       "and depth limit."),
    _f("macaddr", "macaddr_t macaddr(char[6] mac)", "A MAC address, printable with %s."),
    _f("ntop", "inet_t ntop([int af, ]int|char[4|16] addr)", "Text form of an IPv4 or IPv6 address."),
    _f("override", "void override(uint64 rc)", "Skip the probed kernel function and return rc (kprobe).", "unsafe"),
    _f("path", "char *path(struct path *path)", "Full path of a struct path (kfunc, kretfunc, iter; kernel 5.10)."),
    _f("print", ("void print(T val)", "void print(@map[, uint64 top[, uint64 div]])"),
       "Print a value or a map with its default formatting.", "async"),
    _f("printf", "void printf(const string fmt, args...)", "Formatted output.", "async"),
    _f("pton", "char addr[4|16] pton(const string addr)", "IPv4/IPv6 text address to bytes.", "compile_time"),
    _f("reg", "uint64 reg(const string name)", "Value of a CPU register (kprobe, uprobe)."),
    _f("signal", ("void signal(const string sig)", "void signal(uint32 signum)"),
       "Send a signal to the current task (kernel 5.3).", "unsafe"),
    _f("sizeof", ("uint64 sizeof(TYPE)", "uint64 sizeof(EXPRESSION)"), "Size in bytes of a type or expression.",
       "compile_time"),
    _f("skboutput", "uint32 skboutput(const string path, struct sk_buff *skb, uint64 length, const uint64 offset)",
       "Write sk_buff data to a PCAP file (kernel 5.5)."),
    _f("str", "string str(char *data[, uint32 length])", "Read a NUL-terminated string."),
    _f("strcontains", "int64 strcontains(const char *haystack, const char *needle)", "Whether haystack contains "
       "needle."),
    _f("strerror", "strerror_t strerror(int error)", "Text of an errno value."),
    _f("strftime", "timestamp strftime(const string fmt, int64 timestamp_ns)", "Format a boot-time ns timestamp as "
       "date/time.", "async"),
    _f("strncmp", "int64 strncmp(char *s1, char *s2, int64 n)", "Compare up to n characters (0 when equal)."),
    _f("system", "void system(string namefmt [, ...args])", "Run a shell command and print its output.", "unsafe",
       "async"),
    _f("time", "void time(const string fmt)", "Print the current wall-clock time.", "async"),
    _f("uaddr", "T *uaddr(const string sym)", "Address of a user-space symbol (uprobe; no ASLR support)."),
    _f("unwatch", "void unwatch(void *addr)", "Remove a watchpoint.", "async"),
    _f("uptr", "T *uptr(T *ptr)", "Mark a pointer as a user address space pointer."),
    _f("ustack", "ustack_t ustack([StackMode mode, ][int limit])", "User stack with mode and depth limit."),
    _f("usym", "usym_t usym(uint64 addr)", "Name of the user-space symbol containing addr.", "async"),
)

MAN_PAGES = (Path("/usr/share/man/man8/bpftrace.8.gz"), Path("/usr/local/share/man/man8/bpftrace.8.gz"),
             Path("/usr/share/man/man8/bpftrace.8"), Path("/usr/local/share/man/man8/bpftrace.8"))
_MAN_SECTIONS = {"MAP FUNCTIONS": "map_function", "FUNCTIONS": "function", "OUTPUT FORMATTING": "function"}
_ROFF = [(r"\(cq", "'"), (r"\(aq", "'"), (r"\*(Aq", "'"), (r"\(rs", "\\"), (r"\-", "-"), (r"\(bu", "*"),
         (r"\(lq", '"'), (r"\(rq", '"'), (r"\(em", "--"), (r"\(en", "-"), (r"\&", ""), (r"\c", "")]


def _unroff(text: str) -> str:
    text = re.sub(r"\\f(\(..|\[[^\]]*\]|.)", "", text)
    for escape, plain in _ROFF:
        text = text.replace(escape, plain)
    return re.sub(r"\s+", " ", text).strip()


def parse_man_page(text: str) -> list[Helper]:
    """Functions and map functions of the installed man page (asciidoctor roff): name, signatures,
    flags and the first sentence of the description."""
    helpers: list[Helper] = []
    section = ""
    entry: tuple[str, list[str]] | None = None

    def close() -> None:
        if entry is not None and section in _MAN_SECTIONS:
            helpers.append(_man_entry(entry[0], _MAN_SECTIONS[section], entry[1]))

    for line in text.splitlines():
        if found := re.match(r'^\.SH "(.*)"', line):
            close()
            section, entry = found[1], None
        elif found := re.match(r'^\.SS "(.*)"', line):
            close()
            entry = (found[1], [])
        elif entry is not None:
            entry[1].append(line)
    close()
    return helpers


def _man_entry(name: str, kind: str, lines: list[str]) -> Helper:
    signatures: list[str] = []
    flags: list[str] = []
    paragraphs: list[list[str]] = [[]]
    block, indented, literal = "", False, False
    for line in lines:
        if line.startswith(".B "):
            block = line[3:].strip()
        elif line.startswith(".RS"):
            indented = True
        elif line.startswith(".RE"):
            indented = False
        elif line.startswith(".nf"):
            literal = True
        elif line.startswith(".fi"):
            literal = False
        elif line.startswith(".sp"):
            paragraphs.append([])
        elif literal or line.startswith(".") or line.startswith("\\h'"):
            continue
        elif indented:
            if block == "variants":
                signatures.append(_unroff(line))
        elif _unroff(line) in ("unsafe", "async", "compile time"):
            flags.append(_unroff(line).replace(" ", "_"))
        elif not line.startswith(("\\fBKernel\\fP", "\\fBHelper\\fP")):
            paragraphs[-1].append(_unroff(line))
    prose = [" ".join(p) for p in paragraphs if p and not p[0].startswith(("Probe types", "Does not work"))]
    text = prose[0] if prose else ""
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z`'\"(])", text, maxsplit=1)[0]
    return Helper(name, kind, first[:200], tuple(signatures), tuple(flags))


def merged_helpers(man: list[Helper]) -> list[Helper]:
    known = {(h.name, h.kind) for h in HELPERS_0_17}
    return [*HELPERS_0_17, *(h for h in man if (h.name, h.kind) not in known)]


def verification_program(helpers: Sequence[Helper]) -> str:
    """A program naming every helper: a dry run of it reports the names the binary does not know."""
    calls = [f"{h.name}();" for h in helpers if h.kind != "builtin" and h.name.isidentifier()]
    reads = [f"$v{i} = {h.name};" for i, h in enumerate(helpers) if h.kind == "builtin" and h.name.isidentifier()]
    return "BEGIN { " + " ".join(reads + calls) + " }"


_UNKNOWN = re.compile(r"ERROR: Unknown (function|identifier): '?(\w+)'?")


# ---------------------------------------------------------------------------------------------
# The back end: settings, the executions, the tools


class BpftraceBackend:
    def __init__(self, daemon: Daemon, *, spawn: Spawn = open_process) -> None:
        self.daemon = daemon
        self.spawn = spawn
        self.store = ExecutionStore(daemon.state_dir / "bpftrace")
        self.live: dict[str, BpftraceExecution] = {}
        self.reserved = 0
        self._loaded: OrderedDict[str, Execution] = OrderedDict()
        self._listings: dict[tuple[str, str], tuple[float, list[str], list[str]]] = {}
        self._helpers: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._lock = trio.Lock()

    def settings(self) -> BpftraceSettings:
        # Parsed per call: `diagd reload` applies to the next call.
        return BpftraceSettings.parse(self.daemon.config.backend("bpftrace"))

    def shutting_down(self) -> bool:
        return self.daemon.shutdown_reason is not None

    def recover(self) -> None:
        if not self.store.root.exists():
            return
        recovered = self.store.recover()
        if recovered:
            log.info("executions interrupted by the last daemon exit", executions=recovered)

    # -- executions

    def reserve(self, settings: BpftraceSettings) -> Slot:
        if self.reserved >= settings.max_concurrent:
            running = [a.execution.id for a in self.live.values() if not a.execution.finished]
            raise DiagdError(ErrorCode.BUSY, f"{self.reserved} bpftrace executions are running (max_concurrent = "
                             f"{settings.max_concurrent}): wait for one to finish or stop one with stop_execution",
                             running=running, max_concurrent=settings.max_concurrent)
        self.reserved += 1
        return Slot(self)

    def new_id(self) -> str:
        while True:
            candidate = f"bt-{secrets.token_hex(4)}"
            if candidate not in self.live and not self.store.exists(candidate):
                return candidate

    def accepted(self, actor: BpftraceExecution) -> None:
        ex = actor.execution
        self.live[ex.id] = actor
        self.store.create(ex)
        self.store.prune(actor.config.keep_executions, protect=set(self.live))

    def finished(self, actor: BpftraceExecution) -> None:
        self.store.save(actor.execution)
        ex = actor.execution
        log.info("bpftrace execution ended", execution_id=ex.id, status=str(ex.status), lines=len(ex.lines),
                 exit_code=ex.exit_code, signal=ex.signal, duration_s=ex.duration_s)

    def forget(self, actor: BpftraceExecution) -> None:
        if self.live.get(actor.execution.id) is actor:
            del self.live[actor.execution.id]

    def retire(self, actor: BpftraceExecution) -> None:
        """A finished execution's actor leaves after linger_s; its results stay on disk."""
        ref = self.daemon.supervisor.find(KIND, actor.execution.id)
        if ref is not None and ref.actor is actor:
            self.daemon.supervisor.stop(ref.id, reason="execution finished")

    async def ask(self, ctx: CallContext, execution_id: str, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the execution's live actor; None when it has gone (the store has the final state)."""
        if execution_id not in self.live:
            return None
        try:
            result, queue_s = await self.daemon.supervisor.ask(KIND, execution_id, lambda: _GoneActor(execution_id),
                                                               op, args, progress=ctx.progress)
        except _ActorGone:
            return None
        except DiagdError as exc:
            if exc.code in (ErrorCode.ACTOR_FAILED, ErrorCode.CANCELLED) and execution_id not in self.live:
                return None
            raise
        ctx.queue_s += queue_s
        return result

    async def load(self, execution_id: str) -> Execution:
        self.store.path(execution_id)  # validates the id
        if (cached := self._loaded.get(execution_id)) is not None:
            self._loaded.move_to_end(execution_id)
            return cached
        ex = await trio.to_thread.run_sync(self.store.load, execution_id)
        if ex is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no bpftrace execution {execution_id!r}",
                             hint="list_executions shows the known ones")
        if ex.finished:
            self._loaded[execution_id] = ex
            while len(self._loaded) > 8:
                self._loaded.popitem(last=False)
        return ex

    async def execution(self, execution_id: str) -> Execution:
        actor = self.live.get(execution_id)
        return actor.execution if actor is not None else await self.load(execution_id)

    async def wait(self, ctx: CallContext, ex: Execution, offset: int, until: str, wait_s: float) -> None:
        """Block until there is output past `offset` (until=output) or the run ended, reporting progress."""
        deadline = trio.current_time() + wait_s
        next_progress = trio.current_time()
        while not ex.finished and not (until == "output" and len(ex.lines) > offset):
            now = trio.current_time()
            if now >= deadline:
                return
            if now >= next_progress and ex.attached_clock is not None:
                # Progress is the tracing time so far: it only grows (MCP requires that), and with
                # until=done its total is the timeout.
                next_progress = now + PROGRESS_INTERVAL_S
                elapsed = ex.elapsed_s()
                state = "stopping" if ex.stopping else "running"
                await ctx.report_progress(elapsed, ex.timeout_s if until == "done" else None,
                                          f"{state}: {len(ex.lines)} lines, {elapsed:.1f} s of {ex.timeout_s:g} s")
            with trio.move_on_at(min(deadline, next_progress)):
                await ex.wait_changed()

    # -- probes and helpers

    async def listing(self, settings: BpftraceSettings, pattern: str) -> tuple[list[str], list[str]]:
        key = (settings.path, pattern)
        cached = self._listings.get(key)
        if cached is not None and trio.current_time() - cached[0] < settings.probe_cache_s:
            return cached[1], cached[2]
        async with self._lock:
            cached = self._listings.get(key)
            if cached is not None and trio.current_time() - cached[0] < settings.probe_cache_s:
                return cached[1], cached[2]
            rc, out, err = await run_command(settings.command("-l", *([pattern] if pattern else [])),
                                             spawn=self.spawn)
            report = parse_stderr(err)
            located = [d for d in report.errors if d.line is not None]
            if rc != 0 and located:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"bpftrace rejected the filter {pattern!r}: "
                                 f"{located[0].message}", filter=pattern)
            if rc != 0:
                raise classify_failure(report, rc, before_attach=False, doing=f"listing probes ({pattern or 'all'})")
            probes = [line.strip() for line in out.splitlines() if line.strip() and not line[0].isspace()]
            warnings = [_listing_warning(w.message) for w in report.warnings] + report.notices
            self._listings[key] = (trio.current_time(), probes, warnings)
            return probes, warnings

    async def helpers(self, settings: BpftraceSettings) -> dict[str, Any]:
        binary = shutil.which(settings.path) or settings.path
        try:
            st = os.stat(binary)
            key: tuple[Any, ...] = (binary, st.st_mtime_ns, st.st_size, settings.privileged_helper)
        except OSError:
            key = (binary, settings.privileged_helper)
        if self._helpers is not None and self._helpers[0] == key:
            return self._helpers[1]
        async with self._lock:
            if self._helpers is not None and self._helpers[0] == key:
                return self._helpers[1]
            _rc, out, err = await run_command(settings.command("--version"), spawn=self.spawn)
            version = (out or err).strip().splitlines()[0] if (out or err).strip() else "unknown"
            man = next((p for p in MAN_PAGES if p.exists()), None)
            man_helpers: list[Helper] = []
            if man is not None:
                raw = man.read_bytes()
                man_helpers = parse_man_page((gzip.decompress(raw) if man.suffix == ".gz" else raw).decode(
                    errors="replace"))
            candidates = merged_helpers(man_helpers)
            unknown, verified = await self._unknown_to_binary(settings, candidates)
            helpers = [h for h in candidates if h.name not in unknown]
            result: dict[str, Any] = {
                "bpftrace_version": version,
                "source": ("table for bpftrace 0.17" + (f" + {man}" if man else "")
                           + (", every name checked against the installed binary" if verified
                              else ", NOT checked against the binary (its dry run did not analyse the program)")),
                "verified": verified,
                "not_in_installed_binary": sorted(unknown),
                "helpers": [h.to_json() for h in helpers],
            }
            if not version.startswith("bpftrace v0.17"):
                result["warning"] = (f"the table was written for bpftrace 0.17 and the installed one is {version}: "
                                     "names it lacks are dropped, newer ones come from its man page only")
            self._helpers = (key, result)
            return result

    async def _unknown_to_binary(self, settings: BpftraceSettings, helpers: list[Helper]) -> tuple[set[str], bool]:
        """(names the binary rejects as unknown, whether it analysed the program at all).

        The program calls every function without arguments, so the semantic analyser always reports
        something; it stops at the first unknown function, hence the loop. -d never attaches.
        """
        unknown: set[str] = set()
        for _ in range(10):
            program = verification_program([h for h in helpers if h.name not in unknown])
            _rc, _out, err = await run_command(settings.command("-d", "-e", program), spawn=self.spawn)
            if not parse_stderr(err).errors or "only supports running as the root user" in err:
                return unknown, False
            found = {m[2] for m in _UNKNOWN.finditer(err)} - unknown
            if not found:
                return unknown, True
            unknown |= found
        return unknown, True


# ---------------------------------------------------------------------------------------------
# Tools

_ID = {"type": "string", "pattern": EXECUTION_ID.pattern, "description": "as returned by exec_program"}
_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_STATE_PROPS: dict[str, Any] = {
    "execution_id": {"type": "string"},
    "status": {"type": "string", "enum": [str(s) for s in Status]},
    "output_format": {"type": "string", "enum": ["text", "json"]},
    "exit_code": _NULLABLE_INT,
    "signal": _NULLABLE_STR,
    "error": _NULLABLE_STR,
    "warnings": {"type": "array", "items": {"type": "string"}},
    "notices": {"type": "array", "items": {"type": "string"}},
    "buffer_full": {"type": "boolean"},
    "lines_dropped": {"type": "integer"},
    "truncated": {"type": "boolean"},
    "lost_events": {"type": "integer"},
    "attached_probes": _NULLABLE_INT,
    "stop_reason": _NULLABLE_STR,
    "stopping": {"type": "boolean"},
    "timeout_s": {"type": "number"},
    "elapsed_s": {"type": "number"},
    "created_at": _NULLABLE_STR,
    "ended_at": _NULLABLE_STR,
    "lines_total": {"type": "integer"},
}
_SUMMARY: dict[str, Any] = {
    "type": "object",
    "properties": {**_STATE_PROPS, "program": {"type": "string"}},
    "required": ["execution_id", "status", "lines_total"],
}
_RESULT_OUTPUT = {
    "type": "object",
    "properties": {
        **_STATE_PROPS,
        "offset": {"type": "integer"},
        "lines_returned": {"type": "integer"},
        "output": {"type": "array", "items": {"type": ["string", "object"]}},
        "has_more": {"type": "boolean"},
        "next_offset": {"type": "integer"},
        "maps": {"type": ["object", "null"]},
    },
    "required": ["execution_id", "status", "lines_total", "lines_returned", "output", "has_more", "exit_code",
                 "error"],
}
_EXEC_OUTPUT = {
    "type": "object",
    "properties": {"execution_id": {"type": "string"}, "status": _STATE_PROPS["status"],
                   "attached_probes": _NULLABLE_INT, "timeout_s": {"type": "number"},
                   "output_format": _STATE_PROPS["output_format"], "pid": _NULLABLE_INT,
                   "lines_total": {"type": "integer"}, "hint": {"type": "string"}},
    "required": ["execution_id", "status"],
}
_PROBES_OUTPUT = {
    "type": "object",
    "properties": {
        "probes": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        "total": {"type": "integer"},
        "offset": {"type": "integer"},
        "returned": {"type": "integer"},
        "has_more": {"type": "boolean"},
        "next_offset": {"type": "integer"},
        "filter": _NULLABLE_STR,
        "tracefs_mounted": {"type": "boolean"},
        "warnings": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["probes", "total", "has_more", "tracefs_mounted"],
}
_HELPERS_OUTPUT = {
    "type": "object",
    "properties": {
        "bpftrace_version": {"type": "string"},
        "source": {"type": "string"},
        "total": {"type": "integer"},
        "helpers": {"type": "array", "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "kind": {"type": "string"}, "description": {"type": "string"},
                           "signatures": {"type": "array", "items": {"type": "string"}},
                           "flags": {"type": "array", "items": {"type": "string"}}, "type": {"type": "string"}},
            "required": ["name", "kind", "description"]}},
        "not_in_installed_binary": {"type": "array", "items": {"type": "string"}},
        "verified": {"type": "boolean"},
        "warning": {"type": "string"},
    },
    "required": ["bpftrace_version", "helpers", "total", "verified"],
}
_EXECUTIONS_OUTPUT = {
    "type": "object",
    "properties": {"executions": {"type": "array", "items": _SUMMARY}, "total": {"type": "integer"},
                   "running": {"type": "integer"}, "max_concurrent": {"type": "integer"}},
    "required": ["executions", "total", "running", "max_concurrent"],
}


def register(daemon: Daemon) -> BpftraceBackend:
    """Register the six tools; returns the back end (the daemon ignores it, tests use it)."""
    backend = BpftraceBackend(daemon)
    backend.recover()
    registry = daemon.registry

    async def list_probes(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        settings = backend.settings()
        check_privileges(settings)
        pattern, shown = normalize_filter(args.get("filter") or "")
        tracefs = doctor.tracefs_dir() is not None
        if not tracefs and pattern is not None and pattern.startswith("tracepoint:"):
            raise _tracefs_error("no tracepoint can be listed or attached", filter=shown)
        if pattern is not None:
            probes, warnings = await backend.listing(settings, pattern)
        else:
            everything, warnings = await backend.listing(settings, "")
            probes = match_listing(everything, shown)
        if not tracefs:
            if not probes and shown:
                raise _tracefs_error(f"nothing matches {shown!r} (tracepoints cannot be listed)", filter=shown)
            warnings = [f"tracefs is not mounted: tracepoints are missing from this list; fix as root: "
                        f"{_tracefs_fix()}", *warnings]
        offset, limit = args.get("offset", 0), args.get("limit", 200)
        chosen = probes[offset:offset + limit]
        result: dict[str, Any] = {
            "probes": chosen, "total": len(probes), "offset": offset, "returned": len(chosen),
            "has_more": offset + len(chosen) < len(probes), "next_offset": min(offset + len(chosen), len(probes)),
            "filter": shown or None, "tracefs_mounted": tracefs, "warnings": warnings,
        }
        if args.get("with_args"):
            found = await trio.to_thread.run_sync(lambda: {p: tracepoint_args(p) for p in chosen})
            result["args"] = {p: a for p, a in found.items() if a is not None}
        return result

    async def list_helpers(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        settings = backend.settings()
        found = await backend.helpers(settings)
        helpers = found["helpers"]
        if kind := args.get("kind"):
            helpers = [h for h in helpers if h["kind"] == kind]
        if name := args.get("name"):
            helpers = [h for h in helpers if name.lower() in h["name"].lower()]
        return {**found, "helpers": helpers, "total": len(helpers)}

    async def exec_program(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        settings = backend.settings()
        program = args["program"]
        if not program.strip():
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "the program is empty")
        timeout = float(args.get("timeout", settings.default_timeout_s))
        if timeout > settings.max_run_s:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"timeout {timeout:g} s exceeds [bpftrace] max_run_s = "
                             f"{settings.max_run_s:g}", max_run_s=settings.max_run_s)
        output_format = args.get("output_format", "text")
        check_privileges(settings)
        slot = backend.reserve(settings)
        try:
            ex = Execution(id=backend.new_id(), program=program, output_format=output_format, timeout_s=timeout,
                           max_lines=settings.max_lines, max_bytes=settings.max_output_bytes)
            argv = settings.command("-f", output_format, *(["--unsafe"] if settings.allow_unsafe else []),
                                    "-e", program)
            actor = BpftraceExecution(ex, backend, settings, argv, slot)
            # The actor must not idle out while bpftrace runs: its idle timeout covers the whole run and
            # the longest stop; once finished it retires itself after linger_s.
            idle_s = timeout + MAX_SIGINT_GRACE_S + MAX_KILL_WAIT_S + settings.linger_s + 10
            await daemon.supervisor.get_or_start(KIND, ex.id, lambda: actor, idle_timeout_s=idle_s)
        except BaseException:
            slot.release()
            raise
        return {"execution_id": ex.id, "status": str(ex.status), "attached_probes": ex.attached_probes,
                "timeout_s": timeout, "output_format": output_format, "pid": ex.pid, "lines_total": len(ex.lines),
                "hint": "page the output with get_result (wait_s waits for output or the end); stop_execution "
                        "stops it gracefully"}

    async def get_result(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        execution_id = args["execution_id"]
        offset, limit = args.get("offset", 0), args.get("limit", 1000)
        actor = backend.live.get(execution_id)
        if actor is not None and args.get("wait_s", 0) > 0:
            await backend.wait(ctx, actor.execution, offset, args.get("until", "output"), args["wait_s"])
        page = await backend.ask(ctx, execution_id, "result", {"offset": offset, "limit": limit})
        if page is None:
            page = (await backend.load(execution_id)).page(offset, limit)
        return page

    async def stop_execution(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        execution_id = args["execution_id"]
        actor = backend.live.get(execution_id)
        if actor is None or actor.execution.finished:
            ex = await backend.execution(execution_id)
            return {**ex.summary(), "already_finished": True}
        await backend.ask(ctx, execution_id, "stop", {})
        with trio.move_on_after(STOP_WAIT_MAX_S):
            while not actor.execution.finished:
                await actor.execution.wait_changed()
        return {**actor.execution.summary(), "already_finished": False}

    async def list_executions(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        settings = backend.settings()
        metas = await trio.to_thread.run_sync(backend.store.metas) if backend.store.root.exists() else []
        rows: dict[str, dict[str, Any]] = {}
        for meta in metas:
            with contextlib.suppress(KeyError, ValueError, TypeError):
                rows[meta["id"]] = Execution.from_meta(meta, []).summary() | {"lines_total": meta["lines_total"]}
        for execution_id, actor in backend.live.items():
            rows[execution_id] = actor.execution.summary()
        ordered = sorted(rows.values(), key=lambda r: r.get("created_at") or "", reverse=True)
        if status := args.get("status"):
            ordered = [r for r in ordered if r["status"] == status]
        limit = args.get("limit", 50)
        running = sum(1 for a in backend.live.values() if not a.execution.finished)
        return {"executions": ordered[:limit], "total": len(ordered), "running": running,
                "max_concurrent": settings.max_concurrent}

    registry.register(ToolSpec(
        name="list_probes", title="List bpftrace probes",
        description="Probes bpftrace can attach to, paged (offset/limit). filter: `tracepoint:sched:*`, "
                    "`t:syscalls:*openat*` (handed to `bpftrace -l`), or without a probe type "
                    "(`syscalls:*read*`, `openat`: matched against the full listing; no wildcard = substring). "
                    "with_args adds each tracepoint's fields (args->name in programs).",
        input_schema={"type": "object", "properties": {
            "filter": {"type": "string", "maxLength": 512},
            "offset": {"type": "integer", "minimum": 0, "default": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": 5000, "default": 200},
            "with_args": {"type": "boolean", "default": False},
        }, "additionalProperties": False},
        output_schema=_PROBES_OUTPUT, handler=list_probes, timeout_s=60,
    ))
    registry.register(ToolSpec(
        name="list_helpers", title="List bpftrace builtins and functions",
        description="The builtins (pid, comm, nsecs, kstack, ...), map functions (count, hist, lhist, stats, ...) "
                    "and functions (printf, str, ksym, ...) of the installed bpftrace, with signatures, one-line "
                    "descriptions and flags (unsafe: needs [bpftrace] allow_unsafe; async: runs in user space "
                    "later).",
        input_schema={"type": "object", "properties": {
            "kind": {"type": "string", "enum": ["builtin", "map_function", "function"]},
            "name": {"type": "string", "description": "substring of the name"},
        }, "additionalProperties": False},
        output_schema=_HELPERS_OUTPUT, handler=list_helpers, timeout_s=60,
    ))
    registry.register(ToolSpec(
        name="exec_program", title="Run a bpftrace program",
        description="Start a bpftrace program and return its execution_id as soon as its probes attach; it runs "
                    "in the background for up to `timeout` seconds (then SIGINT: END runs and maps are printed, "
                    "status timed_out). A program bpftrace rejects (syntax, unknown probe, type error) fails at "
                    "once with INVALID_ARGUMENT and the line/column. output_format json: one JSON event per line, "
                    "maps and histograms as data. At most max_concurrent runs at a time (else BUSY).",
        input_schema={"type": "object", "properties": {
            "program": {"type": "string", "minLength": 1, "maxLength": 65536},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600, "default": 10,
                        "description": "tracing seconds, counted from the attach; at most [bpftrace] "
                                       "max_run_s (default 60)"},
            "output_format": {"type": "string", "enum": ["text", "json"], "default": "text"},
        }, "required": ["program"], "additionalProperties": False},
        output_schema=_EXEC_OUTPUT, handler=exec_program, read_only=False, idempotent=False, timeout_s=60,
    ))
    registry.register(ToolSpec(
        name="get_result", title="Page through a bpftrace execution's output",
        description="Status and buffered output of an execution (running or finished, also after a daemon "
                    "restart), from `offset`, at most `limit` lines. wait_s > 0 waits (with progress "
                    "notifications) until there is output past offset (until=output) or the run has ended "
                    "(until=done). JSON runs also return `maps`: the last value of every map and histogram.",
        input_schema={"type": "object", "properties": {
            "execution_id": _ID,
            "offset": {"type": "integer", "minimum": 0, "default": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
            "wait_s": {"type": "number", "minimum": 0, "maximum": 120, "default": 0},
            "until": {"type": "string", "enum": ["output", "done"], "default": "output"},
        }, "required": ["execution_id"], "additionalProperties": False},
        output_schema=_RESULT_OUTPUT, handler=get_result, timeout_s=130,
    ))
    registry.register(ToolSpec(
        name="stop_execution", title="Stop a bpftrace execution",
        description="Stop a running execution gracefully (SIGINT: END runs and final maps are printed; SIGKILL "
                    "after a grace period that grows with the number of probes) and return its final state. "
                    "Output is kept.",
        input_schema={"type": "object", "properties": {"execution_id": _ID},
                      "required": ["execution_id"], "additionalProperties": False},
        output_schema={**_SUMMARY, "properties": {**_SUMMARY["properties"], "already_finished": {"type": "boolean"}}},
        handler=stop_execution, read_only=False, idempotent=True, timeout_s=STOP_WAIT_MAX_S + 10,
    ))
    registry.register(ToolSpec(
        name="list_executions", title="List bpftrace executions",
        description="Executions newest first (running and persisted ones): id, status, program, line count, "
                    "exit code, error; plus how many run now and the concurrency limit.",
        input_schema={"type": "object", "properties": {
            "status": {"type": "string", "enum": [str(s) for s in Status]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
        }, "additionalProperties": False},
        output_schema=_EXECUTIONS_OUTPUT, handler=list_executions,
    ))
    return backend
