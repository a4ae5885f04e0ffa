"""The crash back end: kernel crash-dump sessions with crash (pexpect) and drgn (a worker process).

One actor per dump session (kind "crash", resource = the session key). It owns two children:
- `crash -s` on a pseudo-terminal, driven by pexpect in worker threads (`_crash_pty`), never on the
  Trio loop; commands past their timeout get Ctrl-C and the session carries on;
- a drgn worker (`python -m diagd.actors._drgn_worker`) speaking length-prefixed msgpack on pipes,
  with `prog` loaded from the same dump. drgn code never runs inside the daemon.

Both start together; the actor counts as started once both are spawned, and crash's 7-9 s load runs
in the background: drgn answers after ~0.5 s while crash still loads, `open_vmcore_session` reports
MCP progress until crash's prompt, and nothing else in the daemon waits for it.

The session key is the dump's identity (device, inode, size, mtime + a hash of its header block and
notes, see `_crash_identity`), the vmlinux build id and the crash options: the same dump opened again
by anyone shares the session (reference counted). The vmlinux is checked against the dump's
VMCOREINFO before anything is spawned. Every output is stored under <state>/crash/<session_id>/ and
can be paged or searched after the session is gone, also after a daemon restart.

If crash or the drgn worker dies, the session fails with a coded error and is released; reopening
the dump starts a fresh one. Idle sessions expire ([crash] idle_timeout_s).
"""

from __future__ import annotations

import ast
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import structlog
import trio

from diagd.actors import _crash_identity as ident
from diagd.actors import _crash_text as text
from diagd.actors._crash_drgn import DrgnClient, DrgnStuck
from diagd.actors._crash_pty import (
    CrashDriver,
    CrashExited,
    CrashUnresponsive,
    PtyChild,
    RunOutput,
    describe_status,
    spawn_in_owner_thread,
)
from diagd.actors._crash_store import MAX_PAGE_LINES, OutputStore
from diagd.actors._paths import resolve_allowed
from diagd.actors._subprocess import Step, stop_process
from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy
from diagd.daemon.tools import CallContext, Handler, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.daemon.server import Daemon

log = structlog.get_logger("diagd.crash")

KIND = "crash"
T = TypeVar("T")
HEAD_LINES = MAX_PAGE_LINES  # lines kept in memory per cached command (enough for any first page)
CRASH_STOP_STEPS = (Step("quit", None, 3.0), Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 3.0))
# crash options that only change how the dump is read; anything else (input files, live-system
# switches, output files, positional paths) is refused.
CRASH_FLAGS = frozenset({"--no_kallsyms", "--no_modules", "--no_ikconf", "--no_data_debug", "--no_kmem_cache",
                         "--no_elf_notes", "--kmem_cache_delay", "--readnow", "--smp", "--zero_excluded",
                         "--no_panic", "--hex", "--dec", "--no_strip", "--minimal", "--active"})
CRASH_VALUED = frozenset({"--machdep", "-m", "--cpus", "--kaslr", "--reloc", "--hash", "--offline", "-p"})
PYKDUMP_DIRS = ("/usr/lib/crash/extensions", "/usr/lib64/crash/extensions", "/usr/local/lib/crash/extensions",
                "~/.crash.d")


# ---------------------------------------------------------------------------------------------
# Settings


@dataclass(frozen=True)
class CrashSettings:
    allowed_dirs: tuple[str, ...] = ()
    crash_binary: str = "crash"
    idle_timeout_s: float = 1800.0
    load_timeout_s: float = 180.0
    command_timeout_s: float = 120.0
    drgn_timeout_s: float = 60.0
    interrupt_grace_s: float = 10.0
    output_lines: int = 20
    max_output_bytes: int = 64 * 1024 * 1024
    max_sessions: int = 4
    keep_sessions: int = 50
    log_tail_lines: int = 40
    script_dirs: tuple[str, ...] = ()
    allow_shell: bool = False
    allow_extend: bool = False
    pykdump_path: str = ""
    drgn: bool = True

    @classmethod
    def from_raw(cls, raw: dict[str, Any], daemon_allowed: tuple[str, ...] = ()) -> CrashSettings:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown [crash] keys: {sorted(unknown)}",
                             known=sorted(known))
        values: dict[str, Any] = {"allowed_dirs": tuple(raw.get("allowed_dirs", daemon_allowed))}
        defaults = cls()
        for name in known - {"allowed_dirs"}:
            if name in raw:
                default = getattr(defaults, name)
                value = raw[name]
                try:
                    values[name] = tuple(str(v) for v in value) if isinstance(default, tuple) else type(default)(value)
                except (TypeError, ValueError):
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[crash] {name} must be {type(default).__name__}",
                                     value=value) from None
        settings = cls(**values)
        if not 1 <= settings.output_lines <= MAX_PAGE_LINES:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[crash] output_lines must be 1..{MAX_PAGE_LINES}")
        return settings


