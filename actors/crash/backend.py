"""The crash back end's daemon-side state: the session table (`sessions`), dump and vmlinux
identities (`identity`), the stored outputs (`store`), and starting, joining, reviving and closing
session actors.

The session key is the dump's content identity (size, a hash of its head and tail blocks and notes,
see `identity`; never its path or inode), the vmlinux build id and the crash options: the same
dump opened again by anyone, through any path (a copy, a hard link, a symlink), shares the session
(reference counted), and the answer says it joined and under which paths the session was opened.
The vmlinux is checked against the dump's VMCOREINFO before anything is spawned. Every output is
stored under <state>/crash/<session_id>/ and can be paged or searched after the session is gone,
also after a daemon restart. `open_vmcore_session` reports MCP progress until crash's prompt, and
nothing else in the daemon waits for it.

If crash dies, reopening the dump (or the next call naming the session, once) starts a fresh one.
A session open when the daemon stopped (or died) is reopened by id by the next call naming it (`reopen`).
Idle sessions expire ([crash] idle_timeout_s).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors._subprocess import run
from diagd.actors.base import ActorGone
from diagd.actors.crash.actor import CrashSession
from diagd.actors.crash.messages import (
    KIND,
    SPAWN_SETTINGS,
    Hooks,
    Phase,
    SessionSpec,
    SessionView,
)
from diagd.actors.crash.reopen import Reopener
from diagd.actors.crash.replies import CloseReply, NotedT, OpenReply
from diagd.actors.crash.sessions import MAX_REVIVALS, OPEN_STATES, SessionRecord, SessionTable
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.crash.store import OutputStore
from diagd.actors.crash.target import Identities, Target
from diagd.actors.message import Message
from diagd.actors.runtime import BackendConfig, Client, Runtime
from diagd.actors.sandbox import namespaces
from diagd.actors.tooling import CallContext
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.crash")


class CrashBackend:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store = OutputStore(runtime.state_dir)
        self.table = SessionTable()
        self.identities = Identities()
        self._crash_version: str | None = None
        self.expected_load_s = 9.0
        self._settings: tuple[BackendConfig, CrashSettings] | None = None
        self.script_tools = False  # whether register() added the analysis-script tools (script_dirs at start)
        self.reopener = Reopener(self)
        self.namespaces = namespaces.Namespaces()  # probed at the first session, kept for the next

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

    async def check(self, ctx: CallContext, vmcore_path: str, vmlinux_path: str, options: list[str]) -> Target:
        """Everything an open checks before it spawns anything, under the current [crash] settings."""
        return await self.identities.check(ctx, self.settings, vmcore_path, vmlinux_path, options,
                                           private_dirs=self.runtime.config().private_dirs)

    # -- sessions -------------------------------------------------------------------------------

    async def open(self, ctx: CallContext, vmcore_path: str, vmlinux_path: str, options: list[str]) -> OpenReply:
        """open_vmcore_session: join the open session of the same dump, or start one (`options`: crash_args)."""
        target = await self.check(ctx, vmcore_path, vmlinux_path, options)
        asked = (target.vmcore, target.vmlinux)
        rec = self.table.joinable(target.key)
        if rec is not None:  # the same crash by content, whatever path it was opened under
            self.table.join(rec, ctx.client)
            try:
                await self.wait_ready(rec, ctx)
            except BaseException:
                self.table.release_ref(rec, ctx.client)
                raise
            return self._open_result(rec, is_new=False, asked=asked, ephemeral=ctx.ephemeral)
        self.require_slot()
        session_id = f"{target.key[:8]}-{secrets.token_hex(3)}"
        rec = SessionRecord(session_id, target.key, str(target.vmcore), str(target.vmlinux),
                            self.store.root / session_id, target.crash_args, time.time(), match=target.match)
        await self.start_session(ctx, rec, target)
        return self._open_result(rec, is_new=True, asked=asked, ephemeral=ctx.ephemeral)

    def require_slot(self, why: str = "") -> None:
        s = self.settings
        if self.table.open_count() >= s.max_sessions:
            raise DiagdError(ErrorCode.BUSY, f"{why}{s.max_sessions} crash sessions are open (each holds ~650 MB)",
                             sessions=[r.describe() for r in self.table.live.values()],
                             hint="close_vmcore_session one (sessions with refcount 0 are held by nobody), "
                                  "or raise [crash] max_sessions")

    async def start_session(self, ctx: CallContext, rec: SessionRecord, target: Target, *,
                            reopened: dict[str, Any] | None = None) -> None:
        """Spawn a new record's crash + drgn (the caller holds its one reference) and wait for the prompt;
        `reopened`: the record is an earlier daemon's session, its workdir and outputs are kept."""
        s = self.settings
        self.table.add(rec, ctx.client)
        try:
            await trio.to_thread.run_sync(self._prepare_workdir, rec, target, self.table.live_ids(),
                                          s.keep_sessions, reopened)
            spec = SessionSpec(rec.session_id, rec.key, target.vmcore, target.vmlinux, rec.workdir,
                               tuple(rec.crash_args), s, target.dump.osrelease, self.runtime.config().private_dirs)
            await self._spawn(rec, spec, await self.crash_version(target.binary))
            await self.wait_ready(rec, ctx)
        except BaseException as exc:
            rec.spawned.set()
            self.table.release_ref(rec, ctx.client)
            if isinstance(exc, DiagdError) and rec.error is None:
                rec.error = exc
            if reopened is not None and rec.error is None:  # its caller went: an earlier daemon's session
                if rec.view is None:  # goes on loading, held by nobody, or waits on disk for the next call
                    self.table.drop(rec)
            elif rec.refcount <= 0 or rec.state == "failed":
                self._release(rec, "failed" if rec.error else "closed", "open failed or was cancelled")
            raise

    async def _spawn(self, rec: SessionRecord, spec: SessionSpec, version: str | None) -> None:
        """Start the session's actor (crash + drgn) under the record's key; `rec.ref` and `rec.view` are
        the new one's."""
        hooks = Hooks(on_failed=self._on_failed, on_exit=self._on_exit, settings=lambda: self.settings)
        made: list[CrashSession] = []  # what the factory built: the back end keeps only its SessionView

        def make() -> CrashSession:
            made.append(CrashSession(spec, self.store, hooks, version, self.namespaces))
            return made[-1]

        ref = await self.runtime.start(KIND, spec.key, make,
                                       idle_timeout_s=lambda: self.settings.idle_timeout_s)  # follows a reload
        rec.ref, rec.view = ref, made[-1]
        rec.spawned.set()

    async def _revive(self, ctx: CallContext, rec: SessionRecord) -> dict[str, Any]:
        """Start a fresh crash for a session whose crash died after it was ready (see `revivable`).

        The session keeps its id, references, workdir and stored outputs; what lived only in the
        dead crash (the current context, `mod -s` symbols, aliases, drgn variables) is gone, and the
        answer says so. A second call racing this one waits for the same restart.
        """
        old = rec.view
        assert old is not None
        reason = rec.error.message if rec.error else "crash exited"
        with trio.move_on_after(CrashSession.policy.stop_grace_s + 10):
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
            await self.wait_ready(rec, ctx)
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

    def _prepare_workdir(self, rec: SessionRecord, target: Target, live: set[str], keep: int,
                         reopened: dict[str, Any] | None) -> None:
        # What a later daemon needs to reopen the session by id (`reopen`, `target`).
        meta = {"key": rec.key, "vmcore": rec.vmcore, "vmlinux": rec.vmlinux,
                "crash_args": rec.crash_args, "files": target.files(), "osrelease": target.dump.osrelease,
                "build_id": target.dump.build_id, "vmlinux_build_id": target.vml.build_id}
        if reopened is not None:  # the earlier daemon's workdir and outputs; its state until crash is ready
            self.store.update_session(rec.session_id, **meta, reopened=reopened)
            return
        self.store.prune(keep, live | {rec.session_id})
        self.store.create_session(rec.session_id, {"session_id": rec.session_id, **meta, "created": rec.created,
                                                  "state": "opening"})

    async def wait_ready(self, rec: SessionRecord, ctx: CallContext) -> None:
        """Wait for crash's prompt, reporting MCP progress; other calls are not held up by this."""
        actor = rec.view
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
                     ephemeral: bool) -> OpenReply:
        actor = rec.view
        assert actor is not None
        result: OpenReply = {
                  "session_id": rec.session_id, "workdir": str(rec.workdir), "is_new": is_new, "joined": not is_new,
                  "refcount": rec.refcount, "state": rec.state, "vmcore": rec.vmcore, "vmlinux": rec.vmlinux,
                  "match": rec.match, "summary": actor.summary}
        if not is_new:
            requested = {"vmcore": str(asked[0]), "vmlinux": str(asked[1])}
            result["requested"] = requested
            other = [k for k, path in requested.items() if path != {"vmcore": rec.vmcore, "vmlinux": rec.vmlinux}[k]]
            result["note"] = (f"joined the open session {rec.session_id}: "
                              + (f"the same dump by content, opened as {rec.vmcore} (vmlinux {rec.vmlinux}); "
                                 "its paths are the ones the session uses" if other else "the same dump"))
        if ephemeral:
            result["reference"] = (f"held only while this command runs: afterwards nobody holds the session and it "
                                   f"stays open until close_vmcore_session or {self.settings.idle_timeout_s:g} s "
                                   "without calls ([crash] idle_timeout_s)")
        return result

    def _on_failed(self, actor: SessionView, error: DiagdError) -> None:
        rec = self.table.get(actor.spec.session_id)
        if rec is None or rec.view is not actor:
            return  # an actor replaced by a restart reports nothing about the session any more
        rec.error = rec.error or error
        # Died after it was ready: the dump loads, so the next call may start crash again.
        rec.revivable = actor.crash_phase == Phase.READY and rec.revivals < MAX_REVIVALS
        self._release(rec, "failed", error.message)

    def _on_exit(self, actor: SessionView) -> None:
        rec = self.table.get(actor.spec.session_id)
        if rec is None or rec.view is not actor:
            return
        if rec.state in OPEN_STATES:
            if actor.failure is not None:
                rec.state, rec.error = "failed", rec.error or actor.failure
            elif self.runtime.shutting_down:  # the next daemon reopens it when a call names it (`reopen`)
                rec.state = "stopped"
                rec.error = DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} was stopped with the daemon",
                                       session_id=rec.session_id)
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
                       if rec.state in OPEN_STATES and rec.view is not None
                       and getattr(rec.view.spec.settings, name) != getattr(after, name)]
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
        if ref is not None and ref is rec.ref:
            self.runtime.stop(ref, reason=reason)

    async def ask(self, ctx: CallContext, rec: SessionRecord, message: Message[NotedT]) -> NotedT:
        """The session actor's answer to `message`, with what the back end notes on it (`SessionNotes`)."""
        await rec.spawned.wait()  # a call that races the first open waits for the children to be spawned
        restarted = await self._revive(ctx, rec) if rec.state == "failed" and rec.revivable else None
        rec.usable()  # raises if the session has no actor to ask
        ref = self.runtime.find(KIND, rec.key)
        if ref is None or ref is not rec.ref:
            rec.usable()  # raises if the actor ended in between
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended", session_id=rec.session_id)
        try:
            result = await self.runtime.ask(ref, message, progress=ctx.progress)
        except ActorGone:  # ended between the lookup and the call: a crash is never started implicitly
            raise rec.error or DiagdError(ErrorCode.NOT_FOUND, f"session {rec.session_id} has ended") from None
        if restarted is not None:
            result = copy.copy(result)  # the actor's own answer stays as it made it
            result["session_restarted"] = restarted
        return self.reopener.note(rec, ctx.client, result)

    async def resolve(self, ctx: CallContext, session_id: str | None) -> SessionRecord:
        """The session a call names; an earlier daemon's is reopened under its id first (`reopen`)."""
        return await self.reopener.resolve(ctx, session_id)

    async def close(self, ctx: CallContext, session_id: str | None) -> CloseReply:
        if session_id and self.table.get(session_id) is None and session_id not in self.reopener.pending:
            return await self.reopener.close_on_disk(ctx, session_id)
        rec = await self.resolve(ctx, session_id)
        if rec.state not in OPEN_STATES:
            return {"session_id": rec.session_id, "closed": True, "state": rec.state, "refcount": 0,
                    "workdir": str(rec.workdir), "note": f"the session was already {rec.state}"}
        dropped = self.table.release_one(rec, ctx.client)
        if rec.refcount > 0:
            return {"session_id": rec.session_id, "closed": False, "state": rec.state, "refcount": rec.refcount,
                    "held_by": sorted(rec.refs), "dropped_reference_of": dropped, "workdir": str(rec.workdir),
                    "note": f"{rec.refcount} other reference(s) keep it open"}
        actor = rec.view
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

