"""The crash back end: kernel crash-dump sessions with crash (pexpect) and drgn (a worker process).

One actor per dump session (kind "crash", resource = the session key). It owns two children:
- `crash -s` on a pseudo-terminal, driven by pexpect in worker threads (`_crash_pty`), never on the
  Trio loop; commands past their timeout get Ctrl-C and the session carries on;
- a drgn worker (`python -m diagd.actors._drgn_worker`) speaking length-prefixed msgpack on pipes,
  with `prog` loaded from the same dump. drgn code never runs inside the daemon.

Both start together; the actor counts as started once both are spawned, and crash's 7-9 s load runs
in the background: drgn answers after ~0.5 s while crash still loads, `open_vmcore_session` reports
MCP progress until crash's prompt, and nothing else in the daemon waits for it.

The session key is the dump's content identity (size, a hash of its head and tail blocks and notes,
see `_crash_identity`; never its path or inode), the vmlinux build id and the crash options: the same
dump opened again by anyone, through any path (a copy, a hard link, a symlink), shares the session
(reference counted), and the answer says it joined and under which paths the session was opened.
The vmlinux is checked against the dump's VMCOREINFO before anything is spawned. Every output is
stored under <state>/crash/<session_id>/ and can be paged or searched after the session is gone,
also after a daemon restart.

Outputs stream to their files as they are produced (crash's from the pty thread, drgn's written by the
worker itself); the daemon keeps only their first lines. Past [crash] max_output_bytes an output is
cut there and flagged (`output_truncated`, `truncated_reason`); the session carries on.

If crash dies, the session fails with a coded error and is released; reopening the dump starts a
fresh one. If the drgn worker dies, the call in flight gets BACKEND_UNAVAILABLE saying how, and the
next drgn call starts a fresh worker (its variables are gone); crash is not affected. Idle sessions
expire ([crash] idle_timeout_s).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import os
import secrets
import shutil
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import structlog
import trio

from diagd.actors import _crash_identity as ident
from diagd.actors import _crash_report as report
from diagd.actors import _crash_schemas as schemas
from diagd.actors import _crash_text as text
from diagd.actors import sandbox as _confine
from diagd.actors._crash_drgn import DrgnClient, DrgnStuck
from diagd.actors._crash_output import head_lines
from diagd.actors._crash_pty import (
    CrashDriver,
    CrashExited,
    CrashUnresponsive,
    MemorySink,
    OutputSink,
    PtyChild,
    RunOutput,
    describe_status,
    spawn_in_owner_thread,
)
from diagd.actors._crash_scripts import PYKDUMP_DIRS, find_pykdump, list_scripts
from diagd.actors._crash_sessions import MAX_REVIVALS, OPEN_STATES, SessionRecord, SessionTable
from diagd.actors._crash_settings import CrashSettings, validate_crash_args
from diagd.actors._crash_store import MAX_PAGE_LINES, Entry, OutputStore
from diagd.actors._paths import resolve_allowed
from diagd.actors._subprocess import Step, run, stop_process
from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.base import Actor, ActorGone, Op, Request, RestartKind, SupervisionPolicy
from diagd.actors.runtime import BackendConfig, Client, Runtime
from diagd.actors.system import rss_bytes
from diagd.actors.tooling import CallContext, Handler, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.crash")

KIND = "crash"
T = TypeVar("T")
S = TypeVar("S", bound=OutputSink)
RAW_OUTPUT_BYTES = 1 << 20  # diagd's own queries (set, extend): small answers, kept in memory
HEAD_LINES = MAX_PAGE_LINES  # lines kept in memory per cached command (enough for any first page)
CRASH_STOP_STEPS = (Step("quit", None, 3.0), Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 3.0))


# ---------------------------------------------------------------------------------------------
# The session actor


class Phase(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"  # drgn only: could not load, crash still serves
    DEAD = "dead"  # drgn only: the worker died; the next drgn call starts a fresh one
    STOPPING = "stopping"  # the session is being closed: its child is being asked to quit (or killed)
    CLOSED = "closed"  # the child is gone (reaped) because the session ended


@dataclass(frozen=True)
class SessionSpec:
    session_id: str
    key: str
    vmcore: Path
    vmlinux: Path
    workdir: Path
    crash_args: tuple[str, ...]
    settings: CrashSettings  # as they were when the children were spawned (see SPAWN_SETTINGS)
    osrelease: str | None = None


# Settings fixed into a session's children when they are spawned: the binary, whether drgn runs, and
# what the sandbox lets them read. Every other [crash] key is read again by each call, so `diagd
# reload` applies it to open sessions; a reload that changes one of these says so (`reload_notes`).
SPAWN_SETTINGS = ("crash_binary", "drgn", "allowed_dirs", "pykdump_path")


@dataclass
class Hooks:
    on_failed: Callable[[CrashSession, DiagdError], None]
    on_exit: Callable[[CrashSession], None]
    # The current [crash] settings (they follow `diagd reload`); None: the spawn-time ones.
    settings: Callable[[], CrashSettings] | None = None


class CrashSession(Actor):
    kind = KIND
    # The supervisor never restarts a session behind its users' backs: a dead crash fails this actor,
    # and the back end starts a fresh one for the same session only when the next call names it
    # (`CrashBackend._revive`, which says so in its answer).
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY, max_restarts=0, stop_grace_s=20.0)

    def __init__(self, spec: SessionSpec, store: OutputStore, hooks: Hooks, crash_version: str | None) -> None:
        super().__init__(spec.key, spec)
        self.spec = spec
        self.store = store
        self.hooks = hooks
        self.crash_version = crash_version
        self.driver: CrashDriver | None = None
        self.child: PtyChild | None = None
        self.drgn: DrgnClient | None = None
        self.crash_phase = Phase.LOADING
        self.drgn_phase = Phase.LOADING
        self.crash_done = trio.Event()
        self.drgn_done = trio.Event()
        self.stopped = trio.Event()
        self.crash_error: DiagdError | None = None
        self.drgn_error: DiagdError | None = None
        self.failure: DiagdError | None = None
        self.closing = False
        self.started_at = trio.current_time()
        self.crash_load_s: float | None = None
        self.drgn_load_s: float | None = None
        self.startup_output = ""
        self.context: text.Context | None = None
        self.panic_context: text.Context | None = None
        self.generation = 0
        self.summary: dict[str, Any] = {}
        self.drgn_loaded: dict[str, Any] = {}
        self.cache: OrderedDict[tuple[str, str, int], Entry] = OrderedDict()
        self.cache_hits = 0
        self.commands = 0
        self.drgn_restarts = 0
        self.extensions: set[str] = set()
        self.stop_results: dict[str, str] = {}
        self._counter = 0
        self._nursery: trio.Nursery | None = None
        self._owner_release: threading.Event | None = None

    @property
    def settings_(self) -> CrashSettings:
        """The settings a call runs under: the current ones, so a reload applies to the next call.

        What the children were spawned with (binary, drgn, sandbox reach) is `spec.settings`.
        """
        return self.hooks.settings() if self.hooks.settings is not None else self.spec.settings

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        s = self.spec.settings
        argv = [s.crash_binary, "-s", "--no_crashrc", *self.spec.crash_args, str(self.spec.vmlinux),
                str(self.spec.vmcore)]
        argv = _confine.wrap(argv, self._crash_policy())  # confined: Landlock, no caps, no sockets
        env = {**os.environ, "TERM": "dumb", "LC_ALL": "C", "PAGER": "cat"}
        self._counter = await trio.to_thread.run_sync(self.store.next_number, self.spec.session_id) - 1
        self.driver, self._owner_release = await spawn_in_owner_thread(
            argv, cwd=str(self.spec.workdir), env=env, name=f"crash-{self.spec.session_id}")
        self.child = PtyChild(self.driver)
        nursery.start_soon(self._watch_crash, self.child)
        nursery.start_soon(self._load_crash)
        if s.drgn:
            self.drgn = await DrgnClient.spawn(nursery, cwd=self.spec.workdir, policy=self._drgn_policy())
            nursery.start_soon(self._watch_drgn, self.drgn)
            nursery.start_soon(self._load_drgn, self.drgn)
        else:
            self._drgn_unavailable(DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "drgn is disabled ([crash] drgn = false)"))

    def _crash_policy(self) -> _confine.Policy:
        s = self.spec.settings
        extensions = [os.path.expanduser(d) for d in (*PYKDUMP_DIRS, *([s.pykdump_path] if s.pykdump_path else []))]
        return _confine.crash_policy(vmcore=self.spec.vmcore, vmlinux=self.spec.vmlinux, workdir=self.spec.workdir,
                                     allowed_dirs=s.allowed_dirs, extra_read=extensions)

    def _drgn_policy(self) -> _confine.Policy:
        return _confine.drgn_policy(vmcore=self.spec.vmcore, vmlinux=self.spec.vmlinux, workdir=self.spec.workdir,
                                    allowed_dirs=self.spec.settings.allowed_dirs)

    async def stop(self) -> None:
        self.closing = True
        # What list_vmcore_sessions and diagd status show must stay true while and after the children
        # go: never "ready" for a process being stopped or already reaped. A failure stays a failure.
        self._set_phases(Phase.STOPPING)
        try:
            async with trio.open_nursery() as nursery:
                if self.child is not None:
                    nursery.start_soon(self._stop_crash, self.child)
                if self.drgn is not None:
                    nursery.start_soon(self._stop_drgn, self.drgn)
        finally:
            for phase_event in (self.crash_done, self.drgn_done):
                phase_event.set()
            self._set_phases(Phase.CLOSED)
            self.stopped.set()
            self.hooks.on_exit(self)

    def _set_phases(self, phase: Phase) -> None:
        if self.crash_phase != Phase.FAILED:
            self.crash_phase = phase
        if self.drgn_phase != Phase.FAILED:
            self.drgn_phase = phase

    async def _stop_crash(self, child: PtyChild) -> None:
        driver = child.driver

        async def graceful() -> None:
            await trio.to_thread.run_sync(driver.request_quit)
            await child.wait()

        # A crash that failed (hung, or half gone) gets no polite `quit` to ignore.
        steps = CRASH_STOP_STEPS if self.failure is None else CRASH_STOP_STEPS[1:]
        self.stop_results["crash"] = await stop_process(cast(trio.Process, child), steps, graceful=graceful)
        await trio.to_thread.run_sync(driver.close)
        child.close()
        if self._owner_release is not None:
            self._owner_release.set()

    async def _stop_drgn(self, drgn: DrgnClient) -> None:
        self.stop_results["drgn"] = await drgn.close()

    def _fail(self, error: DiagdError) -> None:
        """A child died or hung: fail the session once; the backend releases it."""
        if self.failure is not None or self.closing:
            return
        self.failure = error
        if self.crash_phase == Phase.LOADING:
            self.crash_phase, self.crash_error = Phase.FAILED, error
        if self.drgn_phase == Phase.LOADING:
            self.drgn_phase, self.drgn_error = Phase.FAILED, error
        self.crash_done.set()
        self.drgn_done.set()
        log.warning("crash session failed", session=self.spec.session_id, error=error.message)
        self.hooks.on_failed(self, error)
        # Only after the hook, which tells a crash that died once ready (revivable) by its phase: from
        # here on the session shows crash as failed, not as the ready process it no longer is.
        self.crash_phase, self.crash_error = Phase.FAILED, self.crash_error or error

    async def _watch_crash(self, child: PtyChild) -> None:
        code = await child.wait()
        if self.crash_phase == Phase.LOADING:
            return  # the loader reports it, with what crash printed
        self._fail(DiagdError(ErrorCode.ACTOR_FAILED,
                              f"crash exited ({describe_status(code)}): session {self.spec.session_id} is over",
                              session_id=self.spec.session_id, exit=describe_status(code),
                              hint="open_vmcore_session again starts a fresh session"))

    async def _watch_drgn(self, drgn: DrgnClient) -> None:
        await drgn.exited.wait()  # reaped and its pipes closed by the client's waiter
        if drgn.expected_exit or drgn is not self.drgn or self.closing:
            return
        if self.drgn_phase == Phase.READY:  # while loading, the loader decides
            self._drgn_died(drgn, describe_status(drgn.exit_code))

    def _drgn_died(self, drgn: DrgnClient, how: str) -> None:
        if drgn is self.drgn and self.drgn_phase != Phase.DEAD:
            log.warning("drgn worker died", session=self.spec.session_id, exit=how)
            self.drgn_phase = Phase.DEAD
            self.drgn_error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"the drgn worker died ({how})")

    async def _load_crash(self) -> None:
        assert self.driver is not None and self.child is not None
        driver, s = self.driver, self.settings_
        started = trio.current_time()
        try:
            self.startup_output = await self._in_thread(lambda abort: driver.wait_ready(s.load_timeout_s, abort))
            await self._raw("set scroll off")
            self.context = self.panic_context = await self._query_context()
            self.crash_load_s = trio.current_time() - started
            sys_entry, _ = await self._crash_entry("sys", force=False, kind=text.Kind.PLAIN)
            self.summary = self._summary(text.parse_sys("\n".join(sys_entry.head)), sys_entry)
            self.crash_phase = Phase.READY
            log.info("crash ready", session=self.spec.session_id, load_s=round(self.crash_load_s, 2))
        except CrashExited as exc:
            code = await self._exit_code()
            tail = "\n".join(str(exc).strip().splitlines()[-15:])
            error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                               f"crash could not load the dump ({describe_status(code)}): "
                               f"{tail.splitlines()[-1] if tail else 'no output'}",
                               output=tail, exit=describe_status(code), argv_tail=list(self.spec.crash_args))
            self.crash_phase, self.crash_error = Phase.FAILED, error
            self._fail(error)
        except CrashUnresponsive as exc:
            error = DiagdError(ErrorCode.TIMEOUT, f"crash did not become ready: {exc}",
                               timeout_s=s.load_timeout_s)
            self.crash_phase, self.crash_error = Phase.FAILED, error
            self._fail(error)
        except DiagdError as exc:
            self.crash_phase, self.crash_error = Phase.FAILED, exc
            self._fail(exc)
        finally:
            self.crash_done.set()

    async def _load_drgn(self, drgn: DrgnClient, *, restarted: bool = False) -> None:
        started = trio.current_time()
        try:
            await drgn.greet()
            debug = [str(self.spec.vmlinux)]
            loaded = await drgn.load(str(self.spec.vmcore), debug)
            self.drgn_load_s = trio.current_time() - started
            self.drgn_loaded = {"tasks": loaded.tasks, "crashed_pid": loaded.crashed_pid,
                                "crashed_comm": loaded.crashed_comm, "warnings": loaded.warnings,
                                "drgn_version": drgn.hello.drgn_version if drgn.hello else None}
            self.drgn_phase = Phase.READY
            if self.summary:
                self.summary = self._summary(self.summary.get("system", {}), None)
        except DiagdError as exc:
            if self.closing:
                pass
            elif exc.code != ErrorCode.BACKEND_UNAVAILABLE:
                self._drgn_unavailable(exc)  # drgn cannot read this dump: crash still serves
            elif restarted:  # died loading twice in a row: do not keep trying on every call
                how = await drgn.death()
                self._drgn_unavailable(DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                                  f"the drgn worker died while loading the dump ({how})",
                                                  stderr=drgn.stderr.text()[-2000:]))
            else:
                self._drgn_died(drgn, await drgn.death())
        finally:
            self.drgn_done.set()

    def _drgn_unavailable(self, error: DiagdError) -> None:
        self.drgn_phase, self.drgn_error = Phase.UNAVAILABLE, error
        self.drgn_done.set()

    async def _exit_code(self) -> int | None:
        if self.child is None:
            return None
        with trio.move_on_after(2):
            return await self.child.wait()
        return self.child.returncode

    # -- crash primitives -----------------------------------------------------------------------

    async def _in_thread(self, fn: Callable[[threading.Event], T]) -> T:
        """Run a blocking pty call in a worker thread; a cancelled caller makes the thread abort
        (Ctrl-C + resync) on its own while holding the pty lock, so the next call starts clean."""
        abort = threading.Event()
        try:
            return await trio.to_thread.run_sync(fn, abort, abandon_on_cancel=True)
        except BaseException:
            abort.set()
            raise

    async def _run(self, command: str, open_sink: Callable[[], S], timeout_s: float | None = None
                   ) -> tuple[RunOutput, S]:
        """Run one crash command, its output going to the sink `open_sink` makes.

        The sink is opened and closed by the pty thread: a call abandoned by its caller leaves the
        thread writing until its Ctrl-C and resync are done.
        """
        assert self.driver is not None
        driver, s = self.driver, self.settings_
        timeout = timeout_s if timeout_s is not None else s.command_timeout_s

        def work(abort: threading.Event) -> tuple[RunOutput, S]:
            sink = open_sink()
            try:
                return driver.run(command, timeout_s=timeout, abort=abort, sink=sink,
                                  interrupt_grace_s=s.interrupt_grace_s), sink
            finally:
                sink.close()

        try:
            return await self._in_thread(work)
        except CrashExited:
            code = await self._exit_code()
            error = DiagdError(ErrorCode.ACTOR_FAILED,
                               f"crash exited during {command!r} ({describe_status(code)}): "
                               f"session {self.spec.session_id} is over", session_id=self.spec.session_id,
                               exit=describe_status(code), hint="open_vmcore_session again starts a fresh session")
            self._fail(error)
            raise (self.failure or error) from None
        except CrashUnresponsive as exc:
            error = DiagdError(ErrorCode.ACTOR_FAILED, f"crash stopped answering during {command!r}: {exc}; "
                               f"session {self.spec.session_id} is over", session_id=self.spec.session_id,
                               hint="open_vmcore_session again starts a fresh session")
            self._fail(error)
            raise (self.failure or error) from None

    async def _raw(self, command: str) -> str:
        _, sink = await self._run(command, lambda: MemorySink(RAW_OUTPUT_BYTES))
        return sink.text()

    async def _query_context(self) -> text.Context | None:
        return text.parse_context(await self._raw("set"))

    async def _crash_ready(self) -> None:
        if not self.crash_done.is_set():
            with trio.move_on_after(self.settings_.load_timeout_s + 5):
                await self.crash_done.wait()
        if self.failure is not None:
            raise self.failure
        if self.crash_phase != Phase.READY:
            raise self.crash_error or DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "crash is not ready")

    def _next_number(self) -> int:
        self._counter += 1
        return self._counter

    async def _persist(self, engine: str, n: int, command: str, head: list[str], total_lines: int | None,
                       meta: dict[str, Any]) -> Entry:
        """Describe output n, already on disk; `total_lines` None: count them from the file."""
        stored = await trio.to_thread.run_sync(functools.partial(
            self.store.finish, self.spec.session_id, n, {"engine": engine, "command": command, **meta},
            total_lines=total_lines))
        self.commands += 1
        return Entry(stored["command_id"], command, engine, head[:HEAD_LINES], stored["total_lines"],
                     meta.get("context"), float(meta.get("duration_s", 0.0)), stored)

    async def _crash_entry(self, command: str, *, force: bool, kind: text.Kind) -> tuple[Entry, bool]:
        """Run (or answer from the cache) one crash command; returns (entry, cached)."""
        command = command.strip()
        before = self.context
        key = (command, before.key if before else "?", self.generation)
        if kind == text.Kind.PLAIN and not force and key in self.cache:
            self.cache.move_to_end(key)
            self.cache_hits += 1
            return self.cache[key], True
        n = self._next_number()
        s = self.settings_
        out, writer = await self._run(command, functools.partial(self.store.open_output, self.spec.session_id, n,
                                                                 s.max_output_bytes))
        if kind != text.Kind.PLAIN:
            self.context = await self._query_context() or before
            if kind == text.Kind.STATE:
                self.generation += 1
                self.cache.clear()
        reason = (f"{out.reason}: cut there" + (", the command got Ctrl-C" if out.interrupted else "")
                  if out.truncated else out.reason)
        entry = await self._persist("crash", n, command, writer.head_lines(HEAD_LINES), writer.lines, {
            "kind": str(kind), "context": before.to_json() if before else None,
            "context_after": self.context.to_json() if self.context and kind != text.Kind.PLAIN else None,
            "duration_s": round(out.duration_s, 4), "interrupted": out.interrupted, "reason": reason,
            "truncated": out.truncated})
        if out.interrupted and not out.truncated:
            raise DiagdError(ErrorCode.TIMEOUT, f"crash command {command!r} {out.reason}: interrupted with Ctrl-C; "
                             "the session is still usable", command_id=entry.command_id,
                             partial_lines=entry.total_lines, session_id=self.spec.session_id)
        if kind == text.Kind.PLAIN:
            self.cache[key] = entry
            while len(self.cache) > 512:
                self.cache.popitem(last=False)
        return entry, False

    # -- requests -------------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        if self.failure is not None:
            raise self.failure
        try:
            if request.op == "crash":
                return await self.op_crash(**request.args)
            if request.op == "drgn":
                return await self.op_drgn(**request.args)
            if request.op == "triage":
                return await self.op_triage()
            raise DiagdError(ErrorCode.INTERNAL_ERROR, f"crash actor has no operation {request.op!r}")
        except BaseException:
            if self.failure is not None:
                request.fail(self.failure)  # first answer wins over the generic "stopped during the call"
            raise

    async def op_crash(self, command: str, force: bool = False, max_lines: int | None = None,
                       extension: str | None = None) -> dict[str, Any]:
        s = self.settings_
        kind = text.classify(command, allow_shell=s.allow_shell, allow_extend=s.allow_extend)
        if text.is_gdb_passthrough(command):
            _confine.require_confinement("crash's gdb passthrough (`gdb ...`)", allowed_unconfined=s.allow_unconfined,
                                         setting="[crash] allow_unconfined")
        await self._crash_ready()
        if extension is not None and extension not in self.extensions:
            loaded = await self._raw(f"extend {extension}")
            if "shared object loaded" not in loaded:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"crash could not load {extension}: {loaded.strip()}")
            self.extensions.add(extension)
            self.generation += 1
        entry, cached = await self._crash_entry(command, force=force, kind=kind)
        return self._result(entry, cached, max_lines or s.output_lines)

    def _result(self, entry: Entry, cached: bool, max_lines: int) -> dict[str, Any]:
        shown = entry.head[:max_lines]
        result = {"session_id": self.spec.session_id, "engine": entry.engine, "command": entry.command,
                  "command_id": entry.command_id, "output": "\n".join(shown), "lines_returned": len(shown),
                  "total_lines": entry.total_lines, "truncated": entry.total_lines > len(shown), "cached": cached,
                  "context": entry.context, "duration_ms": round(entry.duration_s * 1000, 3)}
        if entry.meta.get("truncated"):  # the stored output itself was cut at the size cap
            result["output_truncated"] = True
            result["truncated_reason"] = entry.meta.get("reason")
        return result

    async def _drgn_ready(self) -> DrgnClient:
        if self.drgn_phase == Phase.DEAD and self.drgn is not None and self.failure is None:
            self.drgn_restarts += 1
            await self._replace_drgn(self.drgn)  # the call that finds the worker dead starts a fresh one
        if not self.drgn_done.is_set():
            with trio.move_on_after(self.settings_.load_timeout_s):
                await self.drgn_done.wait()
        if self.failure is not None:
            raise self.failure
        if self.drgn_phase != Phase.READY or self.drgn is None:
            err = self.drgn_error
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                             f"drgn is not available in this session: {err.message if err else self.drgn_phase}")
        return self.drgn

    async def op_drgn(self, code: str, filename: str = "<drgn>", isolated: bool = False,
                      max_lines: int | None = None, label: str | None = None) -> dict[str, Any]:
        s = self.settings_
        drgn = await self._drgn_ready()
        n = self._next_number()
        try:
            result = await drgn.execute(code, filename=filename, timeout_s=s.drgn_timeout_s,
                                        grace_s=s.interrupt_grace_s, max_output_bytes=s.max_output_bytes,
                                        output_path=str(self.store.output_path(self.spec.session_id, n)),
                                        isolated=isolated)
        except DrgnStuck as exc:
            await self._replace_drgn(drgn)
            raise DiagdError(ErrorCode.TIMEOUT, f"{exc}: the drgn worker was restarted (its variables are gone)",
                             session_id=self.spec.session_id) from None
        except DiagdError as exc:
            if exc.code == ErrorCode.BACKEND_UNAVAILABLE:
                how = await drgn.death()
                self._drgn_died(drgn, how)
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                 f"the drgn worker died during the call ({how}); the next drgn call starts a fresh "
                                 "one (its variables are gone), crash is not affected",
                                 session_id=self.spec.session_id, exit=how,
                                 stderr=drgn.stderr.text()[-2000:]) from None
            raise
        reason = f"output passed {s.max_output_bytes} bytes: cut there" if result.truncated else None
        head = head_lines(result.head, complete=result.head_complete)
        entry = await self._persist("drgn", n, label or code, head, result.lines, {
            "duration_s": round(result.duration_s, 4), "interrupted": result.interrupted,
            "truncated": result.truncated, "reason": reason,
            "error": result.error.splitlines()[-1] if result.error else None})
        if result.interrupted:
            raise DiagdError(ErrorCode.TIMEOUT, f"drgn code ran past {s.drgn_timeout_s:g} s and was interrupted; "
                             "the worker is still usable", command_id=entry.command_id,
                             partial_lines=entry.total_lines, session_id=self.spec.session_id)
        if result.error:
            last = result.error.strip().splitlines()[-1]
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"drgn code raised {last}", command_id=entry.command_id,
                             traceback=result.error[-4000:], output="\n".join(entry.head[:s.output_lines]),
                             total_lines=entry.total_lines, session_id=self.spec.session_id,
                             hint="the worker and its variables survive; fix the code and retry")
        return self._result(entry, False, max_lines or s.output_lines)

    async def _replace_drgn(self, old: DrgnClient) -> None:
        assert self._nursery is not None
        old.expected_exit = True
        self.drgn_phase = Phase.LOADING
        self.drgn_done = trio.Event()
        await old.close()
        self.drgn = await DrgnClient.spawn(self._nursery, cwd=self.spec.workdir, policy=self._drgn_policy())
        self._nursery.start_soon(self._watch_drgn, self.drgn)
        await self._load_drgn(self.drgn, restarted=True)

    async def op_triage(self) -> dict[str, Any]:
        """sys, the panic task's bt, the tail of the log, kmem -i, ps (+ drgn's view of all tasks)."""
        s = self.settings_
        await self._crash_ready()
        plain = text.Kind.PLAIN
        sys_e, _ = await self._crash_entry("sys", force=False, kind=plain)
        panic = self.panic_context
        bt_e, _ = await self._crash_entry(f"bt {panic.task}" if panic else "bt", force=False, kind=plain)
        log_e, _ = await self._crash_entry("log", force=False, kind=plain)
        kmem_e, _ = await self._crash_entry("kmem -i", force=False, kind=plain)
        ps_e, _ = await self._crash_entry("ps", force=False, kind=plain)

        def full(entry: Entry) -> list[str]:
            return list(self.store.load(entry.command_id)[1])

        log_lines, ps_lines = await trio.to_thread.run_sync(lambda: (full(log_e), full(ps_e)))
        drgn_tasks = await self._drgn_task_summary() if self.drgn_phase == Phase.READY else None
        return report.triage_report(self.spec.session_id, sys_e=sys_e, bt_e=bt_e, log_e=log_e, kmem_e=kmem_e,
                                    ps_e=ps_e, log_lines=log_lines, ps_lines=ps_lines, panic=panic,
                                    drgn_tasks=drgn_tasks, limits=self.summary.get("limits", []),
                                    log_tail_lines=s.log_tail_lines)

    async def _drgn_task_summary(self) -> dict[str, Any]:
        try:
            result = await self.op_drgn(report.DRGN_TASK_SUMMARY, filename="<diagd triage>",
                                        label="[triage] drgn task summary")
            summary: dict[str, Any] = json.loads(result["output"])
            summary["command_id"] = result["command_id"]
            return summary
        except (DiagdError, ValueError) as exc:
            return {"error": str(exc)}

    # -- reporting ------------------------------------------------------------------------------

    def _summary(self, system: dict[str, str], sys_entry: Entry | None) -> dict[str, Any]:
        return report.session_summary(
            system, startup_output=self.startup_output, crash_version=self.crash_version,
            crash_load_s=self.crash_load_s, panic=self.panic_context, drgn=self._drgn_status(),
            drgn_tasks=int(self.drgn_loaded.get("tasks", -1)),
            sys_command_id=sys_entry.command_id if sys_entry is not None else self.summary.get("sys_command_id"))

    def _drgn_status(self) -> dict[str, Any]:
        if self.drgn_phase == Phase.READY:
            return {"phase": str(self.drgn_phase), "load_s": round(self.drgn_load_s or 0, 3), **self.drgn_loaded}
        return {"phase": str(self.drgn_phase), "error": self.drgn_error.message if self.drgn_error else None}

    def statistics(self) -> dict[str, Any]:
        return {
            "session_id": self.spec.session_id,
            "vmcore": str(self.spec.vmcore),
            "vmlinux": str(self.spec.vmlinux),
            "crash": str(self.crash_phase),
            "drgn": str(self.drgn_phase),
            "failure": self.failure.message if self.failure else None,
            "crash_pid": self.child.pid if self.child else None,
            "drgn_pid": self.drgn.pid if self.drgn else None,
            "drgn_restarts": self.drgn_restarts,
            "crash_rss_bytes": rss_bytes(self.child.pid) if self.child else None,
            "drgn_rss_bytes": rss_bytes(self.drgn.pid) if self.drgn else None,
            "crash_load_s": round(self.crash_load_s, 3) if self.crash_load_s is not None else None,
            "drgn_load_s": round(self.drgn_load_s, 3) if self.drgn_load_s is not None else None,
            "commands": self.commands,
            "cache_hits": self.cache_hits,
            "cached_entries": len(self.cache),
            "context": self.context.to_json() if self.context else None,
        }

    def __repr__(self) -> str:
        return f"<CrashSession {self.spec.session_id} [crash {self.crash_phase}, drgn {self.drgn_phase}]>"


# ---------------------------------------------------------------------------------------------
# Daemon-side state: sessions (`_crash_sessions`), identities, stored outputs


class CrashBackend:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store = OutputStore(runtime.state_dir)
        self.table = SessionTable()
        self._dump_cache: dict[tuple[int, int, int, int], ident.DumpInfo] = {}
        self._vmlinux_cache: dict[tuple[int, int, int, int], ident.VmlinuxInfo] = {}
        self._crash_version: str | None = None
        self.expected_load_s = 9.0
        self._settings: tuple[BackendConfig, CrashSettings] | None = None
        self.script_tools = False  # whether register() added the analysis-script tools (script_dirs at start)

    @property
    def settings(self) -> CrashSettings:
        """The current [crash] settings: re-parsed when `diagd reload` replaced the config."""
        config = self.runtime.config()
        if self._settings is None or self._settings[0] is not config:
            self._settings = (config, CrashSettings.from_raw(config.table, config.allowed_dirs))
        return self._settings[1]

    async def crash_version(self, binary: str) -> str | None:
        if self._crash_version is None:
            done = await run([binary, "--version"], timeout_s=30)
            lines = [ln.strip() for ln in done.out.splitlines() if ln.strip()]
            self._crash_version = lines[0] if lines else None
        return self._crash_version

    # -- identity -------------------------------------------------------------------------------

    async def identify(self, vmcore: Path, vmlinux: Path) -> tuple[ident.DumpInfo, ident.VmlinuxInfo,
                                                                   tuple[int, int, int, int]]:
        def work() -> tuple[ident.DumpInfo, ident.VmlinuxInfo, tuple[int, int, int, int]]:
            d_id, v_id = ident.stat_identity(vmcore), ident.stat_identity(vmlinux)
            dump = self._dump_cache.get(d_id) or ident.read_dump_info(vmcore)
            vml = self._vmlinux_cache.get(v_id) or ident.read_vmlinux_info(vmlinux)
            self._dump_cache[d_id], self._vmlinux_cache[v_id] = dump, vml
            return dump, vml, v_id

        return await trio.to_thread.run_sync(work)

    # -- sessions -------------------------------------------------------------------------------

    async def open(self, ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        s = self.settings
        vmcore = resolve_allowed(str(args["vmcore_path"]), s.allowed_dirs, what="vmcore", cwd=ctx.cwd)
        if ident.is_forbidden_source(vmcore):
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{vmcore} is the live system, not a dump: refused",
                             path=str(vmcore))
        vmlinux = resolve_allowed(str(args["vmlinux_path"]), s.allowed_dirs, what="vmlinux", cwd=ctx.cwd)
        crash_args = validate_crash_args([str(a) for a in args.get("crash_args") or []])
        binary = shutil.which(s.crash_binary)
        if binary is None:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{s.crash_binary} is not installed",
                             fix="apt-get install crash (scripts/setup.sh does it)")
        await ctx.report_progress(0, None, "checking that vmlinux matches the dump")
        dump, vml, vml_id = await self.identify(vmcore, vmlinux)
        match = ident.check_match(dump, vml)  # refuses a wrong vmlinux before anything is spawned
        key = ident.session_key(dump, vml, vml_id, crash_args)
        rec = self.table.joinable(key)
        if rec is not None:  # the same crash by content, whatever path it was opened under
            self.table.join(rec, ctx.client)
            try:
                await self._wait_ready(rec, ctx)
            except BaseException:
                self.table.release_ref(rec, ctx.client)
                raise
            return self._open_result(rec, is_new=False, asked=(vmcore, vmlinux), ephemeral=ctx.ephemeral)
        if self.table.open_count() >= s.max_sessions:
            raise DiagdError(ErrorCode.BUSY, f"{s.max_sessions} crash sessions are open (each holds ~650 MB)",
                             sessions=[r.describe() for r in self.table.live.values()],
                             hint="close_vmcore_session one (sessions with refcount 0 are held by nobody), "
                                  "or raise [crash] max_sessions")
        session_id = f"{key[:8]}-{secrets.token_hex(3)}"
        rec = SessionRecord(session_id, key, str(vmcore), str(vmlinux), self.store.root / session_id, crash_args,
                            time.time(), match=match)
        self.table.add(rec, ctx.client)
        try:
            await trio.to_thread.run_sync(self._prepare_workdir, rec, dump, vml, self.table.live_ids(),
                                          s.keep_sessions)
            spec = SessionSpec(session_id, key, vmcore, vmlinux, rec.workdir, tuple(crash_args), s, dump.osrelease)
            await self._spawn(rec, spec, await self.crash_version(binary))
            await self._wait_ready(rec, ctx)
        except BaseException as exc:
            rec.spawned.set()
            self.table.release_ref(rec, ctx.client)
            if isinstance(exc, DiagdError) and rec.error is None:
                rec.error = exc
            if rec.refcount <= 0 or rec.state == "failed":
                self._release(rec, "failed" if rec.error else "closed", "open failed or was cancelled")
            raise
        return self._open_result(rec, is_new=True, asked=(vmcore, vmlinux), ephemeral=ctx.ephemeral)

    async def _spawn(self, rec: SessionRecord, spec: SessionSpec, version: str | None) -> None:
        """Start the session's actor (crash + drgn) under the record's key; `rec.actor` is the new one."""
        hooks = Hooks(on_failed=self._on_failed, on_exit=self._on_exit, settings=lambda: self.settings)
        ref = await self.runtime.start(
            KIND, spec.key, lambda: CrashSession(spec, self.store, hooks, version),
            idle_timeout_s=lambda: self.settings.idle_timeout_s)  # follows a reload
        rec.actor = cast(CrashSession, ref.actor)
        rec.spawned.set()

    async def _revive(self, ctx: CallContext, rec: SessionRecord) -> dict[str, Any]:
        """Start a fresh crash for a session whose crash died after it was ready (see `revivable`).

        The session keeps its id, references, workdir and stored outputs; what lived only in the
        dead crash (the current context, `mod -s` symbols, aliases, drgn variables) is gone, and the
        answer says so. A second call racing this one waits for the same restart.
        """
        old = rec.actor
        assert old is not None
        reason = rec.error.message if rec.error else "crash exited"
        with trio.move_on_after(old.policy.stop_grace_s + 10):
            await old.stopped.wait()  # its children are reaped and its on_exit has run
        s = self.settings
        if self.table.live.get(rec.key) not in (None, rec):
            raise DiagdError(ErrorCode.ACTOR_FAILED, f"session {rec.session_id} failed ({reason}) and the same dump "
                             "was opened again since", session_id=rec.session_id,
                             open_sessions=[r.session_id for r in self.table.live.values()])
        if self.table.open_count() >= s.max_sessions:
            raise DiagdError(ErrorCode.BUSY, f"session {rec.session_id} failed ({reason}); restarting it needs a "
                             f"free slot and {s.max_sessions} crash sessions are open", session_id=rec.session_id)
        binary = shutil.which(s.crash_binary)
        if binary is None:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{s.crash_binary} is not installed")
        rec.revivals += 1
        rec.revivable = False
        rec.state, rec.error, rec.spawned = "opening", None, trio.Event()
        self.table.live[rec.key] = rec
        log.warning("restarting crash for a session whose crash died", session=rec.session_id, reason=reason,
                    revival=rec.revivals)
        await ctx.report_progress(0, None, f"crash died ({reason}); starting it again for session {rec.session_id}")
        try:
            await self._spawn(rec, dataclasses.replace(old.spec, settings=s), await self.crash_version(binary))
            await self._wait_ready(rec, ctx)
        except BaseException as exc:
            rec.spawned.set()
            if isinstance(exc, DiagdError) and rec.error is None:
                rec.error = exc
            self._release(rec, "failed", "restart failed or was cancelled")
            raise
        return {"reason": reason, "revival": rec.revivals,
                "note": "crash was restarted on the same dump: the context is back at the panic task, and "
                        "state set in the dead crash (set, mod -s, alias, drgn variables) is gone; stored outputs "
                        "remain"}

    def _prepare_workdir(self, rec: SessionRecord, dump: ident.DumpInfo, vml: ident.VmlinuxInfo,
                         live: set[str], keep: int) -> None:
        self.store.prune(keep, live | {rec.session_id})
        self.store.create_session(rec.session_id, {
            "session_id": rec.session_id, "key": rec.key, "vmcore": rec.vmcore, "vmlinux": rec.vmlinux,
            "crash_args": rec.crash_args, "osrelease": dump.osrelease, "build_id": dump.build_id,
            "vmlinux_build_id": vml.build_id, "created": rec.created, "state": "opening"})

    async def _wait_ready(self, rec: SessionRecord, ctx: CallContext) -> None:
        """Wait for crash's prompt, reporting MCP progress; other calls are not held up by this."""
        actor = rec.actor
        if actor is None:
            raise rec.error or DiagdError(ErrorCode.ACTOR_FAILED, f"session {rec.session_id} did not start")
        started = trio.current_time()
        drgn_said = False
        while not actor.crash_done.is_set():
            with trio.move_on_after(0.5):
                await actor.crash_done.wait()
            elapsed = trio.current_time() - actor.started_at
            message = f"crash is loading {Path(rec.vmlinux).name} + {Path(rec.vmcore).name} ({elapsed:.1f} s)"
            if actor.drgn_phase == Phase.READY and not drgn_said:
                drgn_said = True
                message += f"; drgn ready after {actor.drgn_load_s or 0:.2f} s (run_drgn_command works now)"
            if not actor.crash_done.is_set():
                await ctx.report_progress(round(elapsed, 1), round(max(self.expected_load_s, elapsed + 1), 1), message)
        if actor.failure is not None or actor.crash_phase != Phase.READY:
            error = actor.failure or actor.crash_error or DiagdError(ErrorCode.ACTOR_FAILED, "crash did not start")
            rec.error = rec.error or error
            raise error
        if rec.state == "opening":
            rec.state = "ready"
            if actor.crash_load_s:
                self.expected_load_s = actor.crash_load_s * 1.1
            await trio.to_thread.run_sync(functools.partial(self.store.update_session, rec.session_id,
                                                            state="ready", summary=actor.summary))
        if trio.current_time() > started:
            total = round(trio.current_time() - actor.started_at, 1)
            await ctx.report_progress(total, total, "crash ready")

    def _open_result(self, rec: SessionRecord, *, is_new: bool, asked: tuple[Path, Path],
                     ephemeral: bool) -> dict[str, Any]:
        actor = rec.actor
        assert actor is not None
        result = {"session_id": rec.session_id, "workdir": str(rec.workdir), "is_new": is_new, "joined": not is_new,
                  "refcount": rec.refcount, "state": rec.state, "vmcore": rec.vmcore, "vmlinux": rec.vmlinux,
                  "match": rec.match, "summary": actor.summary}
        if not is_new:
            requested = {"vmcore": str(asked[0]), "vmlinux": str(asked[1])}
            result["requested"] = requested
            other = [k for k, path in requested.items() if path != result[k]]
            result["note"] = (f"joined the open session {rec.session_id}: "
                              + (f"the same dump by content, opened as {rec.vmcore} (vmlinux {rec.vmlinux}); "
                                 "its paths are the ones the session uses" if other else "the same dump"))
        if ephemeral:
            result["reference"] = (f"held only while this command runs: afterwards nobody holds the session and it "
                                   f"stays open until close_vmcore_session or {self.settings.idle_timeout_s:g} s "
                                   "without calls ([crash] idle_timeout_s)")
        return result

    def _on_failed(self, actor: CrashSession, error: DiagdError) -> None:
        rec = self.table.get(actor.spec.session_id)
        if rec is None or rec.actor is not actor:
            return  # an actor replaced by a restart reports nothing about the session any more
        rec.error = rec.error or error
        # Died after it was ready: the dump loads, so the next call may start crash again.
        rec.revivable = actor.crash_phase == Phase.READY and rec.revivals < MAX_REVIVALS
        self._release(rec, "failed", error.message)

    def _on_exit(self, actor: CrashSession) -> None:
        rec = self.table.get(actor.spec.session_id)
        if rec is None or rec.actor is not actor:
            return
        if rec.state in OPEN_STATES:
            if actor.failure is not None:
                rec.state, rec.error = "failed", rec.error or actor.failure
            else:
                idle = self.settings.idle_timeout_s
                rec.state = "expired"
                rec.error = DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} ended (idle for {idle:g} s, "
                                       "or the daemon stopped it)", session_id=rec.session_id,
                                       hint="open_vmcore_session again")
        self.table.unlink(rec)
        try:
            self.store.update_session(rec.session_id, state=rec.state, stop=actor.stop_results,
                                      error=rec.error.message if rec.error else None)
        except (OSError, DiagdError):
            pass

    def reload_notes(self, old: BackendConfig, new: BackendConfig) -> list[dict[str, Any]]:
        """`diagd reload`: refuse a broken [crash] table (the old config stays); name what does not reach
        open sessions.

        Every [crash] key except SPAWN_SETTINGS is read by each call, so it applies at once, tool call
        limits included. SPAWN_SETTINGS are built into a session's crash and drgn (binary, sandbox), so
        they apply to sessions opened after the reload; the note lists the open sessions that keep
        the old value until reopened.
        """
        after = CrashSettings.from_raw(new.table, new.allowed_dirs)  # DiagdError refuses it
        notes: list[dict[str, Any]] = []
        for name in SPAWN_SETTINGS:
            keeping = [rec.session_id for rec in self.table.live.values()
                       if rec.state in OPEN_STATES and rec.actor is not None
                       and getattr(rec.actor.spec.settings, name) != getattr(after, name)]
            if keeping:
                notes.append({"setting": f"[crash] {name}", "applies_to": "crash sessions opened after the reload",
                              "why": "built into a session's crash and drgn processes when they start",
                              "until_reopened": keeping})
        if bool(after.script_dirs) != self.script_tools:
            notes.append({"setting": "[crash] script_dirs", "applies_to": "the next daemon start",
                          "why": "list_analysis_scripts and run_analysis_script exist only when script_dirs was "
                                 "set at start (changing a non-empty list applies at once)"})
        return notes

    def client_gone(self, client: Client) -> None:
        """A short-lived client (`diagd call`) disconnected: its references end with it.

        A session left with none stays open, held by nobody, so the next `diagd call` can use it;
        it ends with close_vmcore_session or after [crash] idle_timeout_s without calls.
        """
        if not client.ephemeral:
            return
        for rec in self.table.drop_client(client.name):
            log.info("references of a gone client dropped", client=client.name, session=rec.session_id,
                     refcount=rec.refcount)

    def _release(self, rec: SessionRecord, state: str, reason: str) -> None:
        """Stop the session's actor (if any) and free its key so a reopen starts fresh."""
        if rec.state in OPEN_STATES:
            rec.state = state
        self.table.unlink(rec)
        ref = self.runtime.find(KIND, rec.key)
        if ref is not None and rec.actor is not None and ref.actor is rec.actor:
            self.runtime.stop(ref, reason=reason)

    async def ask(self, ctx: CallContext, rec: SessionRecord, op: str, args: dict[str, Any]) -> dict[str, Any]:
        await rec.spawned.wait()  # a call that races the first open waits for the children to be spawned
        restarted = await self._revive(ctx, rec) if rec.state == "failed" and rec.revivable else None
        actor = rec.usable()
        ref = self.runtime.find(KIND, rec.key)
        if ref is None or ref.actor is not actor:
            rec.usable()  # raises if the actor ended in between
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended", session_id=rec.session_id)
        try:
            result = await self.runtime.ask(ref, Op(op, args), progress=ctx.progress)
        except ActorGone:  # ended between the lookup and the call: a crash is never started implicitly
            raise rec.error or DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended") from None
        if restarted is not None:
            result = {**result, "session_restarted": restarted}
        return result

    async def close(self, ctx: CallContext, session_id: str | None) -> dict[str, Any]:
        rec = self.table.resolve(ctx.client, session_id)
        if rec.state not in OPEN_STATES:
            return {"session_id": rec.session_id, "closed": True, "state": rec.state, "refcount": 0,
                    "workdir": str(rec.workdir), "note": f"the session was already {rec.state}"}
        dropped = self.table.release_one(rec, ctx.client)
        if rec.refcount > 0:
            return {"session_id": rec.session_id, "closed": False, "state": rec.state, "refcount": rec.refcount,
                    "held_by": sorted(rec.refs), "dropped_reference_of": dropped, "workdir": str(rec.workdir),
                    "note": f"{rec.refcount} other reference(s) keep it open"}
        actor = rec.actor
        self._release(rec, "closed", f"closed by {ctx.client}")
        stop: dict[str, str] = {}
        if actor is not None:
            with trio.move_on_after(30):
                await actor.stopped.wait()
            stop = dict(actor.stop_results)
        self.table.forget(rec)
        return {"session_id": rec.session_id, "closed": True, "state": rec.state, "refcount": 0,
                "workdir": str(rec.workdir), "stopped": stop,
                "note": "outputs stay readable with get_command_output / search_command_output"}


