"""Supervisor and actor run loop on the virtual clock: idle expiry, restarts, stop, queueing."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors.base import Actor, ActorState, Request, RestartKind, SupervisionPolicy
from diagd.daemon.supervisor import Supervisor
from diagd.protocol.errors import DiagdError, ErrorCode


class Scripted(Actor):
    """Sleeps `delay` per request; crashes on op 'crash'; counts starts and stops."""

    kind = "scripted"
    policy = SupervisionPolicy(max_restarts=2, window_s=10, backoff_s=1, backoff_max_s=4)
    starts = 0
    stops = 0

    async def start(self, nursery: trio.Nursery) -> None:
        type(self).starts += 1
        if self.resource == "broken":
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "no such device")

    async def handle(self, request: Request) -> dict[str, Any]:
        if request.op == "crash":
            raise RuntimeError("boom")
        await trio.sleep(request.args.get("delay", 0))
        return {"op": request.op, "at": trio.current_time()}

    async def stop(self) -> None:
        type(self).stops += 1


@pytest.fixture(autouse=True)
def reset_counts() -> None:
    Scripted.starts = Scripted.stops = 0


def factory(resource: str) -> Any:
    return lambda: Scripted(resource)


async def test_idle_actor_expires_exactly_after_idle_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        await sup.ask("scripted", "a", factory("a"), "ping", {})
        assert sup.find("scripted", "a") is not None
        await trio.sleep(29.999)
        assert sup.find("scripted", "a") is not None
        await trio.sleep(0.002)
        assert sup.find("scripted", "a") is None
        await trio.testing.wait_all_tasks_blocked()
        assert Scripted.stops == 1


async def test_each_call_moves_the_idle_deadline(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        await sup.ask("scripted", "a", factory("a"), "ping", {})
        await trio.sleep(20)
        await sup.ask("scripted", "a", factory("a"), "ping", {})
        ref = sup.find("scripted", "a")
        assert ref is not None and ref.statistics()["idle_s_left"] == 30
        await trio.sleep(29)
        assert sup.find("scripted", "a") is ref
        nursery.cancel_scope.cancel()


async def test_calls_queue_in_the_inbox_and_report_their_wait(autojump_clock: trio.testing.MockClock) -> None:
    results: list[tuple[dict[str, Any], float]] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def call() -> None:
            results.append(await sup.ask("scripted", "a", factory("a"), "work", {"delay": 5}))

        for _ in range(3):
            nursery.start_soon(call)
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
                await sup.ask("scripted", "a", factory("a"), "crash", {})
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
            await sup.ask("scripted", "a", factory("a"), "crash", {})
        await trio.testing.wait_all_tasks_blocked()
        assert sup.find("scripted", "a") is None
        assert Scripted.starts == 3
        # A later call starts a fresh actor.
        result, _ = await sup.ask("scripted", "a", factory("a"), "ping", {})
        assert result["op"] == "ping"
        nursery.cancel_scope.cancel()


async def test_crashes_outside_the_window_do_not_accumulate(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=1000)
        for _ in range(5):
            with pytest.raises(DiagdError):
                await sup.ask("scripted", "a", factory("a"), "crash", {})
            await trio.sleep(11)  # beyond window_s=10
        ref = sup.find("scripted", "a")
        assert ref is not None and ref.restarts == 5
        nursery.cancel_scope.cancel()


async def test_queued_calls_survive_a_crash_and_are_served_by_the_restarted_actor(
        autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[str] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def call(op: str) -> None:
            try:
                result, _ = await sup.ask("scripted", "a", factory("a"), op, {})
                outcomes.append(result["op"])
            except DiagdError as exc:
                outcomes.append(str(exc.code))

        nursery.start_soon(call, "crash")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "after")
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert outcomes == ["ACTOR_FAILED", "after"]


async def test_setup_error_reaches_the_caller_and_leaves_no_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with pytest.raises(DiagdError) as info:
            await sup.ask("scripted", "broken", factory("broken"), "ping", {})
        assert info.value.code == ErrorCode.BACKEND_UNAVAILABLE
        assert sup.actors() == []


async def test_two_first_calls_start_one_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        async with trio.open_nursery() as calls:
            for _ in range(2):
                calls.start_soon(sup.ask, "scripted", "a", factory("a"), "ping", {})
        assert Scripted.starts == 1 and len(sup.actors()) == 1
        nursery.cancel_scope.cancel()


async def test_stopping_an_actor_fails_its_running_and_queued_calls(autojump_clock: trio.testing.MockClock) -> None:
    outcomes: list[str] = []
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)

        async def call() -> None:
            try:
                await sup.ask("scripted", "a", factory("a"), "work", {"delay": 50})
                outcomes.append("ok")
            except DiagdError as exc:
                outcomes.append(str(exc.code))

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        ref = sup.actors()[0]
        sup.stop(ref.id, reason="test")
        await trio.testing.wait_all_tasks_blocked()
    assert sorted(outcomes) == ["ACTOR_FAILED", "CANCELLED"]
    assert Scripted.stops == 1
    assert ref.runtime.state == ActorState.STOPPED


async def test_an_abandoned_call_is_cancelled_inside_the_actor(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=100)
        with trio.move_on_after(3):
            await sup.ask("scripted", "a", factory("a"), "work", {"delay": 50})
        await trio.testing.wait_all_tasks_blocked()
        ref = sup.actors()[0]
        assert ref.runtime.state == ActorState.IDLE  # not still sleeping out the 50 s
        result, queue_s = await sup.ask("scripted", "a", factory("a"), "ping", {})
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
            await sup.ask("scripted", "t", lambda: Permanent("t"), "crash", {})
        await trio.testing.wait_all_tasks_blocked()
        assert sup.actors() == []
