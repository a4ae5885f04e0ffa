"""The bpftrace actor: one actor per execution, owning its bpftrace process and output buffer.

`exec_program` starts an actor (kind "bpftrace", resource = execution id) whose `start()` spawns
bpftrace and returns once its probes are attached or it has exited. bpftrace announces them
("Attaching N probes...", or `attached_probes` in JSON mode) after its own parser and semantic
analyser have passed, so a syntax error, an unknown tracepoint or an unsafe builtin comes back at
once as a coded error with line and column, at no extra cost; it attaches them afterwards and says
so on stderr when __BPFTRACE_NOTIFY_PROBES_ATTACHED is in its environment, so a probe the kernel
refuses (a kprobe on a kernel without kprobe_events) is exec_program's answer too, not a surprise
in get_result. (Through privileged_helper sudo drops that variable: there the announcement has to
do.) (bpftrace
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
import os
import secrets
import shutil
import signal
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog
import trio

from diagd.actors import system

# `name as name` imports re-export what the tests reach through this module.
from diagd.actors._bpftrace_execution import STATUS_FOR_STOP, Execution, Status, StopReason
from diagd.actors._bpftrace_helpers import HELPERS_0_17 as HELPERS_0_17
from diagd.actors._bpftrace_helpers import MAN_PAGES as MAN_PAGES
from diagd.actors._bpftrace_helpers import (
    UNKNOWN,
    Helper,
    merged_helpers,
    read_installed_man_page,
    verification_program,
)
from diagd.actors._bpftrace_helpers import parse_man_page as parse_man_page
from diagd.actors._bpftrace_parse import _UNSAFE as _UNSAFE
from diagd.actors._bpftrace_parse import ATTACHED_MARKER as ATTACHED_MARKER
from diagd.actors._bpftrace_parse import (
    StderrReport,
    classify_failure,
    parse_stderr,
    signal_name,
    tracefs_error,
    tracefs_fix,
)
from diagd.actors._bpftrace_parse import attach_count as attach_count
from diagd.actors._bpftrace_probes import listing_warning, match_listing, normalize_filter, tracepoint_args
from diagd.actors._bpftrace_schemas import (
    EXEC_OUTPUT,
    EXECUTION_ID_ARG,
    EXECUTIONS_OUTPUT,
    HELPERS_OUTPUT,
    PROBES_OUTPUT,
    RESULT_OUTPUT,
    STOP_OUTPUT,
)
from diagd.actors._bpftrace_settings import (
    MAX_KILL_WAIT_S,
    MAX_SIGINT_GRACE_S,
    BpftraceSettings,
    check_confinement,
    check_privileges,
)
from diagd.actors._bpftrace_store import EXECUTION_ID as EXECUTION_ID
from diagd.actors._bpftrace_store import ExecutionStore
from diagd.actors._bpftrace_store import _kill_leftover as _kill_leftover
from diagd.actors._bpftrace_store import proc_starttime as _proc_starttime
from diagd.actors._subprocess import (
    LineSplitter,
    Spawn,
    Step,
    Tail,
    drain,
    open_process,
    run,
    stop_process,
)
from diagd.actors.base import Actor, ActorGone, Op, Request, RestartKind, SupervisionPolicy
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.bpftrace")

KIND = "bpftrace"



MAX_LINE_BYTES = 4 * 1024 * 1024  # one JSON map dump is one line
STDERR_TAIL_BYTES = 64 * 1024
FLUSH_INTERVAL_S = 0.5
PIPE_EOF_GRACE_S = 2.0  # after exit, a grandchild (system()) may still hold the pipes
SHUTDOWN_SIGINT_S = 3.0  # daemon shutdown: short SIGINT grace, then SIGKILL
SHUTDOWN_KILL_S = 10.0
STOP_WAIT_MAX_S = 85.0
PROGRESS_INTERVAL_S = 0.5
MAX_WARNINGS = 50


# ---------------------------------------------------------------------------------------------
# The actor


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

    # -- lifecycle

    async def start(self, nursery: trio.Nursery) -> None:
        ex = self.execution
        try:
            try:
                env = {**os.environ, ATTACHED_MARKER: "1"} if self.confirm_attach else None
                self.proc = await self.backend.spawn(self.argv, env=env)
            except FileNotFoundError:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {self.argv[0]!r}",
                                 fix=system.APT_HINT.format(pkg="bpftrace")) from None
            except PermissionError as exc:
                raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot execute {self.argv[0]!r}: {exc}") from None
            ex.pid = self.proc.pid
            ex.pid_start = _proc_starttime(self.proc.pid)
            ex.started_clock = trio.current_time()
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
                    self.request_stop(StopReason.TIMEOUT)
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

    async def _flush_periodically(self) -> None:
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



# ---------------------------------------------------------------------------------------------
# Short bpftrace commands: -l, --version, the helper check


async def run_command(argv: Sequence[str], timeout_s: float = 30.0, spawn: Spawn = open_process,
                      ) -> tuple[int, str, str]:
    """Run a short bpftrace command to completion: (exit code, stdout, stderr); always reaped."""
    done = await run(argv, timeout_s=timeout_s, spawn=spawn, fix=system.APT_HINT.format(pkg="bpftrace"))
    return done.returncode, done.out, done.stderr


# ---------------------------------------------------------------------------------------------
# The back end: settings, the executions, the tools


class BpftraceBackend:
    def __init__(self, runtime: Runtime, *, spawn: Spawn = open_process) -> None:
        self.runtime = runtime
        self.spawn = spawn
        self.store = ExecutionStore(runtime.state_dir)
        self.live: dict[str, BpftraceExecution] = {}
        self.reserved = 0
        self._loaded: OrderedDict[str, Execution] = OrderedDict()
        self._listings: dict[tuple[str, str], tuple[float, list[str], list[str]]] = {}
        self._helpers: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._lock = trio.Lock()

    def settings(self) -> BpftraceSettings:
        # Parsed per call: `diagd reload` applies to the next call.
        return BpftraceSettings.parse(self.runtime.config().table)

    def shutting_down(self) -> bool:
        return self.runtime.shutting_down

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
        ref = self.runtime.find(KIND, actor.execution.id)
        if ref is not None and ref.actor is actor:
            self.runtime.stop(ref, reason="execution finished")

    async def ask(self, ctx: CallContext, execution_id: str, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """Ask the execution's live actor; None when it has gone (the store has the final state)."""
        ref = self.runtime.find(KIND, execution_id) if execution_id in self.live else None
        if ref is None:
            return None
        try:
            return await self.runtime.ask(ref, Op(op, args), progress=ctx.progress)
        except ActorGone:
            return None
        except DiagdError as exc:
            if exc.code in (ErrorCode.ACTOR_FAILED, ErrorCode.CANCELLED) and execution_id not in self.live:
                return None
            raise

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
            warnings = [listing_warning(w.message) for w in report.warnings] + report.notices
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
            man, man_helpers = read_installed_man_page()
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
            found = {m[2] for m in UNKNOWN.finditer(err)} - unknown
            if not found:
                return unknown, True
            unknown |= found
        return unknown, True



