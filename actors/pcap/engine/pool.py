"""The sharkd workers of one capture: one loaded first, a second when calls would queue behind it.

sharkd answers one request at a time, and a new display filter holds it for a whole pass over the
capture. So a capture whose worker is busy gets another one (loaded from the same file, decoded the
same way) when the memory budget and the cores allow it; cheap requests (a frame tree, a page of a
filter a worker has already computed) then go to whichever worker is free instead of waiting for
the pass. A spare worker that has been idle for `SPARE_IDLE_S` is stopped again.

sharkd keeps a bitmap per filter it has run: a page of such a filter costs milliseconds on that
worker and a whole pass on another. Each worker records the filters it holds, and a request names
its filter so that the pool prefers the worker that has it.

All of this runs in the actor's tasks (one Trio thread): the pool's lists change only between
checkpoints, and `_changed` wakes every waiter whenever a worker is freed, loaded or lost.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors import system
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.shark.sharkd import Sharkd, SharkdError, SharkdProcess
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

SPARE_IDLE_S = 120.0  # a spare worker unused this long is stopped (its memory is a whole capture's)
HELD_REFRESH_S = 0.25  # the held bytes (eviction's figure) are re-read after requests at most this often
BUSY_MARGIN_S = 1.0  # a call waiting for a worker gives up this long before its deadline, with BUSY
# A filter pass reads every frame, as the load did: a worker freed later than this many loads before
# the deadline could not end it in time (a burst of new filters timed out one that way: it got its
# worker 1.0 s before its deadline for a 1.3 s pass), so the waiting call says BUSY then instead.
PASS_MARGIN_LOADS = 1.5

# sharkd's RSS for a capture, estimated before loading it (docs/benchmarks.md: 159 MB with nothing
# loaded, 195 MB with a 55 MB capture): over the memory budget, no worker is started at all.
SHARKD_BASE_BYTES = 160 * 2**20
SHARKD_BYTES_PER_FILE_BYTE = 0.66


def estimated_rss(size: int) -> int:
    return SHARKD_BASE_BYTES + int(size * SHARKD_BYTES_PER_FILE_BYTE)


Headroom = Callable[[], int | None]  # bytes the pcap memory budget still allows (None: no limit)
# How a worker's sharkd is started (Sharkd.start; a scripted fake in the unit tests).
Launch = Callable[[trio.Nursery, Path], Awaitable[SharkdProcess]]


class WorkerState(enum.Enum):
    """Where one worker is: its `value` is what diagd_status shows."""

    LOADING = "loading"
    FAILED = "failed"
    BUSY = "busy"
    IDLE = "idle"
    STOPPED = "stopped"


class CaptureState(enum.Enum):
    """Where a capture's pool is: LOADING until a worker is ready, FAILED when no worker could load
    it, STOPPED when every worker died, READY otherwise."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class Worker:
    """One sharkd process with the capture loaded (or loading)."""

    number: int
    sharkd: SharkdProcess | None = None
    loaded: trio.Event = field(default_factory=trio.Event)
    error: DiagdError | None = None
    busy: str | None = None  # what it is doing now (a method name), None when free
    busy_since: float = 0.0
    filters: set[str] = field(default_factory=set)
    last_used: float = 0.0
    load_s: float = 0.0  # from the start to loaded (a held start, WorkerPool.hold, not counted)
    paused: bool = False  # its request (a background pass) stopped while calls use the cores

    def pause(self) -> None:
        if self.sharkd is not None and self.sharkd.alive and not self.paused:
            self.sharkd.pause()
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            if self.sharkd is not None:
                self.sharkd.resume()

    @property
    def ready(self) -> bool:
        return self.loaded.is_set() and self.error is None and self.sharkd is not None and self.sharkd.alive

    @property
    def state(self) -> WorkerState:
        if not self.loaded.is_set():
            return WorkerState.LOADING
        if self.error is not None:
            return WorkerState.FAILED
        if self.busy:
            return WorkerState.BUSY
        return WorkerState.IDLE if self.ready else WorkerState.STOPPED

    def __repr__(self) -> str:
        doing = f", doing: {self.busy}" if self.busy else ""
        return f"<Worker {self.number} [{self.state.name}{doing}, filters held: {len(self.filters)}]>"

    def describe(self) -> dict[str, Any]:
        sharkd = self.sharkd
        return {"worker": self.number, "role": "sharkd", "pid": sharkd.pid if sharkd else None,
                "rss_bytes": sharkd.rss_bytes() if sharkd and sharkd.alive else None,
                "state": self.state.value, "doing": self.busy, "paused": self.paused, "load_s": round(self.load_s, 3),
                "requests": sharkd.requests if sharkd else 0, "filters_held": len(self.filters)}


