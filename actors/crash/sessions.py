"""The crash back end's book of sessions: records, reference counts, and which one a client means.

A `SessionRecord` outlives its actor: it keeps the state a session ended in (failed, closed,
expired) so a later call gets a precise error, and its workdir so outputs stay findable. The
`SessionTable` holds every record of this daemon (the latest 200, oldest dropped first unless still
open), the live record per session key (what a reopen of the same dump joins) and each client's
default session (its last open). Starting and stopping actors stays with the back end.

References are counted per client. Those of a short-lived client (`diagd call`: one connection per
command) are dropped when its connection ends (`drop_client`), so a session it opened stays open
held by nobody (refcount 0) until it is closed or idles out. A client that names no session gets
its own default, else the only open session, if exactly one is open.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from diagd.actors.crash.replies import ListReply, SessionInfo
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.actors.crash.messages import SessionView
    from diagd.actors.runtime import ActorRef

OPEN_STATES = ("opening", "ready")
MAX_RECORDS = 200
MAX_REVIVALS = 3


@dataclass
class SessionRecord:
    session_id: str
    key: str
    vmcore: str
    vmlinux: str
    workdir: Path
    crash_args: list[str]
    created: float
    state: str = "opening"  # opening | ready | failed | closed | expired | stopped (with the daemon)
    error: DiagdError | None = None
    view: SessionView | None = None  # the running actor, as the back end may read it
    ref: ActorRef | None = None  # the running actor, to ask or stop
    refs: Counter[str] = field(default_factory=Counter)  # client -> references it holds
    match: list[str] = field(default_factory=list)
    spawned: trio.Event = field(default_factory=trio.Event)  # set once `view`/`ref` are known (or the open failed)
    # A session whose crash died after it was ready (killed, OOM, a crash bug) is started again by the
    # next call that names it, up to MAX_REVIVALS times: the dump and the stored outputs are still there.
    revivable: bool = False
    revivals: int = 0
    # An earlier daemon's session opened again under its id (`reopen`): what the first answer to each
    # client says about it, and the clients told.
    reopened: dict[str, Any] | None = None
    reopen_told: set[str] = field(default_factory=set)

    @property
    def refcount(self) -> int:
        return sum(self.refs.values())

    def describe(self) -> SessionInfo:
        out: SessionInfo = {"session_id": self.session_id, "state": self.state, "refcount": self.refcount,
                               "held_by": sorted(self.refs), "vmcore": self.vmcore, "vmlinux": self.vmlinux,
                               "workdir": str(self.workdir), "crash_args": self.crash_args,
                               "created": utc.iso(self.created)}
        if self.error is not None:
            out["error"] = self.error.message
        if self.view is not None:
            out["crash"] = self._engine(str(self.view.crash_phase))
            out["drgn"] = self._engine(str(self.view.drgn_phase))
            out["commands"] = self.view.commands
        return out

    def _engine(self, phase: str) -> str:
        """An engine's phase as it is: a released session's children are on their way out (the actor
        is stopped after the record is released) even if the actor has not got to them yet."""
        if self.state in OPEN_STATES or phase in ("failed", "stopping", "closed"):
            return phase
        return "stopping"

    def usable(self) -> SessionView:
        """The session's running actor, or the coded error saying why there is none to ask."""
        if self.state == "failed":
            error = self.error
            raise DiagdError(ErrorCode.ACTOR_FAILED,
                             f"session {self.session_id} failed: {error.message if error else 'unknown reason'}",
                             session_id=self.session_id, hint="open_vmcore_session again starts a fresh session")
        if self.state in ("closed", "expired", "stopped") or self.view is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {self.session_id} is {self.state}",
                             session_id=self.session_id,
                             hint="open_vmcore_session again; stored outputs stay readable")
        return self.view


