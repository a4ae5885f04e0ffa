"""The supervisor: one actor per resource, started explicitly, restarted by declared policy.

Registry keys are (kind, resource). `start()` starts the actor for one (or returns the running
one: two racing starts start it once; setup errors surface to the caller, per `nursery.start`)
and returns its entry, an `ActorEntry` to back ends. `ask()` queues one message for a started
actor and waits for the reply; it never starts one, and adds the inbox wait to the calling
tool call's `queue_s`.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, overload

import structlog
import trio

from diagd.actors.base import (
    Actor,
    ActorGone,
    ActorRuntime,
    ActorState,
    ProgressFn,
    Request,
    RestartKind,
    run_actor,
)
from diagd.actors.message import Message, ReplyT
from diagd.actors.runtime import ActorFactory, ActorRef, IdleTimeout
from diagd.actors.tooling import current_call
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.supervisor")

@dataclass
class ActorEntry:
    """One supervised actor: its inbox, scope and restart history (an `ActorEntry` to back ends)."""

    id: str
    kind: str
    resource: str
    factory: ActorFactory
    idle_timeout_s: float
    inbox_size: int
    idle_setting: IdleTimeout = None
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    runtime: ActorRuntime = field(default_factory=ActorRuntime)
    actor: Actor | None = None
    started_at: float = 0.0
    restarts: int = 0
    crash_times: deque[float] = field(default_factory=deque)
    accepting: bool = True
    stop_reason: str | None = None
    group: str = ""  # the tool group (back end) that started it: what a client must select to see or stop it

    def __post_init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[Request](self.inbox_size)

    def inbox_depth(self) -> int:
        return self.receive.statistics().current_buffer_used

    def expected_wait_s(self) -> float:
        """How long a new request would wait before it is served: the queue ahead of it times the
        actor's mean request time, shared by the requests it serves at once."""
        concurrency = self.actor.concurrency if self.actor is not None else 1
        ahead = self.inbox_depth() + max(0, self.runtime.in_flight - concurrency + 1)
        return ahead * self.runtime.mean_s / concurrency

    def statistics(self) -> dict[str, Any]:
        now = trio.current_time()
        deadline = self.runtime.idle_deadline
        return {
            "id": self.id,
            "kind": self.kind,
            "group": self.group,
            "resource": self.resource,
            "state": str(self.runtime.state),
            "inbox_depth": self.inbox_depth(),
            "idle_s_left": None if math.isinf(deadline) else round(max(0.0, deadline - now), 3),
            "uptime_s": round(now - self.started_at, 3),
            "restarts": self.restarts,
            "handled": self.runtime.handled,
            "current_op": self.runtime.current.label if self.runtime.current else None,
            "last_error": self.runtime.last_error,
            "details": self.actor.statistics() if self.actor else {},
        }

    def __repr__(self) -> str:
        return f"<ActorEntry {self.id} [{self.runtime.state}, inbox: {self.inbox_depth()}, restarts: {self.restarts}]>"


