"""The crash back end's book of sessions: records, reference counts, and which one a client means.

A `SessionRecord` outlives its actor: it keeps the state a session ended in (failed, closed,
expired) so a later call gets a precise error, and its workdir so outputs stay findable. The
`SessionTable` holds every record of this daemon (the latest 200, oldest dropped first unless still
open), the live record per session key (what a reopen of the same dump joins) and each client's
default session (its last open). Starting and stopping actors stays with the back end.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from diagd.protocol.errors import DiagdError, ErrorCode

if TYPE_CHECKING:
    from diagd.actors.crash import CrashSession

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
    refcount: int = 1
    state: str = "opening"  # opening | ready | failed | closed | expired
    error: DiagdError | None = None
    actor: CrashSession | None = None
    clients: set[str] = field(default_factory=set)
    match: list[str] = field(default_factory=list)
    spawned: trio.Event = field(default_factory=trio.Event)  # set once `actor` is known (or the open failed)
    # A session whose crash died after it was ready (killed, OOM, a crash bug) is started again by the
    # next call that names it, up to MAX_REVIVALS times: the dump and the stored outputs are still there.
    revivable: bool = False
    revivals: int = 0

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"session_id": self.session_id, "state": self.state, "refcount": self.refcount,
                               "vmcore": self.vmcore, "vmlinux": self.vmlinux, "workdir": str(self.workdir),
                               "crash_args": self.crash_args,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.created))}
        if self.error is not None:
            out["error"] = self.error.message
        if self.actor is not None:
            out["crash"] = self._engine(str(self.actor.crash_phase))
            out["drgn"] = self._engine(str(self.actor.drgn_phase))
            out["commands"] = self.actor.commands
        return out

    def _engine(self, phase: str) -> str:
        """An engine's phase as it is: a released session's children are on their way out (the actor
        is stopped after the record is released) even if the actor has not got to them yet."""
        if self.state in OPEN_STATES or phase in ("failed", "stopping", "closed"):
            return phase
        return "stopping"

    def usable(self) -> CrashSession:
        """The session's actor, or the coded error saying why there is none to ask."""
        if self.state == "failed":
            error = self.error
            raise DiagdError(ErrorCode.ACTOR_FAILED,
                             f"session {self.session_id} failed: {error.message if error else 'unknown reason'}",
                             session_id=self.session_id, hint="open_vmcore_session again starts a fresh session")
        if self.state in ("closed", "expired") or self.actor is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"session {self.session_id} is {self.state}",
                             session_id=self.session_id,
                             hint="open_vmcore_session again; stored outputs stay readable")
        return self.actor


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

    def join(self, rec: SessionRecord, client: str) -> None:
        rec.refcount += 1
        rec.clients.add(client)
        self.last[client] = rec.session_id

    def open_count(self) -> int:
        return len([r for r in self.live.values() if r.state in OPEN_STATES])

    def live_ids(self) -> set[str]:
        return {r.session_id for r in self.live.values()}

    def add(self, rec: SessionRecord, client: str) -> None:
        """A new session, live under its key and the opening client's default."""
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

    def drop(self, rec: SessionRecord, client: str) -> None:
        """One reference fewer; the client's default goes with its last reference."""
        rec.refcount -= 1
        if self.last.get(client) == rec.session_id and rec.refcount <= 0:
            del self.last[client]

    def forget(self, rec: SessionRecord) -> None:
        """No client's default is this session any more."""
        for client, sid in list(self.last.items()):
            if sid == rec.session_id:
                del self.last[client]

    def resolve(self, client: str, session_id: str | None) -> SessionRecord:
        sid = session_id or self.last.get(client)
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

    def listing(self, client: str) -> dict[str, Any]:
        """list_vmcore_sessions' answer: newest first, and the client's default."""
        return {"sessions": [r.describe() for r in reversed(self.sessions.values())],
                "default_for_this_client": self.last.get(client)}