class SessionTable:
    def __init__(self) -> None:
        self.sessions: OrderedDict[str, SessionRecord] = OrderedDict()  # every record, oldest first
        self.live: dict[str, SessionRecord] = {}  # session key -> the record a reopen joins
        self.last: dict[str, str] = {}  # client -> its default session id

    def get(self, session_id: str) -> SessionRecord | None:
        return self.sessions.get(session_id)

    def joinable(self, key: str) -> SessionRecord | None:
        """The open session with this key, if any."""
        rec = self.live.get(key)
        return rec if rec is not None and rec.state in OPEN_STATES else None

    def may_stop(self, ref: ActorRef, client: str) -> None:
        """diagd_stop_actor on a session's actor: refused (BUSY, naming them) while other clients hold
        references, as close_vmcore_session keeps such a session open."""
        rec = self.live.get(ref.resource)
        others = sorted(c for c in rec.refs if c != client) if rec is not None else []
        if rec is not None and others:
            raise DiagdError(ErrorCode.BUSY, f"session {rec.session_id} is held by other clients ({', '.join(others)})",
                             session_id=rec.session_id, held_by=others,
                             hint="close_vmcore_session drops your own reference; the session closes when no "
                                  "client holds it")

    def join(self, rec: SessionRecord, client: str) -> None:
        rec.refs[client] += 1
        self.last[client] = rec.session_id

    def release_ref(self, rec: SessionRecord, client: str) -> bool:
        """One reference of `client` fewer; False when it held none (nothing changes then)."""
        if rec.refs.get(client, 0) <= 0:
            return False
        rec.refs[client] -= 1
        if not rec.refs[client]:
            del rec.refs[client]
            if self.last.get(client) == rec.session_id:
                del self.last[client]
        return True

    def release_one(self, rec: SessionRecord, client: str) -> str | None:
        """close_vmcore_session's reference: the caller's own if it holds one, else another holder's (a
        session opened through one MCP connection may be closed through another); None when nobody
        holds the session. Returns whose reference was dropped."""
        if self.release_ref(rec, client):
            return client
        holder = next(iter(rec.refs), None)
        if holder is not None:
            self.release_ref(rec, holder)
        return holder

    def drop_client(self, client: str) -> list[SessionRecord]:
        """A short-lived client is gone: drop every reference it held; returns the sessions it held."""
        held = [rec for rec in self.sessions.values() if rec.refs.get(client)]
        for rec in held:
            del rec.refs[client]
        self.last.pop(client, None)
        return held

    def open_count(self) -> int:
        return len([r for r in self.live.values() if r.state in OPEN_STATES])

    def live_ids(self) -> set[str]:
        return {r.session_id for r in self.live.values()}

    def add(self, rec: SessionRecord, client: str) -> None:
        """A new session, live under its key, held once by the opening client and its default."""
        rec.refs[client] = 1
        self.live[rec.key] = rec
        self.sessions[rec.session_id] = rec
        self.last[client] = rec.session_id
        while len(self.sessions) > MAX_RECORDS:
            old_id, old = next(iter(self.sessions.items()))
            if old.state in OPEN_STATES:
                break
            del self.sessions[old_id]

    def unlink(self, rec: SessionRecord) -> None:
        """Free the record's key, so a reopen of the same dump starts a fresh session."""
        if self.live.get(rec.key) is rec:
            del self.live[rec.key]

    def drop(self, rec: SessionRecord) -> None:
        """Remove a record that never got an actor, as if it had not been added."""
        self.unlink(rec)
        self.forget(rec)
        if self.sessions.get(rec.session_id) is rec:
            del self.sessions[rec.session_id]

    def forget(self, rec: SessionRecord) -> None:
        """No client's default is this session any more."""
        for client, sid in list(self.last.items()):
            if sid == rec.session_id:
                del self.last[client]

    def default_for(self, client: str) -> str | None:
        """The session a call naming none means: the client's own default, else the only open one."""
        if own := self.last.get(client):
            return own
        open_ids = [r.session_id for r in self.live.values() if r.state in OPEN_STATES]
        return open_ids[0] if len(open_ids) == 1 else None

    def resolve(self, client: str, session_id: str | None) -> SessionRecord:
        sid = session_id or self.default_for(client)
        if not sid:
            open_ids = [r.session_id for r in self.live.values() if r.state in OPEN_STATES]
            why = f"{len(open_ids)} sessions are open" if open_ids else "no session is open"
            raise DiagdError(ErrorCode.NOT_FOUND, f"no session_id given, this client opened no session and {why}",
                             hint="pass session_id (list_vmcore_sessions shows them) or open_vmcore_session first",
                             open_sessions=open_ids)
        rec = self.sessions.get(sid)
        if rec is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no crash session {sid!r} in this daemon",
                             open_sessions=[r.session_id for r in self.live.values()],
                             hint="stored outputs of old sessions stay readable with get_command_output")
        return rec

    def listing(self, client: str) -> ListReply:
        """list_vmcore_sessions' answer: newest first, and the client's default."""
        return {"sessions": [r.describe() for r in reversed(self.sessions.values())],
                "default_for_this_client": self.default_for(client)}
