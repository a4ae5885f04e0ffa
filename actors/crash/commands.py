"""Running commands in a crash session: crash on its pty (cached by context), drgn in its worker, and
the triage report built from both. The session actor (`actor.CrashSession`) inherits this and adds
the lifecycle (spawn, load, watch, stop) these methods rely on.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from diagd.actors import sandbox
from diagd.actors.crash import report, text
from diagd.actors.crash.drgn import DrgnClient, DrgnStuck
from diagd.actors.crash.messages import Phase, SessionSpec
from diagd.actors.crash.output import head_lines
from diagd.actors.crash.pty import (
    CrashDriver,
    CrashExited,
    CrashUnresponsive,
    MemorySink,
    OutputSink,
    RunOutput,
    describe_status,
)
from diagd.actors.crash.replies import CommandResult, TriageReply
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.crash.store import MAX_PAGE_LINES, Entry, OutputStore
from diagd.protocol.errors import DiagdError, ErrorCode

T = TypeVar("T")
S = TypeVar("S", bound=OutputSink)
RAW_OUTPUT_BYTES = 1 << 20  # diagd's own queries (set, extend): small answers, kept in memory
HEAD_LINES = MAX_PAGE_LINES  # lines kept in memory per cached command (enough for any first page)


class Commands:
    """The command half of a session; its state is set up and owned by `CrashSession`."""

    spec: SessionSpec
    store: OutputStore
    driver: CrashDriver | None
    drgn: DrgnClient | None
    crash_phase: Phase
    drgn_phase: Phase
    crash_done: trio.Event
    drgn_done: trio.Event
    crash_error: DiagdError | None
    drgn_error: DiagdError | None
    failure: DiagdError | None
    context: text.Context | None
    panic_context: text.Context | None
    generation: int
    summary: dict[str, Any]
    cache: OrderedDict[tuple[str, str, int], Entry]
    cache_hits: int
    commands: int
    drgn_restarts: int
    extensions: set[str]
    _counter: int

    @property
    def settings_(self) -> CrashSettings:
        raise NotImplementedError

    def _fail(self, error: DiagdError) -> None:
        raise NotImplementedError

    def _drgn_died(self, drgn: DrgnClient, how: str) -> None:
        raise NotImplementedError

    async def _exit_code(self) -> int | None:
        raise NotImplementedError

    async def _replace_drgn(self, old: DrgnClient) -> None:
        raise NotImplementedError

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

    async def op_crash(self, command: str, force: bool = False, max_lines: int | None = None,
                       extension: str | None = None) -> CommandResult:
        s = self.settings_
        kind = text.classify(command, allow_shell=s.allow_shell, allow_extend=s.allow_extend)
        if text.is_gdb_passthrough(command):
            sandbox.require_confinement("crash's gdb passthrough (`gdb ...`)", allowed_unconfined=s.allow_unconfined,
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

    def _result(self, entry: Entry, cached: bool, max_lines: int) -> CommandResult:
        shown = entry.head[:max_lines]
        result: CommandResult = {"session_id": self.spec.session_id, "engine": entry.engine, "command": entry.command,
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
                      max_lines: int | None = None, label: str | None = None) -> CommandResult:
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


    async def op_triage(self) -> TriageReply:
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

