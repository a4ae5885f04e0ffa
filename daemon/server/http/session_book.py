"""Which HTTP MCP sessions exist, whose they are and which to give up: the caps and idle rules.

No SDK import: the session manager (sessions.py) asks the book and acts. A record is *live*
(the SDK holds a transport and a server task for it) or *dormant* (only the record: freed after
`session_idle_s` without a request, or left over from before a restart); a dormant record with its
`initialize` params is revived on its next request. Records count against `max_sessions_per_token`
and `max_sessions` whether live or dormant:

- a new session for a token at its cap replaces that token's longest-idle record with no request in
  flight (a client that never DELETEs pays for itself); if all of them are busy, it is refused;
- at the overall cap, a new session replaces the longest-idle *dormant* record of any token; with
  none dormant it is refused (one token never ends another token's live session);
- a dormant record unused for `session_keep_s` is forgotten.

Times are Trio's clock (MockClock in tests); the file keeps wall-clock seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from diagd.daemon.server.http import session_file as http_session_file
from diagd.daemon.server.http.session_file import Stored


@dataclass
class Record:
    sid: str
    token: str  # the id of the token that opened it (tokens.Token.id), never its name
    last_used: float  # Trio time
    initialize: dict[str, Any] = field(default_factory=dict)  # empty until the opening request succeeded
    live: bool = True
    in_flight: int = 0

    @property
    def revivable(self) -> bool:
        return bool(self.initialize)


@dataclass(frozen=True)
class Admission:
    """The answer to a new session: admitted (after `evict` are dropped) or refused with `reason`."""

    evict: tuple[Record, ...] = ()
    reason: str = ""

    @property
    def admitted(self) -> bool:
        return not self.reason


class SessionBook:
    def __init__(self, *, per_token: int, overall: int, keep_s: float,
                 wall: Callable[[], float] = time.time) -> None:
        self.per_token = per_token
        self.overall = overall
        self.keep_s = keep_s
        self._wall = wall
        self._records: dict[str, Record] = {}
        self.changed = trio.Event()  # set when the file is out of date

    def __len__(self) -> int:
        return len(self._records)

    def live_count(self) -> int:
        return sum(r.live for r in self._records.values())

    def get(self, sid: str) -> Record | None:
        record = self._records.get(sid)
        if record is not None and not record.live and self._stale(record):
            self.drop(sid)
            return None
        return record

    def admit(self, token: str) -> Admission:
        """Whether `token` may open one more session, and which records give way for it."""
        self._forget_stale()
        evict: list[Record] = []
        own = [r for r in self._records.values() if r.token == token]
        if len(own) >= self.per_token:
            victim = _longest_idle(r for r in own if not r.in_flight)
            if victim is None:
                return Admission(reason=f"this token has {len(own)} sessions open, all busy "
                                        f"([http] max_sessions_per_token = {self.per_token})")
            evict.append(victim)
        if len(self._records) - len(evict) >= self.overall:
            victim = _longest_idle(r for r in self._records.values() if not r.live and r not in evict)
            if victim is None:
                return Admission(reason=f"{len(self._records)} sessions are open "
                                        f"([http] max_sessions = {self.overall})")
            evict.append(victim)
        for record in evict:
            self.drop(record.sid)
        return Admission(evict=tuple(evict))

    def add(self, sid: str, token: str) -> Record:
        record = Record(sid, token, trio.current_time())
        self._records[sid] = record
        return record

    def established(self, sid: str, params: dict[str, Any]) -> None:
        """The opening request of `sid` succeeded with these initialize params: worth keeping."""
        record = self._records.get(sid)
        if record is not None and http_session_file.params_fit(params):
            record.initialize = params
            self.changed.set()

    def drop(self, sid: str) -> None:
        record = self._records.pop(sid, None)
        if record is not None and record.revivable:
            self.changed.set()

    def went_dormant(self, sid: str) -> None:
        """The SDK freed `sid` (idle, or the daemon stops): keep it revivable if it can be."""
        record = self._records.get(sid)
        if record is None:
            return
        if not record.revivable:
            self.drop(sid)
            return
        record.live = False
        record.in_flight = 0

    def begin(self, record: Record) -> None:
        record.in_flight += 1
        record.last_used = trio.current_time()

    def end(self, record: Record) -> None:
        record.in_flight = max(0, record.in_flight - 1)
        record.last_used = trio.current_time()

    def _stale(self, record: Record) -> bool:
        return trio.current_time() - record.last_used >= self.keep_s

    def _forget_stale(self) -> None:
        for record in [r for r in self._records.values() if not r.live and self._stale(r)]:
            self.drop(record.sid)

    # The file: dormant records of the last run in, revivable records out.

    def stored(self) -> list[Stored]:
        now, wall = trio.current_time(), self._wall()
        return [Stored(r.sid, r.token, r.initialize, wall - (now - r.last_used))
                for r in self._records.values() if r.revivable]

    def restore(self, stored: list[Stored]) -> None:
        """Records of a previous run, dormant; the stale and those over the caps (longest idle) left out."""
        now, wall = trio.current_time(), self._wall()
        for s in sorted(stored, key=lambda s: -s.last_used_wall):  # most recently used first
            record = Record(s.sid, s.token, now - max(0.0, wall - s.last_used_wall), s.initialize, live=False)
            own = sum(r.token == s.token for r in self._records.values())
            if self._stale(record) or own >= self.per_token or len(self._records) >= self.overall:
                continue
            self._records[s.sid] = record


def _longest_idle(records: Any) -> Record | None:
    return min(records, key=lambda r: r.last_used, default=None)
