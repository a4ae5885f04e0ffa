"""The shared actor machinery: requests, the run loop, and supervision policy as data.

An actor owns one resource (a serial port, a sharkd worker, a crash session, ...). It is a
Trio task with its own inbox and cancel scope; the daemon's supervisor starts it when a back end
asks (`Runtime.start`) and restarts or fails it by its declared `SupervisionPolicy`.

Each actor kind subclasses `Actor` and implements the same small surface: `start()` (acquire the
resource; the actor only counts as ready once this returns), `handle()` (serve one request),
`stop()` (release the resource, bounded), `statistics()`. Requests carry a message: a frozen
dataclass of the actor kind, dispatched with `match request.message`. A message that subclasses
`Message[SomeReply]` says what its reply is: `Runtime.ask` returns that model to the tool handler, and
the actor answers it with `message.reply(...)`, which takes only that model, so mypy checks both ends.

What a request's handler raises is that request's answer, never the actor's end: a `DiagdError` as
it is, any other exception (a bug some input met: an empty page, a value not foreseen) as
INTERNAL_ERROR naming it in one line (its traceback goes to the daemon's log), and the actor serves
its other requests on. Only a fault of the back end itself restarts the actor by its policy: an
exception from the actor's own tasks (a reader of its child's pipe), a failed restart, or a handler
raising `BackendFault` (its child died under the call, its device broke beyond this request).
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

import structlog
import trio

from diagd.protocol.errors import DiagdError, ErrorCode, as_error

log = structlog.get_logger("diagd.actor")

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]

class RestartKind(enum.StrEnum):
    PERMANENT = "permanent"  # restart after a crash and after a normal exit
    TRANSIENT = "transient"  # restart only after a crash
    TEMPORARY = "temporary"  # never restart


@dataclass(frozen=True)
class SupervisionPolicy:
    restart: RestartKind = RestartKind.TRANSIENT
    max_restarts: int = 3
    window_s: float = 60.0
    # Before the n-th restart within the window we wait backoff_s * 2**(n-1), capped.
    backoff_s: float = 0.1
    backoff_max_s: float = 5.0
    stop_grace_s: float = 5.0


class ActorState(enum.StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    STOPPED = "stopped"
    EXPIRED = "expired"
    FAILED = "failed"


class Request:
    """One message in an actor's inbox, with its progress callback and the reply slot.

    The caller waits on `wait()`; if the caller goes away (client cancel or disconnect) it
    calls `abandon()`, which cancels the request wherever it is: still queued (the actor
    skips it) or running (its cancel scope fires).
    """

    def __init__(self, message: object, progress: ProgressFn | None = None) -> None:
        self.message = message
        self.progress = progress
        self.enqueued_at = trio.current_time()
        # The caller's deadline (its tool call's timeout): the actor serves the request in its own
        # task, so a wait inside it (a free worker) can refuse with BUSY before the caller times out.
        self.deadline = trio.current_effective_deadline()
        self.started_at: float | None = None
        self.scope = trio.CancelScope()
        self._done = trio.Event()
        self._result: dict[str, Any] | None = None
        self._error: DiagdError | None = None

    @property
    def label(self) -> str:
        """What the request asks, for status: the message's type name."""
        return type(self.message).__name__

    @property
    def resolved(self) -> bool:
        return self._done.is_set()

    def resolve(self, result: dict[str, Any]) -> None:
        if not self._done.is_set():
            self._result = result
            self._done.set()

    def fail(self, error: DiagdError) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()

    def abandon(self) -> None:
        self.scope.cancel()
        self.fail(DiagdError(ErrorCode.CANCELLED, "the caller went away"))

    @property
    def queue_s(self) -> float:
        end = self.started_at if self.started_at is not None else trio.current_time()
        return end - self.enqueued_at

    async def wait(self) -> dict[str, Any]:
        try:
            await self._done.wait()
        except BaseException:
            self.abandon()
            raise
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress is not None:
            await self.progress(progress, total, message)


def unhandled(actor: str, request: Request) -> DiagdError:
    """The one refusal of a message an actor does not know (a programming slip, but never a crash)."""
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"the {actor} actor cannot handle {request.label}")


