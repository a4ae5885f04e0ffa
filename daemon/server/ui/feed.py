"""The web view's live call list: a registry observer that keeps the latest call records as JSON and
wakes the event streams (/ui/api/events) waiting for the next one.

Each record (a call's "started" one, then its outcome, with one `call_id`) gets a sequence number;
a stream sends every record after the last it sent, so a browser that reconnects (EventSource's
Last-Event-ID) misses nothing still kept. What is kept is bounded like `CallStats.recent`: the latest
`KEEP` records and `KEEP_BYTES` of their JSON. Arguments are as the audit log keeps them (long
strings already cut by the registry). Installed when the HTTP listener starts (http/start.py).
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import trio

from diagd.daemon.server.audit import CallRecord

KEEP = 500
KEEP_BYTES = 2 * 1024 * 1024
KEEP_REPLAYS = 200  # calls of tools with a view the page may show again (their arguments: small)


@dataclass(frozen=True)
class Replay:
    """A call the web view may run again to show its view: the tool, its arguments, the client's directory."""

    tool: str
    arguments: Any
    cwd: str | None


class CallFeed:
    """Call records as numbered JSON texts, and a wait for the next one."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES, *, views: dict[str, str] | None = None
                 ) -> None:
        self.boot = secrets.token_hex(4)  # which daemon numbered them: a restart numbers from 1 again
        self.views = dict(views or {})  # tool -> the name of its built view
        self._replays: OrderedDict[str, Replay] = OrderedDict()
        self.seq = 0
        self.closed = False
        self._events: deque[tuple[int, str]] = deque()
        self._bytes = 0
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._changed = trio.Event()

    def observe(self, record: CallRecord) -> None:
        self.seq += 1
        shown: dict[str, Any] = {"seq": self.seq, **record.to_json()}
        view = self.views.get(record.tool)
        if view is not None and record.call_id is not None:
            if record.replay is not None:
                self._replays[record.call_id] = Replay(record.tool, *record.replay)
                while len(self._replays) > KEEP_REPLAYS:
                    self._replays.popitem(last=False)
            if record.call_id in self._replays:
                shown["view"] = view
        text = json.dumps(shown, separators=(",", ":"), default=str)
        self._events.append((self.seq, text))
        self._bytes += len(text)
        while len(self._events) > 1 and (len(self._events) > self._keep or self._bytes > self._keep_bytes):
            self._bytes -= len(self._events.popleft()[1])
        self._wake()

    def replay(self, call_id: str) -> Replay | None:
        """The call `call_id`, when it is one of a tool with a view still kept."""
        return self._replays.get(call_id)

    def since(self, seq: int) -> list[tuple[int, str]]:
        """The kept records numbered after `seq`, oldest first."""
        return [(n, text) for n, text in self._events if n > seq]

    async def wait(self, seq: int) -> None:
        """Return once there is a record after `seq` (or the feed closed)."""
        while self.seq <= seq and not self.closed:
            await self._changed.wait()

    async def close(self, reason: str = "") -> None:
        """The daemon stops: the streams end now rather than at hypercorn's graceful timeout."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