def validate_crash_args(raw: list[str]) -> list[str]:
    """Normalise crash options to ['--opt', 'value', ...], refusing anything outside the allow-list."""
    out: list[str] = []
    items = list(raw)
    while items:
        arg = items.pop(0)
        name, eq, value = arg.partition("=")
        if name in CRASH_FLAGS and not eq:
            out.append(name)
            continue
        if name in CRASH_VALUED:
            if not eq:
                if not items:
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"crash option {name} needs a value")
                value = items.pop(0)
            if not value or not all(c.isalnum() or c in "._,:=-" for c in value):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"bad value {value!r} for crash option {name}")
            out += [name, value]
            continue
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"crash option {arg!r} is not allowed",
                         allowed=sorted(CRASH_FLAGS | CRASH_VALUED),
                         hint="dump and vmlinux are given as vmcore_path/vmlinux_path; input/output files, "
                              "live-system switches and extra files are refused")
    return out


# ---------------------------------------------------------------------------------------------
# The session actor


class Phase(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNAVAILABLE = "unavailable"  # drgn only: could not load, crash still serves
    CLOSED = "closed"


@dataclass(frozen=True)
class SessionSpec:
    session_id: str
    key: str
    vmcore: Path
    vmlinux: Path
    workdir: Path
    crash_args: tuple[str, ...]
    settings: CrashSettings
    osrelease: str | None = None


@dataclass
class Hooks:
    on_failed: Callable[[CrashSession, DiagdError], None]
    on_exit: Callable[[CrashSession], None]


@dataclass
class Entry:
    """One stored output as the actor remembers it (first lines in memory, the rest on disk)."""

    command_id: str
    command: str
    engine: str
    head: list[str]
    total_lines: int
    context: dict[str, Any] | None
    duration_s: float
    meta: dict[str, Any] = field(default_factory=dict)


class CrashSession(Actor):
    kind = KIND
    # A session is never restarted behind its users' backs: a dead crash fails the session and a
    # reopen starts a fresh one.
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
        self.extensions: set[str] = set()
        self.stop_results: dict[str, str] = {}
        self._counter = 0
        self._nursery: trio.Nursery | None = None
        self._owner_release: threading.Event | None = None

    @property
    def settings_(self) -> CrashSettings:
        return self.spec.settings

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        s = self.settings_
        argv = [s.crash_binary, "-s", "--no_crashrc", *self.spec.crash_args, str(self.spec.vmlinux),
                str(self.spec.vmcore)]
        env = {**os.environ, "TERM": "dumb", "LC_ALL": "C", "PAGER": "cat"}
        self._counter = await trio.to_thread.run_sync(self.store.next_number, self.spec.session_id) - 1
        self.driver, self._owner_release = await spawn_in_owner_thread(
            argv, cwd=str(self.spec.workdir), env=env, name=f"crash-{self.spec.session_id}")
        self.child = PtyChild(self.driver)
        nursery.start_soon(self._watch_crash, self.child)
        nursery.start_soon(self._load_crash)
        if s.drgn:
            self.drgn = await DrgnClient.spawn(nursery, cwd=self.spec.workdir)
            nursery.start_soon(self._watch_drgn, self.drgn)
            nursery.start_soon(self._load_drgn, self.drgn)
        else:
            self._drgn_unavailable(DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "drgn is disabled ([crash] drgn = false)"))

    async def stop(self) -> None:
        self.closing = True
        try:
            async with trio.open_nursery() as nursery:
                if self.child is not None:
                    nursery.start_soon(self._stop_crash, self.child)
                if self.drgn is not None:
                    nursery.start_soon(self._stop_drgn, self.drgn)
        finally:
            for phase_event in (self.crash_done, self.drgn_done):
                phase_event.set()
            if self.crash_phase == Phase.LOADING:
                self.crash_phase = Phase.CLOSED
            self.stopped.set()
            self.hooks.on_exit(self)

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

    async def _watch_crash(self, child: PtyChild) -> None:
        code = await child.wait()
        if self.crash_phase == Phase.LOADING:
            return  # the loader reports it, with what crash printed
        self._fail(DiagdError(ErrorCode.ACTOR_FAILED,
                              f"crash exited ({describe_status(code)}): session {self.spec.session_id} is over",
                              session_id=self.spec.session_id, exit=describe_status(code),
                              hint="open_vmcore_session again starts a fresh session"))

    async def _watch_drgn(self, drgn: DrgnClient) -> None:
        code = await drgn.proc.wait()
        if drgn.expected_exit or drgn is not self.drgn:
            return
        self._fail(DiagdError(ErrorCode.ACTOR_FAILED,
                              f"the drgn worker exited ({describe_status(code)}): session {self.spec.session_id} "
                              "is over", session_id=self.spec.session_id, exit=describe_status(code),
                              stderr=drgn.stderr.text()[-2000:],
                              hint="open_vmcore_session again starts a fresh session"))

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

    async def _load_drgn(self, drgn: DrgnClient) -> None:
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
            if drgn.proc.returncode is None and not self.closing:
                self._drgn_unavailable(exc)  # drgn cannot read this dump: crash still serves
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

    async def _run(self, command: str, timeout_s: float | None = None) -> RunOutput:
        assert self.driver is not None
        driver, s = self.driver, self.settings_
        timeout = timeout_s if timeout_s is not None else s.command_timeout_s
        try:
            return await self._in_thread(lambda abort: driver.run(
                command, timeout_s=timeout, abort=abort, max_bytes=s.max_output_bytes,
                interrupt_grace_s=s.interrupt_grace_s))
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
        out = await self._run(command, timeout_s=self.settings_.command_timeout_s)
        return out.text

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

    async def _persist(self, engine: str, command: str, output: str, meta: dict[str, Any]) -> Entry:
        n = self._next_number()
        sid = self.spec.session_id

        def write() -> tuple[dict[str, Any], list[str]]:
            stored = self.store.write(sid, n, output, {"engine": engine, "command": command, **meta})
            return stored, output.splitlines()[:HEAD_LINES]

        stored, head = await trio.to_thread.run_sync(write)
        self.commands += 1
        return Entry(stored["command_id"], command, engine, head, stored["total_lines"], meta.get("context"),
                     float(meta.get("duration_s", 0.0)), stored)

    async def _crash_entry(self, command: str, *, force: bool, kind: text.Kind) -> tuple[Entry, bool]:
        """Run (or answer from the cache) one crash command; returns (entry, cached)."""
        command = command.strip()
        before = self.context
        key = (command, before.key if before else "?", self.generation)
        if kind == text.Kind.PLAIN and not force and key in self.cache:
            self.cache.move_to_end(key)
            self.cache_hits += 1
            return self.cache[key], True
        out = await self._run(command)
        if kind != text.Kind.PLAIN:
            self.context = await self._query_context() or before
            if kind == text.Kind.STATE:
                self.generation += 1
                self.cache.clear()
        entry = await self._persist("crash", command, out.text, {
            "kind": str(kind), "context": before.to_json() if before else None,
            "context_after": self.context.to_json() if self.context and kind != text.Kind.PLAIN else None,
            "duration_s": round(out.duration_s, 4), "interrupted": out.interrupted, "reason": out.reason,
            "truncated": out.truncated})
        if out.interrupted:
            code = ErrorCode.OUTPUT_TOO_LARGE if out.truncated else ErrorCode.TIMEOUT
            raise DiagdError(code, f"crash command {command!r} {out.reason}: interrupted with Ctrl-C; "
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
        return {"session_id": self.spec.session_id, "engine": entry.engine, "command": entry.command,
                "command_id": entry.command_id, "output": "\n".join(shown), "lines_returned": len(shown),
                "total_lines": entry.total_lines, "truncated": entry.total_lines > len(shown), "cached": cached,
                "context": entry.context, "duration_ms": round(entry.duration_s * 1000, 3)}

    async def _drgn_ready(self) -> DrgnClient:
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
        try:
            result = await drgn.execute(code, filename=filename, timeout_s=s.drgn_timeout_s,
                                        grace_s=s.interrupt_grace_s, max_output_bytes=s.max_output_bytes,
                                        isolated=isolated)
        except DrgnStuck as exc:
            await self._replace_drgn(drgn)
            raise DiagdError(ErrorCode.TIMEOUT, f"{exc}: the drgn worker was restarted (its variables are gone)",
                             session_id=self.spec.session_id) from None
        except DiagdError as exc:
            if exc.code == ErrorCode.BACKEND_UNAVAILABLE:
                code_ = await _wait_code(drgn.proc)
                self._fail(DiagdError(ErrorCode.ACTOR_FAILED,
                                      f"the drgn worker exited ({describe_status(code_)}): session "
                                      f"{self.spec.session_id} is over", session_id=self.spec.session_id,
                                      stderr=drgn.stderr.text()[-2000:],
                                      hint="open_vmcore_session again starts a fresh session"))
                raise (self.failure or exc) from None
            raise
        output = result.output
        if result.error:
            output += ("" if not output or output.endswith("\n") else "\n") + result.error + "\n"
        entry = await self._persist("drgn", label or code, output, {
            "duration_s": round(result.duration_s, 4), "interrupted": result.interrupted,
            "truncated": result.truncated, "error": result.error.splitlines()[-1] if result.error else None})
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
        self.drgn = await DrgnClient.spawn(self._nursery, cwd=self.spec.workdir)
        self._nursery.start_soon(self._watch_drgn, self.drgn)
        await self._load_drgn(self.drgn)

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
            return self.store.load(entry.command_id)[1]

        log_lines, ps_lines = await trio.to_thread.run_sync(lambda: (full(log_e), full(ps_e)))
        system = text.parse_sys("\n".join(sys_e.head))
        bt = text.parse_bt("\n".join(bt_e.head))
        tasks: dict[str, Any] = {"command_id": ps_e.command_id, "crash": text.summarize_ps(text.parse_ps(
            "\n".join(ps_lines)))}
        if self.drgn_phase == Phase.READY:
            tasks["drgn"] = await self._drgn_task_summary()
        result = {
            "session_id": self.spec.session_id,
            "system": system,
            "panic": system.get("panic"),
            "panic_task": panic.to_json() if panic else None,
            "backtrace": {"command_id": bt_e.command_id, "command": bt_e.command, **bt,
                          "text": "\n".join(bt_e.head[:60])},
            "log_tail": {"command_id": log_e.command_id, "total_lines": log_e.total_lines,
                         "lines": log_lines[-s.log_tail_lines:]},
            "memory": {"command_id": kmem_e.command_id, **text.parse_kmem_i("\n".join(kmem_e.head))},
            "tasks": tasks,
            "limits": self.summary.get("limits", []),
            "next_steps": ["get_command_output / search_command_output on these command ids",
                           "run_crash_command: 'bt -a', 'log', 'kmem -s', 'struct <type> <addr>', 'dis -l <fn>'",
                           "run_drgn_command: prog.crashed_thread().stack_trace(), for_each_task(prog)"],
        }
        return result

    async def _drgn_task_summary(self) -> dict[str, Any]:
        code = (
            "def __diagd_tasks():\n"
            "    import json\n"
            "    counts, blocked, names = {}, [], []\n"
            "    for t in for_each_task(prog):\n"
            "        st = task_state_to_char(t)\n"
            "        counts[st] = counts.get(st, 0) + 1\n"
            "        comm = t.comm.string_().decode(errors='replace')\n"
            "        names.append(comm)\n"
            "        if st == 'D':\n"
            "            blocked.append({'pid': t.pid.value_(), 'comm': comm})\n"
            "    print(json.dumps({'total': sum(counts.values()), 'by_state': counts, 'uninterruptible': blocked,\n"
            "                      'commands': sorted(set(names))}))\n"
            "__diagd_tasks()\n"
            "del __diagd_tasks\n")
        try:
            result = await self.op_drgn(code, filename="<diagd triage>", label="[triage] drgn task summary")
            summary: dict[str, Any] = json.loads(result["output"])
            summary["command_id"] = result["command_id"]
            return summary
        except (DiagdError, ValueError) as exc:
            return {"error": str(exc)}

    # -- reporting ------------------------------------------------------------------------------

    def _summary(self, system: dict[str, str], sys_entry: Entry | None) -> dict[str, Any]:
        tasks_crash = None
        try:
            tasks_crash = int(system.get("tasks", ""))
        except ValueError:
            pass
        limits = text.startup_limits(self.startup_output, self.crash_version, int(self.drgn_loaded.get("tasks", -1)),
                                     tasks_crash)
        warnings = [line.strip() for line in self.startup_output.splitlines() if line.strip()]
        summary: dict[str, Any] = {
            "system": system,
            "panic": system.get("panic"),
            "release": system.get("release"),
            "panic_task": self.panic_context.to_json() if self.panic_context else None,
            "crash_version": self.crash_version,
            "crash_load_s": round(self.crash_load_s or 0, 3),
            "crash_warnings": warnings[:20],
            "drgn": {"phase": str(self.drgn_phase), "load_s": round(self.drgn_load_s or 0, 3), **self.drgn_loaded}
            if self.drgn_phase == Phase.READY else {"phase": str(self.drgn_phase),
                                                    "error": self.drgn_error.message if self.drgn_error else None},
            "limits": limits,
        }
        if sys_entry is not None:
            summary["sys_command_id"] = sys_entry.command_id
        elif "sys_command_id" in self.summary:
            summary["sys_command_id"] = self.summary["sys_command_id"]
        return summary

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
            "crash_rss_bytes": _rss(self.child.pid) if self.child else None,
            "drgn_rss_bytes": _rss(self.drgn.pid) if self.drgn else None,
            "crash_load_s": round(self.crash_load_s, 3) if self.crash_load_s is not None else None,
            "drgn_load_s": round(self.drgn_load_s, 3) if self.drgn_load_s is not None else None,
            "commands": self.commands,
            "cache_hits": self.cache_hits,
            "cached_entries": len(self.cache),
            "context": self.context.to_json() if self.context else None,
        }

    def __repr__(self) -> str:
        return f"<CrashSession {self.spec.session_id} [crash {self.crash_phase}, drgn {self.drgn_phase}]>"


