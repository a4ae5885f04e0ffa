"""Supervisor and actor run loop on the virtual clock: idle expiry, restarts, stop, queueing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors.base import (
    Actor,
    ActorGone,
    ActorState,
    BackendFault,
    Request,
    RestartKind,
    SupervisionPolicy,
)
from diagd.actors.tooling import CallContext, current_call
from diagd.daemon.server.supervisor import Supervisor
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Work:
    delay: float


@dataclass(frozen=True)
class Crash:
    """The actor's back end fails under the call (BackendFault): a restart by policy."""


@dataclass(frozen=True)
class Bug:
    """The handler meets a bug (any other exception): the call's INTERNAL_ERROR, the actor goes on."""


@dataclass(frozen=True)
class Fail:
    code: ErrorCode


@dataclass(frozen=True)
class InNursery:
    """Raise `error` from a task of a nursery inside the handler: trio wraps it in an ExceptionGroup."""

    error: Exception


class Scripted(Actor):
    """Sleeps on `Work`, its back end fails on `Crash`, a bug on `Bug`, answers `Ping`; counts starts and stops."""

    kind = "scripted"
    policy = SupervisionPolicy(max_restarts=2, window_s=10, backoff_s=1, backoff_max_s=4)
    starts = 0
    stops = 0

    async def start(self, nursery: trio.Nursery) -> None:
        type(self).starts += 1
        if self.resource == "broken":
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "no such device")

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Crash():
                raise BackendFault("boom")
            case Bug():
                raise ValueError("zip() argument 2 is longer than argument 1\n" + "x" * 1000)
            case InNursery(error=error):
                async def fail() -> None:
                    raise error

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fail)
            case Work(delay=delay):
                await trio.sleep(delay)
        return {"op": request.label, "at": trio.current_time()}

    async def stop(self) -> None:
        type(self).stops += 1


@pytest.fixture(autouse=True)
def reset_counts() -> None:
    Scripted.starts = Scripted.stops = 0


def factory(resource: str) -> Any:
    return lambda: Scripted(resource)


async def call(sup: Supervisor, resource: str, message: object, make: Any = None) -> dict[str, Any]:
    """Start the actor (or take the running one), then ask it: what a back end's tool does."""
    ref = await sup.start("scripted", resource, make or factory(resource))
    return await sup.ask(ref, message)


async def timed_call(sup: Supervisor, resource: str, message: object) -> tuple[dict[str, Any], float]:
    """`call` inside a tool call's context: (result, the inbox wait the supervisor recorded)."""
    ctx = CallContext(client="test")
    token = current_call.set(ctx)
    try:
        return await call(sup, resource, message), ctx.queue_s
    finally:
        current_call.reset(token)


async def test_idle_actor_expires_exactly_after_idle_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        await call(sup, "a", Ping())
        assert sup.find("scripted", "a") is not None
        await trio.sleep(29.999)
        assert sup.find("scripted", "a") is not None
        await trio.sleep(0.002)
        assert sup.find("scripted", "a") is None
        await trio.testing.wait_all_tasks_blocked()
        assert Scripted.stops == 1


class Building(Actor):
    """Works in the background (an index build) until `done`: `working()` says so."""

    kind = "scripted"

    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.done = trio.Event()

    async def handle(self, request: Request) -> dict[str, Any]:
        return {"pong": True}

    def working(self) -> bool:
        return not self.done.is_set()


