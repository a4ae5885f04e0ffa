"""A crash session of an earlier daemon comes back by id, on demand.

Crash and drgn end with the daemon that ran them, but the session's directory stays: session.json
records what was opened (`target`). When a call names such a session, `Reopener.resolve` opens the
dump again under the same id through the back end's normal open path: the paths are checked again
under the current config (allowed_dirs, the live-system refusal, crash options), the files must be the
ones recorded (else a coded error saying what changed, with the arguments that open them afresh), the
sandbox is the same, and the call reports MCP progress while crash loads, then runs. Calls racing it
wait for the same reopen (with their own progress). The first answer each client gets from a reopened
session carries `session_reopened`: state held by the old crash and drgn (set, mod -s, drgn variables)
is gone.

Only a session the earlier daemon had open comes back: "ready" (the daemon was killed) or "stopped"
(it stopped them on its way out). One closed with close_vmcore_session, expired after idle_timeout_s,
failed, or killed while loading does not.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
import trio

from diagd.actors.crash import target as tgt
from diagd.actors.crash.replies import CloseReply, NotedT
from diagd.actors.crash.sessions import SessionRecord, SessionTable
from diagd.actors.crash.store import OutputStore
from diagd.actors.tooling import CallContext
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.crash")

REOPENABLE = ("ready", "stopped")  # what session.json says of a session its daemon had open when it went
NOTE = ("crash and drgn were started again on the same dump after a daemon restart: the context is back at the "
        "panic task, and state set before (set, mod -s, alias, drgn variables) is gone; stored outputs remain")


@dataclass
class _Pending:
    """One reopen in progress, shared by the calls that name the session meanwhile."""

    spawned: trio.Event = field(default_factory=trio.Event)  # `rec` is known, or the reopen failed before
    done: trio.Event = field(default_factory=trio.Event)
    rec: SessionRecord | None = None
    error: DiagdError | None = None  # why it failed (None: it worked, or the reopening call was cancelled)


class Opener(Protocol):
    """What reopening needs of the back end: its sessions, its stores and the steps of an open
    (backend.CrashBackend, which imports this module)."""

    store: OutputStore
    table: SessionTable

    async def check(self, ctx: CallContext, vmcore_path: str, vmlinux_path: str, options: list[str]
                    ) -> tgt.Target: ...

    def require_slot(self, why: str = "") -> None: ...

    async def start_session(self, ctx: CallContext, rec: SessionRecord, target: tgt.Target, *,
                            reopened: dict[str, Any] | None = None) -> None: ...

    async def wait_ready(self, rec: SessionRecord, ctx: CallContext) -> None: ...


class Reopener:
    def __init__(self, backend: Opener) -> None:
        self.backend = backend
        self.pending: dict[str, _Pending] = {}

    async def resolve(self, ctx: CallContext, session_id: str | None) -> SessionRecord:
        """The session a call names, reopened first when it is an earlier daemon's."""
        while session_id and (pending := self.pending.get(session_id)) is not None:
            await self._follow(ctx, pending)  # then it is in the table (or the reopen was cancelled early)
        try:
            rec = self.backend.table.resolve(ctx.client, session_id)
        except DiagdError as exc:
            if not session_id or exc.code is not ErrorCode.NOT_FOUND:
                raise
            return await self._lead(ctx, session_id, exc)
        if rec.reopened is not None and rec.state == "opening":  # the call that reopened it went: wait here
            await self.backend.wait_ready(rec, ctx)
        return rec

    async def close_on_disk(self, ctx: CallContext, session_id: str) -> CloseReply:
        """close_vmcore_session of an earlier daemon's session: it is not reopened to be closed, and never
        comes back."""
        store = self.backend.store
        meta = await trio.to_thread.run_sync(store.session_meta, session_id)
        if meta is None:
            self.backend.table.resolve(ctx.client, session_id)  # raises its NOT_FOUND
        assert meta is not None
        before = str(meta.get("state"))
        if before in REOPENABLE:
            await trio.to_thread.run_sync(functools.partial(store.update_session, session_id, state="closed"))
        return {"session_id": session_id, "closed": True, "state": "closed" if before in REOPENABLE else before,
                "refcount": 0, "workdir": str(store.session_dir(session_id)),
                "note": "the session was open in an earlier daemon; it stays closed (not reopened). Stored outputs "
                        "stay readable with get_command_output / search_command_output"}

    def note(self, rec: SessionRecord, client: str, result: NotedT) -> NotedT:
        """`result` with `session_reopened` if it is this client's first answer from the reopened session."""
        if rec.reopened is None or client in rec.reopen_told:
            return result
        rec.reopen_told.add(client)
        noted = copy.copy(result)
        noted["session_reopened"] = rec.reopened
        return noted

    async def _follow(self, ctx: CallContext, pending: _Pending) -> None:
        """Wait for another call's reopen, reporting this call's own progress while crash loads."""
        await pending.spawned.wait()
        rec = pending.rec
        if rec is not None:
            await rec.spawned.wait()
            if rec.view is not None:
                with contextlib.suppress(DiagdError):  # the reopen's own outcome says what happened
                    await self.backend.wait_ready(rec, ctx)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error

    async def _lead(self, ctx: CallContext, session_id: str, missing: DiagdError) -> SessionRecord:
        pending = self.pending[session_id] = _Pending()
        try:
            return await self._reopen(ctx, session_id, missing, pending)
        except DiagdError as exc:
            pending.error = exc
            raise
        finally:
            pending.spawned.set()
            pending.done.set()
            del self.pending[session_id]

    async def _reopen(self, ctx: CallContext, session_id: str, missing: DiagdError,
                      pending: _Pending) -> SessionRecord:
        backend = self.backend
        meta = await trio.to_thread.run_sync(backend.store.session_meta, session_id)
        if meta is None:
            raise missing
        state, args = meta.get("state"), reopen_args(meta)
        if state == "closed":
            raise DiagdError(ErrorCode.NOT_FOUND, f"crash session {session_id} was closed (close_vmcore_session)",
                             session_id=session_id, reopen=args,
                             hint="open_vmcore_session with reopen's arguments starts a new one; its stored "
                                  "outputs stay readable by command_id")
        if state not in REOPENABLE:
            raise DiagdError(ErrorCode.DAEMON_RESTARTED,
                             f"crash session {session_id} ended ({state}) under an earlier daemon, so it is not "
                             "reopened; open_vmcore_session with reopen's arguments starts a new one (its stored "
                             "outputs stay readable by command_id)", session_id=session_id, state=state, reopen=args)
        await ctx.report_progress(0, None, f"session {session_id} was open before the daemon restarted: reopening it")
        try:  # the checks of an open, under the current config
            target = await backend.check(ctx, args["vmcore_path"], args["vmlinux_path"], args.get("crash_args", []))
            if changed := tgt.changes(meta, target):
                raise DiagdError(ErrorCode.DAEMON_RESTARTED, f"crash session {session_id} is not reopened after the "
                                 "daemon restart: " + "; ".join(changed), reason="files_changed", changes=changed)
            if (other := backend.table.joinable(target.key)) is not None:
                raise DiagdError(ErrorCode.DAEMON_RESTARTED, f"crash session {session_id} is not reopened: the same "
                                 f"dump was opened since the restart as session {other.session_id}; use that one",
                                 reason="opened_again", open_session=other.session_id)
            backend.require_slot(f"reopening session {session_id} needs a free slot: ")
        except DiagdError as exc:
            raise DiagdError(exc.code, exc.message, **{**exc.details, "session_id": session_id, "reopen": args}
                             ) from None
        created = meta.get("created")
        rec = SessionRecord(session_id, target.key, str(target.vmcore), str(target.vmlinux),
                            backend.store.session_dir(session_id), target.crash_args,
                            created if isinstance(created, float | int) else time.time(), match=target.match)
        rec.reopened = {"reason": "daemon restarted", "previous_state": state, "reopened_at": utc.iso(), "note": NOTE}
        log.info("reopening a crash session of an earlier daemon", session=session_id, vmcore=rec.vmcore)
        pending.rec = rec
        pending.spawned.set()
        await backend.start_session(ctx, rec, target, reopened=rec.reopened)
        return rec


def reopen_args(meta: dict[str, Any]) -> dict[str, Any]:
    """The open_vmcore_session arguments that open the recorded dump afresh."""
    args: dict[str, Any] = {"vmcore_path": meta.get("vmcore"), "vmlinux_path": meta.get("vmlinux")}
    if meta.get("crash_args"):
        args["crash_args"] = meta["crash_args"]
    return args
