"""The actor of one bpftrace execution: it owns the bpftrace process, reads its output into the
`Execution`, stops it (SIGINT, then SIGKILL) and records how it ended. See the package docstring."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from typing import Any, Protocol

import structlog
import trio

from diagd.actors import system
from diagd.actors._subprocess import LineSplitter, Step, Tail, drain, stop_process
from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy, unhandled
from diagd.actors.bpftrace.execution import STATUS_FOR_STOP, Execution
from diagd.actors.bpftrace.messages import Page, Stop
from diagd.actors.bpftrace.parse import (
    ATTACHED_MARKER,
    StderrReport,
    attach_count,
    classify_failure,
    parse_stderr,
    signal_name,
    tracefs_fix,
)
from diagd.actors.bpftrace.settings import BpftraceSettings
from diagd.actors.bpftrace.status import Status, StopReason
from diagd.actors.bpftrace.store import ExecutionStore
from diagd.actors.bpftrace.store import proc_starttime as _proc_starttime
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.bpftrace")

KIND = "bpftrace"



MAX_LINE_BYTES = 4 * 1024 * 1024  # one JSON map dump is one line
STDERR_TAIL_BYTES = 64 * 1024
FLUSH_INTERVAL_S = 0.5
# An accepted run's record is first written this long after the accept (or at its end, if sooner): not
# before exec_program's answer, which waited ~1 ms for it (more on a busy disk).
PERSIST_AFTER_S = 0.01
PIPE_EOF_GRACE_S = 2.0  # after exit, a grandchild (system()) may still hold the pipes
SHUTDOWN_SIGINT_S = 3.0  # daemon shutdown: short SIGINT grace, then SIGKILL
SHUTDOWN_KILL_S = 10.0
STOP_WAIT_MAX_S = 85.0
PROGRESS_INTERVAL_S = 0.5
MAX_WARNINGS = 50


# ---------------------------------------------------------------------------------------------
# The actor


class Host(Protocol):
    """What an execution's actor needs of the back end that owns it and that it reports to
    (backend.BpftraceBackend, which imports this module)."""

    reserved: int  # slots held (a `Slot` gives its one back)
    store: ExecutionStore

    def shutting_down(self) -> bool: ...

    async def launch(self, argv: Sequence[str], *, env: dict[str, str] | None,
                     settings: BpftraceSettings) -> trio.Process: ...

    def accepted(self, actor: BpftraceExecution) -> None: ...

    def persist(self, actor: BpftraceExecution) -> None: ...

    async def prune(self, keep: int) -> None: ...

    def past_start(self) -> None: ...

    def finished(self, actor: BpftraceExecution) -> None: ...

    def forget(self, actor: BpftraceExecution) -> None: ...

    def retire(self, actor: BpftraceExecution) -> None: ...


class Slot:
    """One of the max_concurrent places; held from before the spawn until the process is reaped."""

    def __init__(self, backend: Host) -> None:
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

    def __init__(self, execution: Execution, backend: Host, settings: BpftraceSettings,
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
        self._stderr_lines = LineSplitter(self._on_stderr)
        # bpftrace prints "Attaching N probes..." before it attaches them, and a probe that then
        # fails to attach ends the run. With __BPFTRACE_NOTIFY_PROBES_ATTACHED in its environment
        # (the hook of bpftrace's own runtime tests) it says on stderr when every probe is attached,
        # so exec_program answers only then. sudo (privileged_helper) drops the variable from the
        # environment, so through a helper the announcement has to do.
        self.confirm_attach = not settings.helper_argv
        self._attached_or_exited = trio.Event()
        self._attach_confirmed = trio.Event()  # the marker arrived
        self._confirmed_or_exited = trio.Event()
        self._decided = trio.Event()  # start() accepted or refused the run
        self._wake = trio.Event()  # a stop was requested, or the process exited
        self._stdout_eof = trio.Event()
        self._stderr_eof = trio.Event()
        self._finished = False
        self._persisted = False

    # -- lifecycle

    async def spawn(self) -> None:
        """Start the bpftrace process (once). exec_program does it before it starts the actor: a confined
        run's launcher (a standby's, most often) takes its sandbox steps while the daemon starts the actor,
        a scheduler pass or two. Until start() runs, `discard` is what ends the process."""
        if self.proc is not None:
            return
        ex = self.execution
        try:
            env = {**os.environ, ATTACHED_MARKER: "1"} if self.confirm_attach else None
            self.proc = await self.backend.launch(self.argv, env=env, settings=self.config)
        except FileNotFoundError:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {self.argv[0]!r}",
                             fix=system.APT_HINT.format(pkg="bpftrace")) from None
        except PermissionError as exc:
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot execute {self.argv[0]!r}: {exc}") from None
        ex.pid = self.proc.pid
        ex.pid_start = _proc_starttime(self.proc.pid)
        ex.started_clock = trio.current_time()

    async def discard(self) -> None:
        """exec_program failed after `spawn`: SIGKILL the process if it still runs, reap it, close its
        pipes (nothing, when the actor's own stop() did so already)."""
        if self.proc is not None:
            if self.proc.returncode is None:
                await stop_process(self.proc, (Step("sigkill", signal.SIGKILL, SHUTDOWN_KILL_S),))
            await _close_pipes(self.proc)

    async def start(self, nursery: trio.Nursery) -> None:
        ex = self.execution
        try:
            await self.spawn()
            assert self.proc is not None
            nursery.start_soon(self._run)
            with trio.move_on_after(self.config.start_timeout_s):
                await self._attached_or_exited.wait()
                if self.confirm_attach and ex.attached_probes is not None:
                    await self._confirmed_or_exited.wait()
            # Slower than start_timeout_s (thousands of probes): accepted as running, timer started.
            self.timer.deadline = trio.current_time() + ex.timeout_s
            if not self._attached() and self.proc.returncode is not None:
                # Exited before its probes were attached: read both pipes to the end before deciding.
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stdout_eof.wait()
                    await self._stderr_eof.wait()
                if not self._attached() and self.proc.returncode != 0:
                    raise classify_failure(parse_stderr(self.stderr.text()), self.proc.returncode,
                                           before_attach=ex.attached_probes is None)
            self.accepted = True
            self.backend.accepted(self)
            nursery.start_soon(self._flush_periodically)
        finally:
            self._decided.set()

    def _attached(self) -> bool:
        if self.execution.attached_probes is None:
            return False
        return self._attach_confirmed.is_set() or not self.confirm_attach

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
                    self.request_stop(StopReason.DURATION)
                if proc.returncode is None:
                    self.stop_step = await stop_process(proc, self.config.stop_steps(self.execution.attached_probes))
                    if self.stop_step == "unreaped":
                        await proc.wait()  # SIGKILL is sent: the kernel is still detaching probes
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stdout_eof.wait()
                    await self._stderr_eof.wait()
                pipes.cancel_scope.cancel(reason="bpftrace exited")
            await _close_pipes(proc)  # now, not after the linger (or whenever the GC gets to them)
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
        self.backend.past_start()
        self._attached_or_exited.set()
        self._confirmed_or_exited.set()
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
            self._stderr_lines.feed(chunk)

        await drain(self.proc.stderr, sink)
        self._stderr_lines.flush()
        self._stderr_eof.set()

    def _on_stderr(self, line: str) -> None:
        if line == ATTACHED_MARKER and not self._attach_confirmed.is_set():
            ex = self.execution
            ex.attached_clock = trio.current_time()  # tracing time starts now, not at the announcement
            self._attach_confirmed.set()
            self._confirmed_or_exited.set()
            ex.notify()

    def _persist(self) -> None:
        """Write the run's record (its directory, meta.json), once."""
        if not self._persisted:
            self._persisted = True
            self.backend.persist(self)

    async def _flush_periodically(self) -> None:
        await trio.sleep(PERSIST_AFTER_S)
        if not self._finished:
            self._persist()
        await self.backend.prune(self.config.keep_executions)
        while not self._finished:
            await trio.sleep(FLUSH_INTERVAL_S)
            if not self._finished:
                self.backend.store.append(self.execution)

    def _on_stdout(self, line: str) -> None:
        ex = self.execution
        if ex.attached_probes is None:
            probes = attach_count(line, ex.output_format)
            if probes is not None:
                ex.attached_probes = probes
                ex.attached_clock = trio.current_time()
                self._attached_or_exited.set()
                ex.notify()
                return
        if ex.output_format == "json" and not line.strip():
            return  # bpftrace separates map dumps with blank lines even in JSON mode
        if not ex.lines:
            self.backend.past_start()
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
        ex.signal = signal_name(rc) if rc is not None and rc < 0 else None
        if ex.stop_reason is not None:
            ex.status = STATUS_FOR_STOP[ex.stop_reason]
            if self.stop_step in ("sigkill", "unreaped") and ex.status == Status.COMPLETED:
                ex.status = Status.STOPPED  # killed: not a normal end, whatever asked for it
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
                if system.tracefs_dir() is None and ("tracing" in reason or "tracepoint" in reason):
                    ex.error += f" (tracefs is not mounted: {tracefs_fix()})"
        self._apply_diagnostics(report)
        ex.duration_s = ex.elapsed_s()
        ex.ended_at = time.time()
        self.slot.release()
        self._persist()
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
        match request.message:
            case Page(offset=offset, limit=limit, times=times) as page:
                if not self._finished:
                    self._apply_diagnostics(parse_stderr(self.stderr.text()))
                return page.reply(ex.page(offset, limit, times=times))
            case Stop() as stop:
                self.request_stop(StopReason.REQUESTED)
                return stop.reply(ex.summary())
        raise unhandled("bpftrace", request)

    def statistics(self) -> dict[str, Any]:
        ex = self.execution
        return {"execution_id": ex.id, "status": str(ex.status), "pid": ex.pid, "lines_total": len(ex.lines),
                "attached_probes": ex.attached_probes, "elapsed_s": ex.elapsed_s(), "stopping": ex.stopping,
                "workers": system.workers((self.proc.pid if self.proc and self.proc.returncode is None else None,
                                           "bpftrace"))}

    def __repr__(self) -> str:
        return f"<BpftraceExecution {self.execution.id} [{self.execution.status}, lines: {len(self.execution.lines)}]>"


async def _close_pipes(proc: trio.Process) -> None:
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            await stream.aclose()
