"""Which captures stay loaded: admission of calls under `max_loaded`, and eviction that never stops a capture in use.

The back end keeps at most `[pcap] max_loaded` captures loaded, and their sharkd workers within
`max_memory_mb`. A capture is *in use* from the moment a call for it is admitted until that call
returns (queued in the actor's inbox, waiting for a worker, or running): such a capture is never
evicted. A call for a capture that is not loaded when `max_loaded` are:
- evicts the least recently used capture that is not in use, and goes on;
- when every loaded capture is in use, waits for one to finish its calls, within the call's
  deadline less BUSY_MARGIN_S; past that it is refused with BUSY, `retry_after_s` and the reason
  ("all N loaded captures are busy; max_loaded=N").
Over the memory budget, idle captures are evicted oldest first; captures in use stay (the budget
is then exceeded until they finish, and a busy capture gets no second worker meanwhile).

One `LoadedCaptures` per back end, used from tool handlers (Trio tasks of one thread): its tables
change only between checkpoints. It decides and waits; the back end stops the actors it names (the
table calls nothing back, so a call's path never returns to the back end through it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
import trio

from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

BUSY_MARGIN_S = 1.0  # a call waiting for a loaded capture to be free gives up this long before its deadline


@dataclass(frozen=True)
class Evict:
    """Stop this capture's actor (it is loaded and idle), then ask again."""

    key: str
    why: str


class LoadedCaptures:
    """The loaded captures by last use, the calls in each, and the rule for evicting one.

    `loaded` arguments are the keys whose actor runs now (the back end asks its runtime)."""

    def __init__(self) -> None:
        self.recent: OrderedDict[str, float] = OrderedDict()  # key -> its last use (least recent first)
        self._calls: dict[str, list[float]] = {}  # key -> when each call in it was admitted
        self._changed = trio.Event()
        self.evicted = 0
        self.refused = 0

    def __repr__(self) -> str:
        return f"<LoadedCaptures [known: {len(self.recent)}, in use: {len(self._calls)}, evicted: {self.evicted}]>"

    def in_use(self, key: str) -> bool:
        return bool(self._calls.get(key))

    def _counted(self, loaded: set[str]) -> list[str]:
        """Captures loaded, or being loaded for a call, least recently used first."""
        for key in [k for k in self.recent if k not in loaded and not self.in_use(k)]:
            del self.recent[key]  # stopped on its own: idle timeout, diagd_stop_actor, failure
        return list(self.recent)

    def room_for(self, key: str, loaded: set[str], max_loaded: int) -> Evict | bool:
        """True: `key` may be loaded now (or is); Evict: stop that one first; False: every loaded
        capture is in use (wait_for_change, then ask again)."""
        counted = self._counted(loaded)
        if key in counted or len(counted) < max_loaded:
            return True
        idle = [k for k in counted if not self.in_use(k)]
        if idle:
            return Evict(idle[0], f"max_loaded={max_loaded}: the least recently used idle capture")
        return False

    def over_memory(self, held: dict[str, int], budget_bytes: int, *, keep: str) -> list[Evict]:
        """Idle captures to evict, least recently used first, until the rest (`held`: bytes each
        loaded capture's workers hold) fit in the budget; captures in use are never named."""
        total = sum(held.values())
        victims = []
        for key in [k for k in self.recent if k in held and k != keep and not self.in_use(k)]:
            if total <= budget_bytes:
                break
            victims.append(Evict(key, f"max_memory_mb={budget_bytes // 2**20}: the least recently used idle capture"))
            total -= held[key]
        return victims

    def evicted_now(self, evict: Evict) -> None:
        assert not self.in_use(evict.key), "a capture in use is never evicted"
        self.recent.pop(evict.key, None)
        self.evicted += 1
        self._notify()

    async def wait_for_change(self, key: str, max_loaded: int, deadline: float) -> None:
        """Wait until a capture's calls end (then ask room_for again); BUSY when that would take
        past the call's deadline less BUSY_MARGIN_S."""
        with trio.move_on_at(deadline - BUSY_MARGIN_S):
            await self._changed.wait()
            return
        self.refused += 1
        raise self._busy(max_loaded)

    @contextmanager
    def in_call(self, key: str) -> Iterator[None]:
        """`key` in use for one call (never evicted meanwhile), and the most recently used."""
        self._calls.setdefault(key, []).append(trio.current_time())
        self._touch(key)
        try:
            yield
        finally:
            started = self._calls[key]
            started.pop(0)
            if not started:
                del self._calls[key]
            self._touch(key)
            self._notify()

    def _touch(self, key: str) -> None:
        self.recent[key] = trio.current_time()
        self.recent.move_to_end(key)

    def _busy(self, max_loaded: int) -> DiagdError:
        now = trio.current_time()
        running = [now - started for calls in self._calls.values() for started in calls]
        retry = max(1, math.ceil(min(running, default=1.0)))
        busy = len(self._calls)
        return DiagdError(ErrorCode.BUSY, f"all {busy} loaded captures are busy; max_loaded={max_loaded}: this "
                          f"capture could not be loaded within this call's time; retry in {retry} s (or raise "
                          "[pcap] max_loaded)", retry_after_s=retry, max_loaded=max_loaded, captures_busy=busy)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