class Supervisor:
    def __init__(self, nursery: trio.Nursery, *, idle_timeout_s: float, inbox_size: int = 32) -> None:
        self._nursery = nursery
        self.idle_timeout_s = idle_timeout_s
        self.inbox_size = inbox_size
        self._actors: dict[tuple[str, str], ActorEntry] = {}
        self._starting: dict[tuple[str, str], trio.Lock] = {}
        self._ids = itertools.count(1)

    def actors(self) -> list[ActorEntry]:
        return list(self._actors.values())

    def find(self, kind: str, resource: str) -> ActorEntry | None:
        return self._actors.get((kind, resource))

    def by_id(self, actor_id: str) -> ActorEntry:
        for ref in self._actors.values():
            if ref.id == actor_id:
                return ref
        raise DiagdError(ErrorCode.NOT_FOUND, f"no actor with id {actor_id!r}",
                         known=[r.id for r in self._actors.values()])

    async def start(self, kind: str, resource: str, factory: ActorFactory, *,
                    idle_timeout_s: IdleTimeout = None, group: str = "") -> ActorEntry:
        """Start the actor for (kind, resource) and return it; the running one if it already runs."""
        key = (kind, resource)
        lock = self._starting.setdefault(key, trio.Lock())
        try:
            async with lock:  # two first calls for one resource must not start it twice
                return await self._start_locked(key, factory, idle_timeout_s, group)
        finally:
            # One lock per resource ever started (one per run or per file a back end starts) would grow for as
            # long as the daemon runs: it goes once the last start waiting on it is through.
            if not lock.locked() and not lock.statistics().tasks_waiting and self._starting.get(key) is lock:
                del self._starting[key]

    async def _start_locked(self, key: tuple[str, str], factory: ActorFactory, idle_timeout_s: IdleTimeout,
                            group: str) -> ActorEntry:
        ref = self._actors.get(key)
        if ref is not None and ref.accepting:
            return ref
        kind, resource = key
        ref = ActorEntry(
            id=f"{kind}-{next(self._ids)}", kind=kind, resource=resource, factory=factory,
            idle_timeout_s=self._idle_timeout(idle_timeout_s), inbox_size=self.inbox_size,
            idle_setting=idle_timeout_s, group=group,
        )
        self._actors[key] = ref
        try:
            await self._nursery.start(self._supervise, ref)
        except BaseException:
            self._forget(ref)
            raise
        return ref

    def starting_locks(self) -> int:
        """Start locks held now (one per resource being started; none left behind once started)."""
        return len(self._starting)

    @overload
    async def ask(self, ref: ActorRef, message: Message[ReplyT], *,  # type: ignore[overload-overlap]
                  progress: ProgressFn | None = None) -> ReplyT: ...

    @overload
    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]: ...

    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> Any:
        """Send `message` to the started actor `ref` and return its reply.

        Never starts an actor: one that has stopped raises `ActorGone`, a full inbox BUSY. The time
        the request waits in the inbox is added to the current tool call's `queue_s`. The reply is what
        the actor answered, as the inbox carries it: for a `Message[SomeReply]`, that model (`Message.reply`),
        which the overloads above give the caller.
        """
        if not isinstance(ref, ActorEntry):
            raise TypeError(f"{ref!r} is not an actor this supervisor started")
        if not ref.accepting:
            raise ActorGone(ref.id, ref.stop_reason)
        request = Request(message, progress)
        wait_s = ref.expected_wait_s()
        if wait_s > request.deadline - trio.current_time():
            # It would time out in the queue: say so now, and when a retry may be served.
            raise DiagdError(ErrorCode.BUSY, f"actor {ref.id} has {ref.inbox_depth()} queued calls, about "
                             f"{wait_s:.1f} s of work, more than this call's time; retry in {math.ceil(wait_s)} s",
                             actor_id=ref.id, retry_after_s=math.ceil(wait_s))
        try:
            ref.send.send_nowait(request)
        except trio.WouldBlock:
            retry = max(1, math.ceil(wait_s))
            raise DiagdError(ErrorCode.BUSY, f"actor {ref.id} has {ref.inbox_depth()} queued calls; retry in "
                             f"{retry} s", actor_id=ref.id, retry_after_s=retry) from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorGone(ref.id, ref.stop_reason) from None
        try:
            return await request.wait()
        finally:
            if (ctx := current_call.get()) is not None:
                ctx.queue_s += request.queue_s

    def set_idle_timeout(self, idle_timeout_s: float) -> list[str]:
        """A reload: the new default, and every running actor's idle timeout re-read and applied now.

        An idle actor's deadline moves to (idle since) + (new timeout), so one idle longer than a
        shortened timeout expires at once. Returns the ids of the actors whose timeout changed.
        """
        self.idle_timeout_s = idle_timeout_s
        changed = []
        for ref in self._actors.values():
            try:
                new = self._idle_timeout(ref.idle_setting)
            except DiagdError as exc:  # a back end's table is broken: keep its actors as they are
                log.warning("idle timeout not reloaded", actor=ref.id, error=exc.message)
                continue
            if new != ref.idle_timeout_s:
                ref.idle_timeout_s = new
                ref.runtime.set_idle_timeout(new)
                changed.append(ref.id)
        return changed

    def _idle_timeout(self, setting: IdleTimeout) -> float:
        if setting is None:
            return self.idle_timeout_s
        return setting() if callable(setting) else setting

    def stop(self, actor_id: str, reason: str = "stopped by request") -> ActorEntry:
        ref = self.by_id(actor_id)
        ref.stop_reason = ref.runtime.stop_reason = reason
        ref.accepting = False
        ref.scope.cancel()
        return ref

    def stop_all(self, reason: str) -> None:
        for ref in list(self._actors.values()):
            ref.stop_reason = ref.runtime.stop_reason = reason
            ref.accepting = False
            ref.scope.cancel()

    def _forget(self, ref: ActorEntry) -> None:
        ref.accepting = False
        if self._actors.get((ref.kind, ref.resource)) is ref:
            del self._actors[(ref.kind, ref.resource)]

    def _expire_now(self, ref: ActorEntry) -> bool:
        if ref.inbox_depth():
            return False  # a call arrived at the deadline: serve it instead
        ref.stop_reason = "idle timeout"
        self._forget(ref)
        return True

    async def _supervise(self, ref: ActorEntry, *, task_status: trio.TaskStatus[None]) -> None:
        first = True
        status: trio.TaskStatus[None] = task_status
        try:
            with ref.scope:
                while True:
                    actor = ref.factory()
                    policy = actor.policy
                    ref.actor = actor
                    ref.runtime = ActorRuntime(expire_now=lambda: self._expire_now(ref))
                    ref.started_at = trio.current_time()
                    try:
                        await run_actor(actor, ref.receive, ref.runtime, ref.idle_timeout_s, task_status=status)
                        if ref.runtime.state == ActorState.EXPIRED or policy.restart != RestartKind.PERMANENT:
                            return
                    except Exception as exc:  # ActorCrashed, or a resource error on (re)start
                        if first and not ref.runtime.started:
                            raise  # setup failed: nursery.start hands it to the caller
                        if not self._may_restart(ref, policy.restart, policy.max_restarts, policy.window_s):
                            ref.runtime.state = ActorState.FAILED
                            ref.stop_reason = f"crashed too often: {exc}"
                            log.warning("actor failed", actor=ref.id, error=str(exc))
                            return
                        ref.runtime.state = ActorState.RESTARTING
                        delay = min(policy.backoff_s * 2 ** (len(ref.crash_times) - 1), policy.backoff_max_s)
                        log.info("actor restarting", actor=ref.id, error=str(exc), delay_s=delay)
                        await trio.sleep(delay)
                    first = False
                    status = trio.TASK_STATUS_IGNORED
                    ref.restarts += 1
        finally:
            self._forget(ref)
            self._fail_queued(ref)
            if ref.runtime.state not in (ActorState.EXPIRED, ActorState.FAILED):
                ref.runtime.state = ActorState.STOPPED

    def _may_restart(self, ref: ActorEntry, kind: RestartKind, max_restarts: int, window_s: float) -> bool:
        if kind == RestartKind.TEMPORARY:
            return False
        now = trio.current_time()
        ref.crash_times.append(now)
        while ref.crash_times and ref.crash_times[0] < now - window_s:
            ref.crash_times.popleft()
        return len(ref.crash_times) <= max_restarts

    def _fail_queued(self, ref: ActorEntry) -> None:
        reason = ref.stop_reason or "actor stopped"
        while True:
            try:
                request = ref.receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            request.fail(DiagdError(ErrorCode.ACTOR_FAILED, f"actor {ref.id} stopped: {reason}"))
        ref.send.close()
