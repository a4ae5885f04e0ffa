"""The bpftrace back end's state: the live executions and their concurrency slots, the store on disk,
and the cached probe listings and helper table. Only the event loop writes it (the actors report to it
when a run is accepted, ends and retires)."""

from __future__ import annotations

import math
import os
import secrets
import shutil
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import trio

from diagd.actors import system
from diagd.actors._subprocess import Spawn, open_process, run
from diagd.actors.base import ActorGone
from diagd.actors.bpftrace.actor import KIND, PROGRESS_INTERVAL_S, BpftraceExecution, Slot, log
from diagd.actors.bpftrace.execution import Execution
from diagd.actors.bpftrace.helpers import UNKNOWN, Helper, merged_helpers, read_installed_man_page, verification_program
from diagd.actors.bpftrace.parse import classify_failure, parse_stderr
from diagd.actors.bpftrace.probes import listing_warning
from diagd.actors.bpftrace.replies import HelpersReply
from diagd.actors.bpftrace.settings import BpftraceSettings
from diagd.actors.bpftrace.store import ExecutionStore
from diagd.actors.message import Message, ReplyT
from diagd.actors.runtime import Runtime
from diagd.actors.sandbox import standby
from diagd.actors.tooling import CallContext
from diagd.protocol.errors import DiagdError, ErrorCode

# ---------------------------------------------------------------------------------------------
# Short bpftrace commands: -l, --version, the helper check


async def run_command(argv: Sequence[str], timeout_s: float = 30.0, spawn: Spawn = open_process,
                      ) -> tuple[int, str, str]:
    """Run a short bpftrace command to completion: (exit code, stdout, stderr); always reaped."""
    done = await run(argv, timeout_s=timeout_s, spawn=spawn, fix=system.APT_HINT.format(pkg="bpftrace"))
    return done.returncode, done.out, done.stderr


# ---------------------------------------------------------------------------------------------
# The back end: settings, the executions, the tools


LISTINGS_MAX = 8  # probe listings cached at once (`list_probes` filters; each up to the whole probe list)
# The standby launcher's replacement (`sandbox.standby`) starts once the run that took it is past its start
# (its first output line, or its end), STANDBY_AFTER_START_S later (its answer goes first), and at the latest
# STANDBY_REPLACE_S after the take: started at the take, its ~25 ms of a core competed with that run's
# bpftrace for the first line. The daemon's first confined run starts the actor, and runs cold.
STANDBY_AFTER_START_S = 0.01
STANDBY_REPLACE_S = 1.0


class BpftraceBackend:
    def __init__(self, runtime: Runtime, *, spawn: Spawn = open_process) -> None:
        self.runtime = runtime
        self.spawn = spawn
        self.store = ExecutionStore(runtime.state_dir)
        self.live: dict[str, BpftraceExecution] = {}
        self.reserved = 0
        self._loaded: OrderedDict[str, Execution] = OrderedDict()
        self._listings: dict[tuple[str, str], tuple[float, list[str], list[str]]] = {}
        self._helpers: tuple[tuple[Any, ...], HelpersReply] | None = None
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

    async def launch(self, argv: Sequence[str], *, env: dict[str, str] | None,
                     settings: BpftraceSettings) -> trio.Process:
        """Start an execution's process: a confined run on the standby launcher where one waits ([bpftrace]
        warm_launcher), else spawned (`spawn`, cold). Either way the caller owns the process it gets."""
        args = standby.request_of(argv) if self.spawn is open_process else None
        ref = self.runtime.find(standby.KIND, KIND)
        if not settings.warm_launcher:
            if ref is not None:
                self.runtime.stop(ref, "[bpftrace] warm_launcher = false")
        elif args is not None and not self.shutting_down():
            if ref is None:  # the first run, or one after a stop: cold, and the standby starts after it
                try:
                    await self.runtime.start(standby.KIND, KIND, lambda: standby.Launcher(
                        KIND, first_after_s=STANDBY_REPLACE_S, replace_after_s=STANDBY_REPLACE_S),
                        idle_timeout_s=math.inf)
                except DiagdError as exc:
                    log.info("no standby launcher", why=exc.message)
            elif isinstance(launcher := ref.actor, standby.Launcher) and ref.accepting:
                proc = await launcher.launch(args, dict(os.environ) if env is None else env)
                if proc is not None:
                    return proc
        return await self.spawn(argv, env=env)

    def past_start(self) -> None:
        """A run printed its first line, or ended: the standby launcher's replacement may start."""
        ref = self.runtime.find(standby.KIND, KIND)
        if ref is not None and isinstance(launcher := ref.actor, standby.Launcher):
            launcher.replace_soon(STANDBY_AFTER_START_S)

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
        """A run was accepted: live from now on (its record is written by `persist`, just after)."""
        self.live[actor.execution.id] = actor

    def persist(self, actor: BpftraceExecution) -> None:
        """Write an accepted run's record: once, right after exec_program's answer or at its end, if sooner."""
        self.store.create(actor.execution)

    async def prune(self, keep: int) -> None:
        """Remove the oldest records beyond `keep`, in a worker thread: past `keep` it reads every record
        (~15 ms for 200), which on the event loop held up the runs' output."""
        await trio.to_thread.run_sync(self.store.prune, keep, set(self.live))

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

    def running(self, execution_id: str) -> Execution | None:
        """The `Execution` of a live run, or None. Only its actor writes it; the tools read it to wait for
        output or the end (a long poll through the actor's one-at-a-time inbox would hold up a stop)."""
        actor = self.live.get(execution_id)
        return None if actor is None else actor.execution

    def live_executions(self) -> list[Execution]:
        return [actor.execution for actor in self.live.values()]

    async def ask(self, ctx: CallContext, execution_id: str, message: Message[ReplyT]) -> ReplyT | None:
        """Ask the execution's live actor; None when it has gone (the store has the final state)."""
        ref = self.runtime.find(KIND, execution_id) if execution_id in self.live else None
        if ref is None:
            return None
        try:
            reply: ReplyT = await self.runtime.ask(ref, message, progress=ctx.progress)
        except ActorGone:
            return None
        except DiagdError as exc:
            if exc.code in (ErrorCode.ACTOR_FAILED, ErrorCode.CANCELLED) and execution_id not in self.live:
                return None
            raise
        return reply

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
        live = self.running(execution_id)
        return live if live is not None else await self.load(execution_id)

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
            self._remember_listing(key, probes, warnings, settings.probe_cache_s)
            return probes, warnings

    def _remember_listing(self, key: tuple[str, str], probes: list[str], warnings: list[str], ttl_s: float) -> None:
        """Cache a probe listing for ttl_s: expired ones are dropped, and at most LISTINGS_MAX are kept (the
        filter is the client's: one listing per filter ever asked for would grow without end)."""
        now = trio.current_time()
        for old in [k for k, (at, _, _) in self._listings.items() if now - at >= ttl_s]:
            del self._listings[old]
        while len(self._listings) >= LISTINGS_MAX:
            del self._listings[next(iter(self._listings))]  # the oldest (insertion order)
        self._listings[key] = (now, probes, warnings)

    async def helpers(self, settings: BpftraceSettings) -> HelpersReply:
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
            result: HelpersReply = {
                "bpftrace_version": version,
                "source": ("table for bpftrace 0.17" + (f" + {man}" if man else "")
                           + (", every name checked against the installed binary" if verified
                              else ", NOT checked against the binary (its dry run did not analyse the program)")),
                "verified": verified,
                "not_in_installed_binary": sorted(unknown),
                "helpers": [h.to_json() for h in helpers],
                "total": len(helpers),
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