class Actor(abc.ABC):
    """Base class of every actor kind; one instance per (re)start of a resource."""

    kind: ClassVar[str]
    policy: ClassVar[SupervisionPolicy] = SupervisionPolicy()
    # How many requests the actor serves at once. 1 (the default): one after the other, so a handler
    # owns the actor's state between checkpoints. More: the actor shares out what it owns itself
    # (the pcap actor's sharkd workers), and its handlers must not assume they run alone.
    concurrency: ClassVar[int] = 1

    def __init__(self, resource: str, settings: Any = None) -> None:
        self.resource = resource
        self.settings = settings

    async def start(self, nursery: trio.Nursery) -> None:
        """Acquire the resource; background tasks go into `nursery` (the actor's own)."""

    @abc.abstractmethod
    async def handle(self, request: Request) -> dict[str, Any]:
        """Serve one request; raise DiagdError for a failure the caller should see."""

    async def stop(self) -> None:
        """Release the resource. Runs shielded, bounded by the policy's stop_grace_s."""

    def statistics(self) -> dict[str, Any]:
        return {}

    def working(self) -> bool:
        """Work of its own under way that no call waits for (an index build): the idle timeout does
        not end the actor meanwhile; it is asked again one idle timeout later."""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} [{self.kind} {self.resource}]>"


@dataclass
class ActorRuntime:
    """What the run loop reports to its supervisor (shared, updated in place)."""

    state: ActorState = ActorState.STARTING
    idle_deadline: float = math.inf
    idle_timeout_s: float = math.inf
    idle_since: float = 0.0
    idle_scope: trio.CancelScope | None = None  # the wait for the next request, while idle
    started: bool = False
    handled: int = 0
    current: Request | None = None  # the newest request being served
    in_flight: int = 0
    mean_s: float = 0.0  # moving average of how long a request takes: BUSY says when to retry from it
    last_error: str | None = None
    # Why the actor is stopping (set by whoever stops it: eviction, diagd_stop_actor, shutdown, a crash on
    # another call): the requests it was serving are told.
    stop_reason: str | None = None
    expire_now: Callable[[], bool] = field(default=lambda: True)

    def set_idle_timeout(self, idle_timeout_s: float) -> None:
        """Apply a new idle timeout now: an idle actor's deadline moves to idle_since + the new timeout."""
        self.idle_timeout_s = idle_timeout_s
        if self.idle_scope is not None and not self.in_flight:
            self.idle_deadline = self.idle_since + idle_timeout_s
            self.idle_scope.deadline = self.idle_deadline


class ActorGone(DiagdError):
    """Asked an actor that has stopped (idle expiry, diagd_stop_actor, failure): nothing was sent."""

    def __init__(self, actor_id: str, reason: str | None) -> None:
        super().__init__(ErrorCode.ACTOR_FAILED, f"actor {actor_id} has stopped: {reason or 'stopped'}",
                         actor_id=actor_id)


class ActorCrashed(Exception):
    """The actor's back end failed (`BackendFault`, or one of the actor's own tasks raised): restart it."""


class BackendFault(Exception):
    """Raised by a handler when the back end's process (or device) is broken beyond the request it
    serves (the child died, its pipe closed under it): the request fails with ACTOR_FAILED and the
    supervisor restarts the actor by its policy. Not for anything a caller's input can cause."""


# An INTERNAL_ERROR names the exception in one line: at most this many characters of its text.
BUG_TEXT_CHARS = 300