# ---------------------------------------------------------------------------------------------
# Tools


def register(runtime: Runtime) -> BpftraceBackend:
    """Register the six tools; returns the back end (the daemon ignores it, tests use it)."""
    backend = BpftraceBackend(runtime)
    backend.recover()

    async def list_probes(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        settings = backend.settings()
        check_privileges(settings)
        pattern, shown = normalize_filter(args.get("filter") or "")
        tracefs = system.tracefs_dir() is not None
        if not tracefs and pattern is not None and pattern.startswith("tracepoint:"):
            raise tracefs_error("no tracepoint can be listed or attached", filter=shown)
        if pattern is not None:
            probes, warnings = await backend.listing(settings, pattern)
        else:
            everything, warnings = await backend.listing(settings, "")
            probes = match_listing(everything, shown)
        if not tracefs:
            if not probes and shown:
                raise tracefs_error(f"nothing matches {shown!r} (tracepoints cannot be listed)", filter=shown)
            warnings = [f"tracefs is not mounted: tracepoints are missing from this list; fix as root: "
                        f"{tracefs_fix()}", *warnings]
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
        check_confinement(settings, program)
        slot = backend.reserve(settings)
        try:
            ex = Execution(id=backend.new_id(), program=program, output_format=output_format, timeout_s=timeout,
                           max_lines=settings.max_lines, max_bytes=settings.max_output_bytes)
            argv = settings.run_command(program, output_format, timeout)
            actor = BpftraceExecution(ex, backend, settings, argv, slot)
            # The actor must not idle out while bpftrace runs: its idle timeout covers the whole run and
            # the longest stop; once finished it retires itself after linger_s.
            idle_s = timeout + MAX_SIGINT_GRACE_S + MAX_KILL_WAIT_S + settings.linger_s + 10
            await runtime.start(KIND, ex.id, lambda: actor, idle_timeout_s=idle_s)
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

    runtime.register_tool(ToolSpec(
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
        output_schema=PROBES_OUTPUT, handler=list_probes, timeout_s=60,
    ))
    runtime.register_tool(ToolSpec(
        name="list_helpers", title="List bpftrace builtins and functions",
        description="The builtins (pid, comm, nsecs, kstack, ...), map functions (count, hist, lhist, stats, ...) "
                    "and functions (printf, str, ksym, ...) of the installed bpftrace, with signatures, one-line "
                    "descriptions and flags (unsafe: needs [bpftrace] allow_unsafe; async: runs in user space "
                    "later).",
        input_schema={"type": "object", "properties": {
            "kind": {"type": "string", "enum": ["builtin", "map_function", "function"]},
            "name": {"type": "string", "description": "substring of the name"},
        }, "additionalProperties": False},
        output_schema=HELPERS_OUTPUT, handler=list_helpers, timeout_s=60,
    ))
    runtime.register_tool(ToolSpec(
        name="exec_program", title="Run a bpftrace program",
        description="Start a bpftrace program and return its execution_id as soon as its probes attach; it runs "
                    "in the background for up to `timeout` seconds (then SIGINT: END runs and maps are printed, "
                    "status timed_out). A program bpftrace rejects (syntax, unknown probe, type error) fails at "
                    "once with INVALID_ARGUMENT and the line/column; a probe the kernel refuses to attach fails with "
                    "BACKEND_UNAVAILABLE naming the probe. output_format json: one JSON event per line, "
                    "maps and histograms as data. At most max_concurrent runs at a time (else BUSY).",
        input_schema={"type": "object", "properties": {
            "program": {"type": "string", "minLength": 1, "maxLength": 65536},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
                        "description": "tracing seconds, counted from the attach (default [bpftrace] "
                                       "default_timeout_s, 10); at most [bpftrace] max_run_s (default 60)"},
            "output_format": {"type": "string", "enum": ["text", "json"], "default": "text"},
        }, "required": ["program"], "additionalProperties": False},
        output_schema=EXEC_OUTPUT, handler=exec_program, read_only=False, idempotent=False, timeout_s=60,
    ))
    runtime.register_tool(ToolSpec(
        name="get_result", title="Page through a bpftrace execution's output",
        description="Status and buffered output of an execution (running or finished, also after a daemon "
                    "restart), from `offset`, at most `limit` lines. wait_s > 0 waits (with progress "
                    "notifications) until there is output past offset (until=output) or the run has ended "
                    "(until=done). JSON runs also return `maps`: the last value of every map and histogram (a log2 "
                    "bucket {min: 2147483648} without max counts every value from 2^31 up).",
        input_schema={"type": "object", "properties": {
            "execution_id": EXECUTION_ID_ARG,
            "offset": {"type": "integer", "minimum": 0, "default": 0},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
            "wait_s": {"type": "number", "minimum": 0, "maximum": 120, "default": 0},
            "until": {"type": "string", "enum": ["output", "done"], "default": "output"},
        }, "required": ["execution_id"], "additionalProperties": False},
        output_schema=RESULT_OUTPUT, handler=get_result, timeout_s=130,
    ))
    runtime.register_tool(ToolSpec(
        name="stop_execution", title="Stop a bpftrace execution",
        description="Stop a running execution gracefully (SIGINT: END runs and final maps are printed; SIGKILL "
                    "after a grace period that grows with the number of probes) and return its final state. "
                    "Output is kept.",
        input_schema={"type": "object", "properties": {"execution_id": EXECUTION_ID_ARG},
                      "required": ["execution_id"], "additionalProperties": False},
        output_schema=STOP_OUTPUT,
        handler=stop_execution, read_only=False, idempotent=True, timeout_s=STOP_WAIT_MAX_S + 10,
    ))
    runtime.register_tool(ToolSpec(
        name="list_executions", title="List bpftrace executions",
        description="Executions newest first (running and persisted ones): id, status, program, line count, "
                    "exit code, error; plus how many run now and the concurrency limit.",
        input_schema={"type": "object", "properties": {
            "status": {"type": "string", "enum": [str(s) for s in Status]},
            "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
        }, "additionalProperties": False},
        output_schema=EXECUTIONS_OUTPUT, handler=list_executions,
    ))
    return backend