async def _wait_code(proc: trio.Process) -> int | None:
    with trio.move_on_after(2):
        return await proc.wait()
    return proc.returncode


def _rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# ---------------------------------------------------------------------------------------------
# Daemon-side state: sessions, references, identities


@dataclass
class SessionRecord:
    session_id: str
    key: str
    vmcore: str
    vmlinux: str
    workdir: Path
    crash_args: list[str]
    created: float
    refcount: int = 1
    state: str = "opening"  # opening | ready | failed | closed | expired
    error: DiagdError | None = None
    actor: CrashSession | None = None
    clients: set[str] = field(default_factory=set)
    match: list[str] = field(default_factory=list)
    spawned: trio.Event = field(default_factory=trio.Event)  # set once `actor` is known (or the open failed)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session_id": self.session_id, "state": self.state, "refcount": self.refcount,
                               "vmcore": self.vmcore, "vmlinux": self.vmlinux, "workdir": str(self.workdir),
                               "crash_args": self.crash_args,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))}
        if self.error is not None:
            out["error"] = self.error.message
        if self.actor is not None:
            out["crash"] = str(self.actor.crash_phase)
            out["drgn"] = str(self.actor.drgn_phase)
            out["commands"] = self.actor.commands
        return out


class CrashBackend:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.store = OutputStore(daemon.state_dir / "crash")
        self.sessions: OrderedDict[str, SessionRecord] = OrderedDict()
        self.live: dict[str, SessionRecord] = {}
        self.last: dict[str, str] = {}
        self._dump_cache: dict[tuple[int, int, int, int], ident.DumpInfo] = {}
        self._vmlinux_cache: dict[tuple[int, int, int, int], ident.VmlinuxInfo] = {}
        self._crash_version: str | None = None
        self.expected_load_s = 9.0

    @property
    def settings(self) -> CrashSettings:
        return CrashSettings.from_raw(self.daemon.config.backend("crash"), self.daemon.config.daemon.allowed_dirs)

    async def crash_version(self, binary: str) -> str | None:
        if self._crash_version is None:
            done = await trio.run_process([binary, "--version"], capture_stdout=True, capture_stderr=True, check=False)
            lines = [ln.strip() for ln in done.stdout.decode(errors="replace").splitlines() if ln.strip()]
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
        vmcore = resolve_allowed(str(args["vmcore_path"]), s.allowed_dirs, what="vmcore")
        if ident.is_forbidden_source(vmcore):
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{vmcore} is the live system, not a dump: refused",
                             path=str(vmcore))
        vmlinux = resolve_allowed(str(args["vmlinux_path"]), s.allowed_dirs, what="vmlinux")
        crash_args = validate_crash_args([str(a) for a in args.get("crash_args") or []])
        binary = shutil.which(s.crash_binary)
        if binary is None:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{s.crash_binary} is not installed",
                             fix="apt-get install crash (scripts/setup.sh does it)")
        await ctx.report_progress(0, None, "checking that vmlinux matches the dump")
        dump, vml, vml_id = await self.identify(vmcore, vmlinux)
        match = ident.check_match(dump, vml)  # refuses a wrong vmlinux before anything is spawned
        key = ident.session_key(dump, vml, vml_id, crash_args)
        rec = self.live.get(key)
        if rec is not None and rec.state in ("opening", "ready"):
            rec.refcount += 1
            rec.clients.add(ctx.client)
            self.last[ctx.client] = rec.session_id
            try:
                await self._wait_ready(rec, ctx)
            except BaseException:
                rec.refcount -= 1
                raise
            return self._open_result(rec, is_new=False)
        if len([r for r in self.live.values() if r.state in ("opening", "ready")]) >= s.max_sessions:
            raise DiagdError(ErrorCode.BUSY, f"{s.max_sessions} crash sessions are open (each holds ~650 MB)",
                             sessions=[r.describe() for r in self.live.values()],
                             hint="close_vmcore_session one, or raise [crash] max_sessions")
        session_id = f"{key[:8]}-{secrets.token_hex(3)}"
        rec = SessionRecord(session_id, key, str(vmcore), str(vmlinux), self.store.root / session_id, crash_args,
                            time.time(), clients={ctx.client}, match=match)
        self.live[key] = rec
        self.sessions[session_id] = rec
        self.last[ctx.client] = session_id
        while len(self.sessions) > 200:
            old_id, old = next(iter(self.sessions.items()))
            if old.state in ("opening", "ready"):
                break
            del self.sessions[old_id]
        try:
            live_ids = {r.session_id for r in self.live.values()}
            await trio.to_thread.run_sync(self._prepare_workdir, rec, dump, vml, live_ids, s.keep_sessions)
            spec = SessionSpec(session_id, key, vmcore, vmlinux, rec.workdir, tuple(crash_args), s, dump.osrelease)
            hooks = Hooks(on_failed=self._on_failed, on_exit=self._on_exit)
            version = await self.crash_version(binary)
            ref = await self.daemon.supervisor.get_or_start(
                KIND, key, lambda: CrashSession(spec, self.store, hooks, version), idle_timeout_s=s.idle_timeout_s)
            rec.actor = cast(CrashSession, ref.actor)
            rec.spawned.set()
            await self._wait_ready(rec, ctx)
        except BaseException as exc:
            rec.spawned.set()
            rec.refcount -= 1
            if isinstance(exc, DiagdError) and rec.error is None:
                rec.error = exc
            if rec.refcount <= 0 or rec.state == "failed":
                self._release(rec, "failed" if rec.error else "closed", "open failed or was cancelled")
            raise
        return self._open_result(rec, is_new=True)

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

    def _open_result(self, rec: SessionRecord, *, is_new: bool) -> dict[str, Any]:
        actor = rec.actor
        assert actor is not None
        return {"session_id": rec.session_id, "workdir": str(rec.workdir), "is_new": is_new,
                "refcount": rec.refcount, "state": rec.state, "vmcore": rec.vmcore, "vmlinux": rec.vmlinux,
                "match": rec.match, "summary": actor.summary}

    def _on_failed(self, actor: CrashSession, error: DiagdError) -> None:
        rec = self.sessions.get(actor.spec.session_id)
        if rec is None:
            return
        rec.error = rec.error or error
        self._release(rec, "failed", error.message)

    def _on_exit(self, actor: CrashSession) -> None:
        rec = self.sessions.get(actor.spec.session_id)
        if rec is None:
            return
        if rec.state in ("opening", "ready"):
            if actor.failure is not None:
                rec.state, rec.error = "failed", rec.error or actor.failure
            else:
                idle = self.settings.idle_timeout_s
                rec.state = "expired"
                rec.error = DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} ended (idle for {idle:g} s, "
                                       "or the daemon stopped it)", session_id=rec.session_id,
                                       hint="open_vmcore_session again")
        if self.live.get(rec.key) is rec:
            del self.live[rec.key]
        try:
            self.store.update_session(rec.session_id, state=rec.state, stop=actor.stop_results,
                                      error=rec.error.message if rec.error else None)
        except (OSError, DiagdError):
            pass

    def _release(self, rec: SessionRecord, state: str, reason: str) -> None:
        """Stop the session's actor (if any) and free its key so a reopen starts fresh."""
        if rec.state in ("opening", "ready"):
            rec.state = state
        if self.live.get(rec.key) is rec:
            del self.live[rec.key]
        ref = self.daemon.supervisor.find(KIND, rec.key)
        if ref is not None and rec.actor is not None and ref.actor is rec.actor and ref.accepting:
            self.daemon.supervisor.stop(ref.id, reason=reason)

    def resolve(self, ctx: CallContext, session_id: str | None) -> SessionRecord:
        sid = session_id or self.last.get(ctx.client)
        if not sid:
            raise DiagdError(ErrorCode.NOT_FOUND, "no session_id given and this client opened no session",
                             hint="pass session_id (list_vmcore_sessions shows them) or open_vmcore_session first",
                             open_sessions=[r.session_id for r in self.live.values()])
        rec = self.sessions.get(sid)
        if rec is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no crash session {sid!r} in this daemon",
                             open_sessions=[r.session_id for r in self.live.values()],
                             hint="stored outputs of old sessions stay readable with get_command_output")
        return rec

    def usable(self, rec: SessionRecord) -> CrashSession:
        if rec.state == "failed":
            error = rec.error
            raise DiagdError(ErrorCode.ACTOR_FAILED,
                             f"session {rec.session_id} failed: {error.message if error else 'unknown reason'}",
                             session_id=rec.session_id, hint="open_vmcore_session again starts a fresh session")
        if rec.state in ("closed", "expired") or rec.actor is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} is {rec.state}",
                             session_id=rec.session_id, hint="open_vmcore_session again; stored outputs stay readable")
        return rec.actor

    async def ask(self, ctx: CallContext, rec: SessionRecord, op: str, args: dict[str, Any]) -> dict[str, Any]:
        await rec.spawned.wait()  # a call that races the first open waits for the children to be spawned
        actor = self.usable(rec)
        ref = self.daemon.supervisor.find(KIND, rec.key)
        if ref is None or ref.actor is not actor:
            self.usable(rec)  # raises if the actor ended in between
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended", session_id=rec.session_id)

        def gone() -> Actor:  # never start a new crash implicitly
            raise rec.error or DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended")

        result, queue_s = await self.daemon.supervisor.ask(KIND, rec.key, gone, op, args, progress=ctx.progress)
        ctx.queue_s += queue_s
        return result

    async def close(self, ctx: CallContext, session_id: str | None) -> dict[str, Any]:
        rec = self.resolve(ctx, session_id)
        if rec.state not in ("opening", "ready"):
            return {"session_id": rec.session_id, "closed": True, "state": rec.state, "refcount": 0,
                    "workdir": str(rec.workdir), "note": f"the session was already {rec.state}"}
        rec.refcount -= 1
        if self.last.get(ctx.client) == rec.session_id and rec.refcount <= 0:
            del self.last[ctx.client]
        if rec.refcount > 0:
            return {"session_id": rec.session_id, "closed": False, "state": rec.state, "refcount": rec.refcount,
                    "workdir": str(rec.workdir), "note": f"{rec.refcount} other reference(s) keep it open"}
        actor = rec.actor
        self._release(rec, "closed", f"closed by {ctx.client}")
        stop: dict[str, str] = {}
        if actor is not None:
            with trio.move_on_after(30):
                await actor.stopped.wait()
            stop = dict(actor.stop_results)
        for client, sid in list(self.last.items()):
            if sid == rec.session_id:
                del self.last[client]
        return {"session_id": rec.session_id, "closed": True, "state": rec.state, "refcount": 0,
                "workdir": str(rec.workdir), "stopped": stop,
                "note": "outputs stay readable with get_command_output / search_command_output"}