class Lease:
    """One worker lent to one request: its sharkd is reached only through here."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def pause(self) -> None:
        """Stop the worker's sharkd where it is (Worker.pause): a background pass yielding to calls."""
        self._worker.pause()

    def resume(self) -> None:
        self._worker.resume()

    async def call(self, method: str, params: dict[str, Any] | None = None, *, keep: int | None = None) -> Any:
        assert self._worker.sharkd is not None
        return await self._worker.sharkd.call(method, params, keep=keep)

    async def call_many(self, method: str, params: list[dict[str, Any]]) -> list[Any]:
        assert self._worker.sharkd is not None
        return await self._worker.sharkd.call_many(method, params)


@dataclass
class LoadFacts:
    """What the first worker's load tells about the capture, and what its workers hold now."""

    frame_count: int = 0
    warning: str | None = None
    column_formats: dict[str, int] = field(default_factory=dict)
    # RSS of the capture's sharkd workers, refreshed whenever one is freed, loaded or lost: the back
    # end's memory budget reads it without calling into the capture.
    held_bytes: int = 0


class WorkerPool:
    """The sharkd workers of one capture: loading them, lending a free one, growing and retiring spares."""

    def __init__(self, nursery: trio.Nursery, spec: CaptureSpec, config_dir: Path, *, max_workers: int,
                 headroom: Headroom, launch: Launch = Sharkd.start, cores: int | None = None) -> None:
        self._nursery = nursery
        self.spec = spec
        self.config_dir = config_dir
        self.max_workers = max(1, min(max_workers, cores or os.cpu_count() or 1))
        self._headroom = headroom
        self._launch = launch
        self.workers: list[Worker] = []
        self._numbers = 0
        self._changed = trio.Event()
        self._held_at = -math.inf  # when held_bytes was last read
        self._short_waiting = 0
        self._acquiring = 0  # calls waiting for a worker now (short and long)
        self.facts = LoadFacts()
        self.loads = 0
        self.grown = 0
        # Why no worker is ever started (the capture would not fit the memory budget): the capture stays
        # LOADING, so every answer that tshark gives while sharkd loads is given, and a call that needs
        # sharkd gets this error instead of waiting.
        self.refused: DiagdError | None = None
        # Set when a worker may start: a fresh big capture's first load waits for the first answer's
        # early pass (passes.CaptureWorkers.head_start).
        self.hold: trio.Event | None = None
        # Called when a request must wait for a worker: a paused background pass (passes.py) is resumed.
        self.on_wait: Callable[[], None] = lambda: None

    # -- loading ------------------------------------------------------------------------------

    def begin(self) -> Worker:
        """Start loading a worker in the background; the first one's facts become the capture's."""
        self._numbers += 1
        worker = Worker(self._numbers)
        self.workers.append(worker)
        self._nursery.start_soon(self._load, worker)
        return worker

    async def _load(self, worker: Worker) -> None:
        if self.hold is not None:
            # Not even started: sharkd's own start (dissector registration, 0.25 s of CPU) beside the
            # early tshark's made that pass 0.34-0.46 s instead of 0.29 s on the 55 MB bench capture.
            await self.hold.wait()
        started = trio.current_time()
        try:
            facts = await self._load_sharkd(worker)
            if not any(w.ready for w in self.workers if w is not worker):
                # The capture's facts come from the worker that is serving (updated in place: the
                # actor holds this object).
                self.facts.frame_count, self.facts.warning = facts.frame_count, facts.warning
                self.facts.column_formats = facts.column_formats
        except DiagdError as exc:
            worker.error = exc
        except Exception as exc:
            worker.error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd failed to load: {exc}")
        finally:
            worker.load_s = trio.current_time() - started
            worker.last_used = trio.current_time()
            worker.loaded.set()
            if worker.error is None:
                self.loads += 1
            else:
                log.info("sharkd worker failed to load", worker=worker.number, error=worker.error.message,
                         calls_waiting=self._acquiring)
                # A spare that failed: the capture is served anyway. A load no call was waiting for
                # (a fresh capture's first page came from tshark, then sharkd was killed or crashed):
                # nobody is told, and handing the failure to some later call would blame it for a
                # load it never saw; that call starts a fresh worker and meets any lasting error itself.
                if any(w.ready for w in self.workers) or not self._acquiring:
                    self.workers.remove(worker)
                    self._retire(worker)
            self._notify()

    async def _load_sharkd(self, worker: Worker) -> LoadFacts:
        sharkd = worker.sharkd = await self._launch(self._nursery, self.config_dir)
        # Preferences go in before the file is read: some act only in the first, sequential pass
        # (sctp.association_index numbers associations there; set after `load` every frame says 65535).
        for name, value in self.spec.preferences:
            try:
                await sharkd.call("setconf", {"name": name, "value": value})
            except SharkdError as exc:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                                 f"preference {name}={value}: {exc.sharkd_message}") from None
        try:
            frames, warning = await sharkd.load(str(self.spec.path))
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sharkd cannot read {self.spec.path}: {exc.sharkd_message}",
                             path=str(self.spec.path)) from None
        info = await sharkd.call("info")
        # Column formats are an enum whose order sharkd lists in `info`: map %m, %t, ... to indices.
        formats = {c["format"]: i for i, c in enumerate(info.get("columns", []))}
        return LoadFacts(frames, warning, formats)

    def _notify(self, *, request_done: bool = False) -> None:
        # After a request the held bytes are read at most every HELD_REFRESH_S: reading every worker's
        # /proc status after each of a text search's 200 tree requests cost ~0.15 ms apiece. A load,
        # a new worker or a stopped one refreshes them at once.
        now = trio.current_time()
        if not request_done or now - self._held_at >= HELD_REFRESH_S:
            self.facts.held_bytes = self.rss_bytes()
            self._held_at = now
        self._changed.set()
        self._changed = trio.Event()

    # -- state --------------------------------------------------------------------------------

    def load_position(self) -> int | None:
        """Bytes of the capture file a loading worker's sharkd has read so far (None: not known)."""
        for worker in self.workers:
            sharkd = worker.sharkd
            if not worker.loaded.is_set() and sharkd is not None and sharkd.alive:
                return system.read_position(sharkd.pid, self.spec.path)
        return None

    @property
    def loading(self) -> bool:
        """The capture is still loading: no worker has ever been ready and one is on its way (or none
        ever will be: `refused`)."""
        if self.refused is not None:
            return True
        return not any(w.ready for w in self.workers) and any(not w.loaded.is_set() for w in self.workers)

    @property
    def state(self) -> CaptureState:
        if self.loading:
            return CaptureState.LOADING
        if self.first_error() is not None:
            return CaptureState.FAILED
        return CaptureState.READY if any(w.ready for w in self.workers) else CaptureState.STOPPED

    @property
    def busy_count(self) -> int:
        return sum(1 for w in self.workers if w.busy)

    def __repr__(self) -> str:
        return (f"<WorkerPool [{self.state.name}, workers: {len(self.workers)}, busy: {self.busy_count}] "
                f"{self.spec.path.name}>")

    def holders(self, display_filter: str) -> list[Worker]:
        return [w for w in self.workers if w.ready and display_filter in w.filters]

    def first_error(self) -> DiagdError | None:
        """The load error of a capture no worker could load (the first worker's, reported once)."""
        for worker in self.workers:
            if worker.error is not None and not any(w.ready or not w.loaded.is_set() for w in self.workers):
                return worker.error
        return None

    def rss_bytes(self) -> int:
        return sum(w.sharkd.rss_bytes() or 0 for w in self.workers if w.sharkd is not None and w.sharkd.alive)

    def statistics(self) -> list[dict[str, Any]]:
        return [w.describe() for w in self.workers]

    # -- using a worker -----------------------------------------------------------------------

    @asynccontextmanager
    async def use(self, doing: str, *, display_filter: str | None = None, deadline: float = math.inf,
                  long: bool = False) -> AsyncIterator[Lease]:
        """A free, loaded worker for one request (or a few on the same worker), preferring the one
        holding `display_filter`'s bitmap. Waits for one to be free; starts another when calls would
        queue and the budget allows; BUSY (with when to retry) rather than waiting past `deadline`.
        A `long` request (a filter pass) lets waiting short ones go first."""
        if self.hold is not None:
            self.hold.set()  # a call waits for a worker: the held load is what it waits for now
        worker = await self._acquire(doing, display_filter, deadline, long)
        try:
            yield Lease(worker)
            if display_filter is not None:
                worker.filters.add(display_filter)
        finally:
            worker.busy = None
            worker.last_used = trio.current_time()
            self._notify(request_done=True)

    async def _acquire(self, doing: str, display_filter: str | None, deadline: float, long: bool) -> Worker:
        if not long:
            self._short_waiting += 1
        self._acquiring += 1
        try:
            return await self._wait_for_worker(doing, display_filter, deadline, long)
        finally:
            self._acquiring -= 1
            if not long:
                self._short_waiting -= 1

    async def _wait_for_worker(self, doing: str, display_filter: str | None, deadline: float, long: bool
                               ) -> Worker:
        if self.refused is not None:
            raise self.refused
        while True:
            self._drop_dead()
            error = self.first_error()
            if error is not None:
                self.forget_failed()  # reported to the calls waiting now; the next call loads anew
                raise error
            worker = self._free(display_filter)
            if worker is not None and long and self._short_waiting and self.free_count() <= self._short_waiting:
                worker = None  # a pass would hold it for long: the short requests waiting go first
            if worker is not None:
                worker.busy, worker.busy_since = doing, trio.current_time()
                return worker
            self.grow()
            if not self.workers:
                self.begin()  # every worker died: a fresh one for this call
                continue
            self.on_wait()  # a paused request holding a worker goes on: this call may need that worker
            with trio.move_on_at(deadline - self._margin(long)):
                await self._changed.wait()
                continue
            raise self._busy()

    def _margin(self, long: bool) -> float:
        """How long before its deadline a call waiting for a worker gives up (BUSY)."""
        if not long:
            return BUSY_MARGIN_S
        return max(BUSY_MARGIN_S, PASS_MARGIN_LOADS * max((w.load_s for w in self.workers if w.ready), default=0.0))

    def _free(self, display_filter: str | None) -> Worker | None:
        free = [w for w in self.workers if w.ready and w.busy is None]
        if display_filter is not None:
            holding = [w for w in free if display_filter in w.filters]
            if holding:
                return holding[0]
            if self.holders(display_filter):
                return None  # the holder is busy: its next free moment costs less than a pass elsewhere
        return free[0] if free else None

    def free_count(self) -> int:
        """Workers loaded and free now."""
        return sum(1 for w in self.workers if w.ready and w.busy is None)

    def grow(self) -> None:
        """Another worker when none is loading and cores and memory allow it (a long request is about
        to take a worker, or every one is busy)."""
        if len(self.workers) >= self.max_workers or any(not w.loaded.is_set() for w in self.workers):
            return
        ready = [w for w in self.workers if w.ready]
        if not ready:
            return
        headroom = self._headroom()
        need = max(w.sharkd.rss_bytes() or 0 for w in ready if w.sharkd is not None)
        if headroom is not None and need > headroom:
            return
        self.grown += 1
        log.info("second sharkd worker for a busy capture", capture=self.spec.path.name, workers=len(self.workers) + 1)
        self.begin()

    def _busy(self) -> DiagdError:
        now = trio.current_time()
        busy = [w for w in self.workers if w.busy]
        running = [now - w.busy_since for w in busy]
        retry = max(1, math.ceil(min(running, default=1.0)))
        return DiagdError(ErrorCode.BUSY, f"all {len(self.workers)} sharkd workers of {self.spec.path.name} are "
                          f"busy ({', '.join(w.busy or '' for w in busy)}) and this call's time is nearly up; "
                          f"retry in {retry} s", retry_after_s=retry, workers=len(self.workers))

    def _drop_dead(self) -> None:
        """Forget workers that died after loading (killed, crashed): the next acquire replaces them."""
        dead = [w for w in self.workers if w.loaded.is_set() and w.error is None and not w.ready]
        for worker in dead:
            self.workers.remove(worker)
            self._retire(worker)

    def retire_idle_spares(self) -> None:
        """Stop spare workers idle for SPARE_IDLE_S; the first ready one always stays."""
        now = trio.current_time()
        ready = [w for w in self.workers if w.ready]
        for worker in ready[1:]:
            if worker.busy is None and now - worker.last_used >= SPARE_IDLE_S:
                self.workers.remove(worker)
                self._retire(worker)

    def forget_failed(self) -> None:
        """Drop workers whose load failed (after their error was reported): the next call loads anew."""
        for worker in [w for w in self.workers if w.error is not None]:
            self.workers.remove(worker)
            self._retire(worker)

    def _retire(self, worker: Worker) -> None:
        if worker.sharkd is not None:
            self._nursery.start_soon(worker.sharkd.close)
        self._notify()

    async def close(self) -> None:
        self.facts.held_bytes = 0
        for worker in self.workers:
            if worker.sharkd is not None:
                await worker.sharkd.close()
        self.workers.clear()
