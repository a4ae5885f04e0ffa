"""What an index actor reads once per key from a capture (its NGAP model, its PFCP and SBI rows, a
protocol's response times), whoever asks: the reading runs in the actor's nursery, so concurrent calls
share one, and a call that times out leaves it going for the next; with a limiter, readings of different
keys wait their turn (a cut read by a child bounded to 1.28 GB: never two at once). The last few values
are kept; a failure is remembered, for good when the capture cannot give the value (`permanent`), else
until RETRY_AFTER_S (a tshark killed under memory pressure, a full disk, sharkd failing: may pass), and
said at once meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import structlog
import trio

from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

RETRY_AFTER_S = 60.0
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Readings(Generic[K, V]):
    """Values by key, read once (`get`); `what` names them in errors ("the NGAP model")."""

    def __init__(self, what: str, kept: int, permanent: tuple[type[Exception], ...] = (),
                 limiter: trio.CapacityLimiter | None = None) -> None:
        self.what = what
        self.kept = kept
        self.permanent = permanent  # failures that say the capture cannot give the value: never tried again
        self.limiter = limiter  # readings at once (daemon-wide: each cut read by a memory-bounded child)
        self._nursery: trio.Nursery | None = None
        self._values: dict[K, V] = {}  # least recently used first
        self._failed: dict[K, tuple[DiagdError, float]] = {}  # why, until when (Trio clock)
        self._reading: dict[K, trio.Event] = {}

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def busy(self) -> bool:
        return bool(self._reading)

    def failure(self, key: K) -> DiagdError | None:
        """Why the value of `key` is not read (remembered, not yet due to be tried again), or None."""
        failed, until = self._failed.get(key, (None, 0.0))
        return failed if failed is not None and trio.current_time() < until else None

    async def get(self, key: K, read: Callable[[], Awaitable[V]]) -> V:
        """The value of `key`, read by `read` in the nursery unless kept; its failure as a coded error
        (DiagdError as raised; any other with `index_unanswered`: the loaded capture answers)."""
        while (value := self._values.get(key)) is None:
            if (failed := self.failure(key)) is not None:
                raise DiagdError(failed.code, failed.message, **failed.details)
            reading = self._reading.get(key)
            if reading is None:
                assert self._nursery is not None, "start() first"
                reading = self._reading[key] = trio.Event()
                self._nursery.start_soon(self._read, key, read, reading)
            await reading.wait()
        self._values[key] = self._values.pop(key)  # most recently used last
        return value

    async def _read(self, key: K, read: Callable[[], Awaitable[V]], done: trio.Event) -> None:
        self._failed.pop(key, None)
        try:
            if self.limiter is None:
                self._values[key] = await read()
            else:
                async with self.limiter:
                    self._values[key] = await read()
            while len(self._values) > self.kept:
                self._values.pop(next(iter(self._values)))
        except self.permanent as exc:  # of this capture for good
            self._fail(key, exc if isinstance(exc, DiagdError) else DiagdError(
                ErrorCode.NOT_FOUND, f"{self.what} is not read from the index: {exc}", index_unanswered=True),
                math.inf)
        except DiagdError as exc:  # refused (too big) or not answered here (the memory bound): tried again later
            self._fail(key, exc, trio.current_time() + RETRY_AFTER_S)
        except Exception as exc:  # a full disk, a damaged index, a bug: said and tried again, never the actor's end
            log.warning("reading from the index failed", what=self.what, error=repr(exc))
            self._fail(key, DiagdError(ErrorCode.NOT_FOUND, f"{self.what} is not read from the index: "
                                       f"{type(exc).__name__}: {exc}", index_unanswered=True),
                       trio.current_time() + RETRY_AFTER_S)
        finally:
            del self._reading[key]
            done.set()

    def _fail(self, key: K, error: DiagdError, until: float) -> None:
        self._failed[key] = (error, until)
        while len(self._failed) > self.kept * 4:  # a few remembered: an older one is tried again when asked
            self._failed.pop(next(iter(self._failed)))