# ---------------------------------------------------------------------------------------------
# Analysis scripts


def list_scripts(dirs: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    scripts: dict[str, dict[str, Any]] = {}
    for d in dirs:
        root = Path(d).expanduser()
        if not root.is_dir():
            continue
        for path in sorted(root.glob("*.py")):
            if path.stem in scripts or path.name.startswith("_"):
                continue
            try:
                source = path.read_text(errors="replace")
                doc = ast.get_docstring(ast.parse(source)) or ""
            except (OSError, SyntaxError) as exc:
                doc = f"(unreadable: {exc})"
            scripts[path.stem] = {"name": path.stem, "path": str(path), "description": doc.strip().split("\n")[0],
                                  "bytes": path.stat().st_size}
    return scripts


def find_pykdump(configured: str) -> str | None:
    candidates = [configured] if configured else []
    for d in PYKDUMP_DIRS:
        root = Path(d).expanduser()
        if root.is_dir():
            candidates += [str(p) for p in sorted(root.glob("mpykdump*.so"))]
    for c in candidates:
        if c and Path(c).is_file():
            return c
    return None


# ---------------------------------------------------------------------------------------------
# Tools


_SESSION = {"session_id": {"type": "string", "description": "From open_vmcore_session; default: this client's "
                                                             "last opened session"}}
_RESULT = {
    "type": "object",
    "properties": {"session_id": {"type": "string"}, "command_id": {"type": "string"}, "output": {"type": "string"},
                   "total_lines": {"type": "integer"}, "lines_returned": {"type": "integer"},
                   "cached": {"type": "boolean"}, "truncated": {"type": "boolean"}},
    "required": ["session_id", "command_id", "output", "total_lines", "cached"],
}


def _schema(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


def register(daemon: Daemon) -> None:
    backend = CrashBackend(daemon)
    registry = daemon.registry
    startup = backend.settings

    def tool(name: str, description: str, props: dict[str, Any], required: tuple[str, ...] = (), *,
             output: dict[str, Any] | None = None, read_only: bool = True, idempotent: bool = True,
             timeout_s: float | None = None) -> Callable[[Handler], Handler]:
        def wrap(handler: Handler) -> Handler:
            registry.register(ToolSpec(name=name, description=description, input_schema=_schema(props, required),
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
          {"vmcore_path": {"type": "string", "description": "the dump (ELF or kdump-compressed)"},
           "vmlinux_path": {"type": "string", "description": "the matching vmlinux with DWARF"},
           "crash_args": {"type": "array", "items": {"type": "string"}, "maxItems": 16,
                          "description": "extra crash options, e.g. ['--kaslr=auto'] (allow-listed)"}},
          ("vmcore_path", "vmlinux_path"),
          output={"type": "object", "properties": {"session_id": {"type": "string"}, "workdir": {"type": "string"},
                                                   "is_new": {"type": "boolean"}, "summary": {"type": "object"}},
                  "required": ["session_id", "workdir", "is_new", "summary"]},
          read_only=False, idempotent=False, timeout_s=startup.load_timeout_s + 30)
    async def open_session(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await backend.open(ctx, args)

    @tool("close_vmcore_session",
          "Drop one reference to a session (default: this client's last); the last reference stops crash and the "
          "drgn worker. Stored outputs stay readable.",
          {**_SESSION}, read_only=False, idempotent=False, timeout_s=45)
    async def close_session(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await backend.close(ctx, args.get("session_id"))

    @tool("list_vmcore_sessions", "Crash sessions of this daemon: id, state, references, dump, commands run.", {})
    async def list_sessions(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"sessions": [r.describe() for r in reversed(backend.sessions.values())],
                "default_for_this_client": backend.last.get(ctx.client)}

    async def crash_command(ctx: CallContext, rec: SessionRecord, command: str, force: bool,
                            max_lines: int | None, extension: str | None = None) -> dict[str, Any]:
        return await backend.ask(ctx, rec, "crash", {"command": command, "force": force, "max_lines": max_lines,
                                                     "extension": extension})

    async def drgn_command(ctx: CallContext, rec: SessionRecord, code: str, max_lines: int | None) -> dict[str, Any]:
        return await backend.ask(ctx, rec, "drgn", {"code": code, "max_lines": max_lines})

    @tool("run_crash_command",
          "Run one crash command (bt, log, ps, kmem -i, struct, dis, sym, set <pid> ...) in a session; returns the "
          "first lines, total_lines and a command_id for get_command_output/search_command_output. Identical "
          "commands in the same context are answered from the cache (cached: true); force_execute reruns. "
          "Prefixes: 'drgn:<python>' runs drgn code, 'crash:<cmd>' is explicit, 'pykdump:<cmd>' needs the "
          "pykdump extension. Pipes, redirections and !shell are refused (use search_command_output).",
          {"command": {"type": "string", "minLength": 1, "maxLength": 4000}, **_SESSION,
           "force_execute": {"type": "boolean", "default": False},
           "max_lines": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LINES,
                         "description": "lines returned inline (default [crash] output_lines)"}},
          ("command",), output=_RESULT, read_only=False, idempotent=False,
          timeout_s=startup.command_timeout_s + startup.interrupt_grace_s + 15)
    async def run_crash_command(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.resolve(ctx, args.get("session_id"))
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
          {"code": {"type": "string", "minLength": 1, "maxLength": 200000}, **_SESSION,
           "max_lines": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LINES}},
          ("code",), output=_RESULT, read_only=False, idempotent=False,
          timeout_s=startup.drgn_timeout_s + startup.interrupt_grace_s + startup.load_timeout_s)
    async def run_drgn_command(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.resolve(ctx, args.get("session_id"))
        return await drgn_command(ctx, rec, args["code"], args.get("max_lines"))

    @tool("get_command_output",
          "A page of a stored command output by command_id (lines offset..offset+limit, limit <= 500). Works "
          "after the session closed and after a daemon restart.",
          {"command_id": {"type": "string"}, "offset": {"type": "integer", "minimum": 0, "default": 0},
           "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LINES, "default": 100}},
          ("command_id",),
          output={"type": "object", "properties": {"command_id": {"type": "string"}, "output": {"type": "string"},
                                                   "total_lines": {"type": "integer"}, "has_more": {"type": "boolean"}},
                  "required": ["command_id", "output", "total_lines", "has_more"]})
    async def get_output(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await trio.to_thread.run_sync(backend.store.page, args["command_id"], args.get("offset", 0),
                                             args.get("limit", 100))

    @tool("search_command_output",
          "Regex search (Python syntax, case-insensitive unless case_sensitive) over a stored output; each match "
          "has its line_number (usable as get_command_output offset) and context_lines around it.",
          {"command_id": {"type": "string"}, "query": {"type": "string", "minLength": 1, "maxLength": 1000},
           "context_lines": {"type": "integer", "minimum": 0, "maximum": 50, "default": 0},
           "max_matches": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
           "case_sensitive": {"type": "boolean", "default": False}},
          ("command_id", "query"),
          output={"type": "object", "properties": {"match_count": {"type": "integer"}, "matches": {"type": "array"}},
                  "required": ["match_count", "matches"]})
    async def search_output(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return await trio.to_thread.run_sync(functools.partial(
            backend.store.search, args["command_id"], args["query"], context_lines=args.get("context_lines", 0),
            max_matches=args.get("max_matches", 100), case_sensitive=args.get("case_sensitive", False)))

    @tool("get_crash_info",
          "Triage report in one call: sys (panic string, release, uptime), the panic task's backtrace, the tail "
          "of the kernel log, kmem -i, a ps summary (and drgn's view of all tasks), with command ids to dig in.",
          {**_SESSION}, timeout_s=startup.command_timeout_s * 2 + startup.drgn_timeout_s)
    async def crash_info(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        rec = backend.resolve(ctx, args.get("session_id"))
        return await backend.ask(ctx, rec, "triage", {})

    if startup.script_dirs:
        @tool("list_analysis_scripts",
              f"drgn analysis scripts from {', '.join(startup.script_dirs)} (name, first docstring line).", {})
        async def list_analysis(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
            return {"scripts": list(scripts.values()), "dirs": list(backend.settings.script_dirs)}

        @tool("run_analysis_script",
              "Run one listed drgn analysis script in the session (fresh namespace with prog and the helpers, "
              "__name__ == '__main__'); output stored like run_drgn_command.",
              {"name": {"type": "string", "pattern": r"^[A-Za-z0-9_.-]+$"}, **_SESSION,
               "max_lines": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LINES}},
              ("name",), output=_RESULT, read_only=False, idempotent=False,
              timeout_s=startup.drgn_timeout_s + startup.interrupt_grace_s + startup.load_timeout_s)
        async def run_analysis(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
            scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
            script = scripts.get(args["name"])
            if script is None:
                raise DiagdError(ErrorCode.NOT_FOUND, f"no analysis script {args['name']!r}", known=sorted(scripts))
            source = await trio.to_thread.run_sync(Path(script["path"]).read_text)
            rec = backend.resolve(ctx, args.get("session_id"))
            return await backend.ask(ctx, rec, "drgn", {"code": source, "filename": script["path"], "isolated": True,
                                                        "max_lines": args.get("max_lines"),
                                                        "label": f"[script] {args['name']}"})