def register(runtime: Runtime) -> None:
    backend = CrashBackend(runtime)
    startup = backend.settings  # only for what is fixed at registration: whether the script tools exist
    runtime.on_client(gone=backend.client_gone)
    runtime.on_reload(backend.reload_notes)

    def limit(seconds: Callable[[CrashSettings], float]) -> Callable[[], float]:
        """A tool's call limit from the current settings, so a reload moves it with the limits it covers."""
        return lambda: seconds(backend.settings)

    def tool(name: str, description: str, input_schema: dict[str, Any], *,
             output: dict[str, Any] | None = None, read_only: bool = True, idempotent: bool = True,
             timeout_s: float | Callable[[], float] | None = None) -> Callable[[Handler], Handler]:
        def wrap(handler: Handler) -> Handler:
            runtime.register_tool(ToolSpec(name=name, description=description, input_schema=input_schema,
                                       handler=handler, output_schema=output, read_only=read_only,
                                       idempotent=idempotent, timeout_s=timeout_s))
            return handler
        return wrap

    @tool("open_vmcore_session",
          "Open (or join) a kernel crash-dump session: crash + drgn on vmcore + its vmlinux (with debug info). "
          "The vmlinux is checked against the dump's VMCOREINFO first (wrong kernel -> INVALID_ARGUMENT). crash "
          "takes ~10 s to load (progress is reported); the same dump opened again returns the same session "
          "(is_new false). The summary has the panic string, the panic task and known limits. Then call "
          "get_crash_info.",
          schemas.OPEN_INPUT, output=schemas.OPEN_OUTPUT, read_only=False, idempotent=False,
          timeout_s=limit(lambda s: s.load_timeout_s + 30))
    async def open_session(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await backend.open(ctx, args)

    @tool("close_vmcore_session",
          "Drop one reference to a session (default: this client's last, else the only open session); the last "
          "reference, or closing a session nobody holds (opened by `diagd call`, whose reference ends with the "
          "command), stops crash and the drgn worker. Stored outputs stay readable.",
          schemas.SESSION_INPUT, read_only=False, idempotent=False, timeout_s=45)
    async def close_session(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await backend.close(ctx, args.get("session_id"))

    @tool("list_vmcore_sessions", "Crash sessions of this daemon: id, state, references, dump, commands run.",
          schemas.NO_INPUT)
    async def list_sessions(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return backend.table.listing(ctx.client)

    async def crash_command(ctx: CallContext, rec: SessionRecord, command: str, force: bool,
                            max_lines: int | None, extension: str | None = None) -> dict[str, Any]:
        return await backend.ask(ctx, rec, "crash", {"command": command, "force": force, "max_lines": max_lines,
                                                     "extension": extension})

    async def drgn_command(ctx: CallContext, rec: SessionRecord, code: str, max_lines: int | None) -> dict[str, Any]:
        _confine.require_confinement("drgn code (run_drgn_command, drgn:)",
                                     allowed_unconfined=backend.settings.allow_unconfined,
                                     setting="[crash] allow_unconfined")
        return await backend.ask(ctx, rec, "drgn", {"code": code, "max_lines": max_lines})

    @tool("run_crash_command",
          "Run one crash command (bt, log, ps, kmem -i, struct, dis, sym, set <pid> ...) in a session; returns the "
          "first lines, total_lines and a command_id for get_command_output/search_command_output. Identical "
          "commands in the same context are answered from the cache (cached: true); force_execute reruns. "
          "Prefixes: 'drgn:<python>' runs drgn code, 'crash:<cmd>' is explicit, 'pykdump:<cmd>' needs the "
          "pykdump extension. Pipes, redirections and !shell are refused (use search_command_output).",
          schemas.RUN_CRASH_INPUT, output=schemas.COMMAND_RESULT, read_only=False, idempotent=False,
          timeout_s=limit(lambda s: s.command_timeout_s + s.interrupt_grace_s + 15))
    async def run_crash_command(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.table.resolve(ctx.client, args.get("session_id"))
        command = args["command"].strip()
        prefix, sep, rest = command.partition(":")
        max_lines = args.get("max_lines")
        if sep and prefix.strip() in ("crash", "drgn", "pykdump"):
            prefix, rest = prefix.strip(), rest.strip()
            if not rest:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"nothing after {prefix}:")
            if prefix == "drgn":
                return await drgn_command(ctx, rec, rest, max_lines)
            if prefix == "pykdump":
                extension = find_pykdump(backend.settings.pykdump_path)
                if extension is None:
                    raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                     "pykdump is not installed (no mpykdump*.so crash extension found)",
                                     searched=list(PYKDUMP_DIRS),
                                     hint="Debian has no pykdump package: build it and set [crash] pykdump_path; "
                                          "drgn: does the same kind of scripting")
                return await crash_command(ctx, rec, rest, bool(args.get("force_execute")), max_lines, extension)
            command = rest
        return await crash_command(ctx, rec, command, bool(args.get("force_execute")), max_lines)

    @tool("run_drgn_command",
          "Run Python in the session's drgn worker: `prog` is the dump, drgn's helpers (for_each_task, "
          "find_task, list_for_each_entry, ...) are imported, variables persist between calls, and a final "
          "expression is shown like the drgn shell does. print() output is returned and stored; an exception "
          "comes back as INVALID_ARGUMENT with its traceback.",
          schemas.RUN_DRGN_INPUT, output=schemas.COMMAND_RESULT, read_only=False, idempotent=False,
          timeout_s=limit(lambda s: s.drgn_timeout_s + s.interrupt_grace_s + s.load_timeout_s))
    async def run_drgn_command(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.table.resolve(ctx.client, args.get("session_id"))
        return await drgn_command(ctx, rec, args["code"], args.get("max_lines"))

    @tool("get_command_output",
          "A page of a stored command output by command_id (lines offset..offset+limit, limit <= 500). Works "
          "after the session closed and after a daemon restart.",
          schemas.GET_OUTPUT_INPUT, output=schemas.GET_OUTPUT_OUTPUT)
    async def get_output(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await trio.to_thread.run_sync(backend.store.page, args["command_id"], args.get("offset", 0),
                                             args.get("limit", 100))

    @tool("search_command_output",
          "Regex search (Python syntax, case-insensitive unless case_sensitive) over a stored output; each match "
          "has its line_number (usable as get_command_output offset) and context_lines around it.",
          schemas.SEARCH_INPUT, output=schemas.SEARCH_OUTPUT)
    async def search_output(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        pattern = await compile_in_thread(args["query"], case_sensitive=args.get("case_sensitive", False))
        matcher = Matcher(pattern, runtime.config().regex_budget_s, unit="line")
        return await matcher.run(functools.partial(
            backend.store.search, args["command_id"], matcher, context_lines=args.get("context_lines", 0),
            max_matches=args.get("max_matches", 100)))

    @tool("get_crash_info",
          "Triage report in one call: sys (panic string, release, uptime), the panic task's backtrace, the tail "
          "of the kernel log, kmem -i, a ps summary (and drgn's view of all tasks), with command ids to dig in.",
          schemas.SESSION_INPUT, timeout_s=limit(lambda s: s.command_timeout_s * 2 + s.drgn_timeout_s))
    async def crash_info(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.table.resolve(ctx.client, args.get("session_id"))
        return await backend.ask(ctx, rec, "triage", {})

    backend.script_tools = bool(startup.script_dirs)
    if startup.script_dirs:
        @tool("list_analysis_scripts",
              f"drgn analysis scripts from {', '.join(startup.script_dirs)} (name, first docstring line).",
              schemas.NO_INPUT)
        async def list_analysis(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
            return {"scripts": list(scripts.values()), "dirs": list(backend.settings.script_dirs)}

        @tool("run_analysis_script",
              "Run one listed drgn analysis script in the session (fresh namespace with prog and the helpers, "
              "__name__ == '__main__'); output stored like run_drgn_command.",
              schemas.RUN_SCRIPT_INPUT, output=schemas.COMMAND_RESULT, read_only=False, idempotent=False,
              timeout_s=limit(lambda s: s.drgn_timeout_s + s.interrupt_grace_s + s.load_timeout_s))
        async def run_analysis(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
            script = scripts.get(args["name"])
            if script is None:
                raise DiagdError(ErrorCode.NOT_FOUND, f"no analysis script {args['name']!r}", known=sorted(scripts))
            source = await trio.to_thread.run_sync(Path(script["path"]).read_text)
            rec = backend.table.resolve(ctx.client, args.get("session_id"))
            return await backend.ask(ctx, rec, "drgn", {"code": source, "filename": script["path"], "isolated": True,
                                                        "max_lines": args.get("max_lines"),
                                                        "label": f"[script] {args['name']}"})