async def test_an_actor_working_in_the_background_outlives_its_idle_timeout(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        actor = Building("a")
        await call(sup, "a", Ping(), make=lambda: actor)
        await trio.sleep(95)  # three idle timeouts while it works
        assert sup.find("scripted", "a") is not None
        actor.done.set()
        await trio.sleep(30.001)  # asked again one idle timeout later: done now, so it expires
        assert sup.find("scripted", "a") is None


async def test_each_call_moves_the_idle_deadline(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        await call(sup, "a", Ping())
        await trio.sleep(20)
        await call(sup, "a", Ping())
        ref = sup.find("scripted", "a")
        assert ref is not None and ref.statistics()["idle_s_left"] == 30
        await trio.sleep(29)
        assert sup.find("scripted", "a") is ref
        nursery.cancel_scope.cancel()


async def test_calls_queue_in_the_inbox_and_report_their_wait(autojump_clock: trio.testing.MockClock) -> None:
    results: list[tuple[dict[str, Any], float]] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def client() -> None:
            results.append(await timed_call(sup, "a", Work(5)))

        for _ in range(3):
            nursery.start_soon(client)
        await trio.sleep(16)
        nursery.cancel_scope.cancel()
    assert sorted(round(q, 6) for _, q in results) == [0, 5, 10]
    assert Scripted.starts == 1


async def test_crashing_actor_restarts_with_backoff_then_fails(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        t0 = trio.current_time()
        for expected_backoff in (1, 2):
            with pytest.raises(DiagdError) as info:
                await call(sup, "a", Crash())
            assert info.value.code == ErrorCode.ACTOR_FAILED
            await trio.testing.wait_all_tasks_blocked()
            ref = sup.find("scripted", "a")
            assert ref is not None and ref.runtime.state == ActorState.RESTARTING
            await trio.sleep(expected_backoff)
            await trio.testing.wait_all_tasks_blocked()
            assert ref.restarts == expected_backoff  # 1 then 2
        assert trio.current_time() - t0 == 3
        # Third crash within the 10 s window exceeds max_restarts=2: the actor is failed and gone.
        with pytest.raises(DiagdError):
            await call(sup, "a", Crash())
        await trio.testing.wait_all_tasks_blocked()
        assert sup.find("scripted", "a") is None
        assert Scripted.starts == 3
        # A later call starts a fresh actor.
        result = await call(sup, "a", Ping())
        assert result["op"] == "Ping"
        nursery.cancel_scope.cancel()


async def test_a_coded_error_a_nursery_wrapped_is_the_callers_error_not_a_crash(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        refused = DiagdError(ErrorCode.INVALID_FILTER, "invalid display filter: x", display_filter="x")
        with pytest.raises(DiagdError) as info:
            await call(sup, "a", InNursery(refused))
        assert info.value.code == ErrorCode.INVALID_FILTER and info.value.details == {"display_filter": "x"}
        ref = sup.find("scripted", "a")
        assert ref is not None and ref.restarts == 0 and ref.runtime.last_error is None
        assert (await call(sup, "a", Ping()))["op"] == "Ping" and Scripted.starts == 1
        # A bug inside the nursery is the call's INTERNAL_ERROR: the actor goes on.
        with pytest.raises(DiagdError) as info:
            await call(sup, "a", InNursery(RuntimeError("boom")))
        assert info.value.code == ErrorCode.INTERNAL_ERROR and "RuntimeError: boom" in info.value.message
        await trio.testing.wait_all_tasks_blocked()
        assert ref.runtime.state == ActorState.IDLE and ref.restarts == 0
        # The back end failing inside the nursery is still a crash: ACTOR_FAILED and a restart.
        with pytest.raises(DiagdError) as info:
            await call(sup, "a", InNursery(BackendFault("boom")))
        assert info.value.code == ErrorCode.ACTOR_FAILED and "boom" in info.value.message
        await trio.testing.wait_all_tasks_blocked()
        assert ref.runtime.state == ActorState.RESTARTING
        nursery.cancel_scope.cancel()


async def test_a_handlers_bug_is_its_callers_internal_error_and_the_actor_serves_on(
        autojump_clock: trio.testing.MockClock) -> None:
    outcomes: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=1000)

        async def slow() -> None:
            outcomes["slow"] = await call(sup, "a", Work(5), make=lambda: Shared("a"))

        nursery.start_soon(slow)  # in flight on the same actor (Shared: three at once) while the bugs happen
        await trio.testing.wait_all_tasks_blocked()
        ref = sup.find("scripted", "a")
        assert ref is not None
        actor = ref.actor
        # More bugs in a row than max_restarts (2) allows crashes: each is one call's coded error.
        for _ in range(5):
            with pytest.raises(DiagdError) as info:
                await call(sup, "a", Bug(), make=lambda: Shared("a"))
            error = info.value
            assert error.code == ErrorCode.INTERNAL_ERROR and error.details == {"request": "Bug"}
            assert error.message.startswith("the scripted actor's Bug failed: ValueError: zip() argument 2")
            assert "\n" not in error.message and "Traceback" not in error.message and len(error.message) <= 300
        assert sup.find("scripted", "a") is ref and ref.accepting and ref.restarts == 0 and ref.actor is actor
        assert ref.runtime.last_error is not None and ref.runtime.last_error.startswith("ValueError: zip()")
        assert (await call(sup, "a", Ping()))["op"] == "Ping"  # the next call works
        await trio.sleep(5)
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes["slow"]["op"] == "Work"  # the call beside the bugs was not cancelled
        assert ref.runtime.state == ActorState.IDLE and ref.actor is actor
        nursery.cancel_scope.cancel()


async def test_crashes_outside_the_window_do_not_accumulate(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=1000)
        for _ in range(5):
            with pytest.raises(DiagdError):
                await call(sup, "a", Crash())
            await trio.sleep(11)  # beyond window_s=10
        ref = sup.find("scripted", "a")
        assert ref is not None and ref.restarts == 5
        nursery.cancel_scope.cancel()


async def test_queued_calls_survive_a_crash_and_are_served_by_the_restarted_actor(
        autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[str] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def client(message: object) -> None:
            try:
                result = await call(sup, "a", message)
                outcomes.append(result["op"])
            except DiagdError as exc:
                outcomes.append(str(exc.code))

        nursery.start_soon(client, Crash())
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client, Ping())
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert outcomes == ["ACTOR_FAILED", "Ping"]


async def test_setup_error_reaches_the_caller_and_leaves_no_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with pytest.raises(DiagdError) as info:
            await call(sup, "broken", Ping())
        assert info.value.code == ErrorCode.BACKEND_UNAVAILABLE
        assert sup.actors() == []


async def test_two_first_calls_start_one_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        async with trio.open_nursery() as calls:
            for _ in range(2):
                calls.start_soon(call, sup, "a", Ping())
        assert Scripted.starts == 1 and len(sup.actors()) == 1
        nursery.cancel_scope.cancel()


async def test_stopping_an_actor_fails_its_running_and_queued_calls(autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[str] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def client() -> None:
            try:
                await call(sup, "a", Work(50))
                outcomes.append("ok")
            except DiagdError as exc:
                outcomes.append(str(exc.code))
                messages.append(exc.message)

        messages: list[str] = []
        nursery.start_soon(client)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(client)
        await trio.testing.wait_all_tasks_blocked()
        ref = sup.actors()[0]
        sup.stop(ref.id, reason="evicted (for the test)")
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(outcomes) == ["ACTOR_FAILED", "CANCELLED"]
    # Both say why: the running call too, not only the queued one (issue 28).
    assert all("evicted (for the test)" in m for m in messages), messages
    assert Scripted.stops == 1
    assert ref.runtime.state == ActorState.STOPPED


async def test_an_abandoned_call_is_cancelled_inside_the_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with trio.move_on_after(3):
            await call(sup, "a", Work(50))
        await trio.testing.wait_all_tasks_blocked()
        ref = sup.actors()[0]
        assert ref.runtime.state == ActorState.IDLE  # not still sleeping out the 50 s
        result, queue_s = await timed_call(sup, "a", Ping())
        assert queue_s == 0 and result["at"] == 3
        nursery.cancel_scope.cancel()


async def test_unknown_actor_id_is_not_found(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with pytest.raises(DiagdError) as info:
            sup.stop("nope-1")
        assert info.value.code == ErrorCode.NOT_FOUND


class Permanent(Scripted):
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY)


async def test_temporary_actor_is_not_restarted(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with pytest.raises(DiagdError):
            await call(sup, "t", Crash(), make=lambda: Permanent("t"))
        await trio.testing.wait_all_tasks_blocked()
        assert sup.actors() == []


class Typed(Actor):
    """An actor of the new kind: per-kind message dataclasses, dispatched with `match`."""

    kind = "typed"

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Work(delay=delay):
                await trio.sleep(delay)
                return {"worked": delay, "at": trio.current_time()}
            case Fail(code=code):
                raise DiagdError(code, "asked to fail")
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"typed actor cannot handle {request.label}")


async def test_ask_never_starts_an_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        ref = await sup.start("typed", "a", lambda: Typed("a"))
        assert await sup.start("typed", "a", lambda: Typed("other")) is ref  # the running one
        assert (await sup.ask(ref, Work(1)))["worked"] == 1
        await trio.sleep(31)  # expired
        assert sup.find("typed", "a") is None and not ref.accepting
        with pytest.raises(ActorGone) as info:
            await sup.ask(ref, Work(1))
        assert info.value.code == ErrorCode.ACTOR_FAILED and "idle timeout" in info.value.message
        assert sup.actors() == []  # asking a stopped reference started nothing
        fresh = await sup.start("typed", "a", lambda: Typed("a"))
        assert fresh is not ref and fresh.id != ref.id
        nursery.cancel_scope.cancel()


async def test_ask_records_the_inbox_wait_in_the_call_even_when_the_reply_is_an_error(
        autojump_clock: trio.testing.MockClock) -> None:
    waits: dict[str, float] = {}
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        ref = await sup.start("typed", "a", lambda: Typed("a"))

        async def tool_call(name: str, message: object) -> None:
            ctx = CallContext(client=name)
            current_call.set(ctx)  # this task's context, as the registry sets it around a handler
            try:
                await sup.ask(ref, message)
            except DiagdError:
                pass
            waits[name] = ctx.queue_s

        nursery.start_soon(tool_call, "first", Work(4))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(tool_call, "second", Fail(ErrorCode.NOT_FOUND))
        await trio.sleep(5)
        with pytest.raises(DiagdError) as info:  # outside any call: nothing to record into
            await sup.ask(ref, "not a message")
        assert "cannot handle str" in info.value.message
        nursery.cancel_scope.cancel()
    assert waits == {"first": 0, "second": 4}


async def test_status_names_what_a_running_request_asks(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        typed = await sup.start("typed", "a", lambda: Typed("a"))
        scripted = await sup.start("scripted", "b", factory("b"))
        nursery.start_soon(sup.ask, typed, Work(10))
        nursery.start_soon(sup.ask, scripted, Work(10))
        await trio.testing.wait_all_tasks_blocked()
        assert [r.statistics()["current_op"] for r in sup.actors()] == ["Work", "Work"]
        nursery.cancel_scope.cancel()


class Shared(Scripted):
    """Serves three requests at once (as the pcap actor shares its workers)."""

    concurrency = 3


async def test_a_concurrent_actor_serves_requests_together_and_expires_after_the_last(
        autojump_clock: trio.testing.MockClock) -> None:
    results: list[tuple[dict[str, Any], float]] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        ref = await sup.start("scripted", "s", lambda: Shared("s"))

        async def client(delay: float) -> None:
            results.append((await sup.ask(ref, Work(delay)), trio.current_time()))

        began = trio.current_time()
        for delay in (5, 5, 5, 5):
            nursery.start_soon(client, delay)
        await trio.sleep(6)
        assert sorted(round(at - began, 6) for _, at in results) == [5, 5, 5]  # three at once, the fourth queued
        assert ref.statistics()["state"] == "busy"
        await trio.sleep(4.5)
        assert len(results) == 4 and ref.statistics()["state"] == "idle"
        # The idle clock starts when the last request ends (at 10 s), not when the loop last received.
        await trio.sleep(29.3)
        assert sup.find("scripted", "s") is ref
        await trio.sleep(0.4)
        assert sup.find("scripted", "s") is None


async def test_busy_says_when_to_retry_instead_of_timing_out_in_the_queue(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        ref = await sup.start("scripted", "a", factory("a"))
        for _ in range(3):
            await sup.ask(ref, Work(4))  # the actor learns that a request takes about 4 s
        for _ in range(3):
            nursery.start_soon(sup.ask, ref, Work(4))
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(5):  # a call with 5 s left: about 12 s of work is ahead of it
            with pytest.raises(DiagdError) as refused:
                await sup.ask(ref, Ping())
        assert refused.value.code is ErrorCode.BUSY
        assert 5 <= refused.value.details["retry_after_s"] <= 13
        assert "retry in" in refused.value.message
        assert (await sup.ask(ref, Ping()))["op"] == "Ping"  # without a deadline it waits its turn
        nursery.cancel_scope.cancel()


async def test_no_start_lock_is_left_per_resource_ever_started(autojump_clock: trio.testing.MockClock) -> None:
    # One lock per (kind, resource) kept forever grew by one per bpftrace execution (issue 28).
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=1)
        for i in range(50):
            async with trio.open_nursery() as calls:
                for _ in range(3):  # concurrent first calls: one waits on the lock, then it goes
                    calls.start_soon(call, sup, f"r{i}", Ping())
            assert sup.starting_locks() == 0
        assert Scripted.starts == 50
        nursery.cancel_scope.cancel()