async def run_actor(
    actor: Actor,
    inbox: trio.MemoryReceiveChannel[Request],
    runtime: ActorRuntime,
    idle_timeout_s: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Start `actor`, then serve its inbox until it idles out or is cancelled.

    Returns normally on idle expiry; raises ActorCrashed when a handler finds the back end broken
    (`BackendFault`: the request that found it gets ACTOR_FAILED; queued ones stay in the inbox for
    the restarted actor), and what the actor's own tasks raise. A handler's bug fails only its
    request (INTERNAL_ERROR). `runtime.expire_now()` is asked before expiring, synchronously, so the
    supervisor can deregister the actor with no checkpoint in between (no request is lost to
    the race between expiry and a new call).
    """
    try:
        async with trio.open_nursery() as nursery:
            await actor.start(nursery)
            runtime.state = ActorState.IDLE
            runtime.started = True
            task_status.started()
            runtime.idle_timeout_s = idle_timeout_s
            await _serve_inbox(actor, inbox, runtime)
            nursery.cancel_scope.cancel(reason="actor finished")
    except BaseExceptionGroup as group:
        # The actor's own nursery wraps everything; callers want the one real error.
        raise sole_exception(group) from None
    finally:
        if runtime.state != ActorState.EXPIRED:
            runtime.state = ActorState.STOPPING
        with trio.CancelScope(shield=True), trio.move_on_after(actor.policy.stop_grace_s):
            await actor.stop()


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _serve_inbox(
    actor: Actor, inbox: trio.MemoryReceiveChannel[Request], runtime: ActorRuntime
) -> None:
    slots = trio.Semaphore(actor.concurrency)
    async with trio.open_nursery() as serving:
        while True:
            # runtime.idle_timeout_s is read each time: a config reload may change it (set_idle_timeout).
            # The idle clock runs only while no request is in flight; the last one to end restarts it.
            runtime.idle_since = trio.current_time()
            runtime.idle_deadline = runtime.idle_since + runtime.idle_timeout_s if not runtime.in_flight else math.inf
            request: Request | None = None
            with trio.move_on_at(runtime.idle_deadline) as runtime.idle_scope:
                request = await inbox.receive()
            runtime.idle_scope = None
            if request is None:
                if runtime.in_flight or actor.working():
                    continue
                if runtime.expire_now():
                    runtime.state = ActorState.EXPIRED
                    return
                continue
            if request.resolved:  # abandoned while queued
                continue
            runtime.state = ActorState.BUSY
            runtime.idle_deadline = math.inf
            runtime.in_flight += 1
            if actor.concurrency == 1:
                await _serve(actor, request, runtime)
            else:
                await slots.acquire()  # a slot first: beyond it requests wait in the inbox, which says BUSY when full
                serving.start_soon(_serve_released, actor, request, runtime, slots)


async def _serve_released(actor: Actor, request: Request, runtime: ActorRuntime, slots: trio.Semaphore) -> None:
    try:
        await _serve(actor, request, runtime)
    finally:
        slots.release()


def _crashed(actor: Actor, request: Request, runtime: ActorRuntime, exc: Exception) -> NoReturn:
    """A handler found the back end broken (BackendFault): its caller gets ACTOR_FAILED (naming the
    fault, not the group a nursery wrapped it in) and the actor restarts."""
    fault = sole_exception(exc) if isinstance(exc, BaseExceptionGroup) else exc
    runtime.last_error = _one_line(fault)
    runtime.stop_reason = f"its back end failed under another call ({runtime.last_error}); it restarts"
    request.fail(DiagdError(ErrorCode.ACTOR_FAILED, f"{actor.kind} actor failed: {runtime.last_error}"))
    raise ActorCrashed(runtime.last_error) from exc


def _internal_error(actor: Actor, request: Request, runtime: ActorRuntime, exc: Exception) -> None:
    """A handler hit a bug (not a fault of the back end): that request gets INTERNAL_ERROR in one line,
    the traceback goes to the log, and the actor stays up for its other requests."""
    bug = sole_exception(exc) if isinstance(exc, BaseExceptionGroup) else exc
    runtime.last_error = _one_line(bug)
    log.error("actor request failed", actor=actor.kind, resource=actor.resource, request=request.label,
              error=runtime.last_error, exc_info=exc)
    coded = as_error(bug, f"the {actor.kind} actor's {request.label}")
    request.fail(DiagdError(ErrorCode.INTERNAL_ERROR, _cut(coded.message), request=request.label))


def _one_line(exc: BaseException) -> str:
    return _cut(f"{type(exc).__name__}: {exc}")


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= BUG_TEXT_CHARS else text[:BUG_TEXT_CHARS - 3] + "..."


async def _serve(actor: Actor, request: Request, runtime: ActorRuntime) -> None:
    runtime.current = request
    request.started_at = started = trio.current_time()
    try:
        with request.scope:
            request.resolve(await actor.handle(request))
    except DiagdError as exc:
        request.fail(exc)
    except BackendFault as exc:
        _crashed(actor, request, runtime, exc)
    except ExceptionGroup as group:
        coded = sole_exception(group)
        if isinstance(coded, DiagdError):
            request.fail(coded)  # one coded error a nursery wrapped: the caller's, not a crash
        elif group.subgroup(BackendFault) is not None:
            _crashed(actor, request, runtime, group)
        else:
            _internal_error(actor, request, runtime, group)
    except Exception as exc:
        _internal_error(actor, request, runtime, exc)
    finally:
        if runtime.current is request:
            runtime.current = None
        runtime.handled += 1
        runtime.in_flight -= 1
        runtime.mean_s += 0.2 * ((trio.current_time() - started) - runtime.mean_s)
        # Cancelled mid-request (actor stopped): the caller still gets an answer, saying why.
        why = runtime.stop_reason or "stopped"
        request.fail(DiagdError(ErrorCode.CANCELLED, f"{actor.kind} actor stopped during the call: {why}",
                                reason=why))
        if runtime.in_flight == 0:
            runtime.state = ActorState.IDLE
            runtime.idle_since = trio.current_time()
            if runtime.idle_scope is not None:  # the loop waits for the next request: start its idle clock
                runtime.idle_deadline = runtime.idle_since + runtime.idle_timeout_s
                runtime.idle_scope.deadline = runtime.idle_deadline
