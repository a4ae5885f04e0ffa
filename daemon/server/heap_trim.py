"""Give the memory of a finished call back to the OS once the daemon goes quiet (issue 12).

A call that reads a 40 MB stored output page, renders protocol trees or encodes a large answer frees
what it allocated, but glibc keeps freed heap memory for reuse: the daemon's RSS would stay at the
high-water mark of its biggest call. `QuietTrimmer` is a call observer: after calls finished, and
once none has finished for `quiet_s` (on the Trio clock), it runs `malloc_trim(0)` once (a few ms),
so the RSS comes back within seconds of the last big output, not never.
"""

from __future__ import annotations

import math

import trio

from diagd.actors import heap
from diagd.daemon.server.audit import CallRecord

QUIET_S = 2.0


class QuietTrimmer:
    def __init__(self, quiet_s: float = QUIET_S) -> None:
        self.quiet_s = quiet_s
        self.trims = 0
        self._due = math.inf  # Trio time of the next trim; inf: nothing to give back
        self._wake = trio.Event()

    def observe(self, record: CallRecord) -> None:
        if record.outcome != "started":
            self.poke()

    def poke(self) -> None:
        """Something freed memory (a call's, an HTTP session's): trim once things are quiet."""
        self._due = trio.current_time() + self.quiet_s
        self._wake.set()

    async def run(self) -> None:
        while True:
            if math.isinf(self._due):
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            await trio.sleep_until(self._due)
            if trio.current_time() >= self._due:  # no call finished while this one slept
                self._due = math.inf
                heap.trim()
                self.trims += 1
