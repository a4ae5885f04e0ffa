"""A reloaded idle timeout applies to actors already running, on the virtual clock to the tick."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from diagd.actors.base import Actor, ActorState, Request
from diagd.daemon.server.supervisor import Supervisor


@dataclass(frozen=True)
class Nap:
    delay: float = 0


class Sleeper(Actor):
    kind = "sleeper"

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Nap(delay=delay):
                await trio.sleep(delay)
        return {"at": trio.current_time()}


def sleeper(resource: str = "a") -> Any:
    return lambda: Sleeper(resource)


async def call(sup: Supervisor, message: Nap) -> dict[str, Any]:
    ref = await sup.start("sleeper", "a", sleeper())
    return await sup.ask(ref, message)


async def alive_at(sup: Supervisor, when: float, kind: str = "sleeper", resource: str = "a") -> bool:
    await trio.sleep_until(when)
    return sup.find(kind, resource) is not None


async def test_a_shorter_timeout_moves_an_idle_actors_deadline(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=600)
        await call(sup, Nap())  # idle from t=0
        await trio.sleep(100)
        ref = sup.find("sleeper", "a")
        assert ref is not None and ref.statistics()["idle_s_left"] == 500
        assert sup.set_idle_timeout(200) == [ref.id]
        assert ref.statistics()["idle_s_left"] == 100
        assert await alive_at(sup, 199.999)
        assert not await alive_at(sup, 200.001)
        assert ref.runtime.state == ActorState.EXPIRED


async def test_a_timeout_shorter_than_the_idle_time_so_far_expires_the_actor_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=600)
        await call(sup, Nap())
        await trio.sleep(100)
        sup.set_idle_timeout(50)
        await trio.testing.wait_all_tasks_blocked()
        assert sup.find("sleeper", "a") is None
        assert trio.current_time() == 100


async def test_a_longer_timeout_keeps_an_idle_actor_alive(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=30)
        await call(sup, Nap())
        await trio.sleep(20)
        sup.set_idle_timeout(100)
        assert await alive_at(sup, 99.999)
        assert not await alive_at(sup, 100.001)


async def test_a_busy_actor_idles_out_by_the_new_timeout_after_its_call(
        autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=600)
        nursery.start_soon(call, sup, Nap(50))
        await trio.sleep(10)
        sup.set_idle_timeout(30)  # mid-call: the call finishes at t=50, idle from then
        assert await alive_at(sup, 79.999)
        assert not await alive_at(sup, 80.001)


async def test_back_end_settings_follow_a_reload_and_fixed_timeouts_do_not(
        autojump_clock: trio.testing.MockClock) -> None:
    setting = {"idle_s": 600.0}
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, idle_timeout_s=600)
        followed = await sup.start("sleeper", "followed", sleeper("followed"),
                                          idle_timeout_s=lambda: setting["idle_s"])
        fixed = await sup.start("sleeper", "fixed", sleeper("fixed"), idle_timeout_s=600)
        await trio.sleep(10)
        setting["idle_s"] = 40
        assert sup.set_idle_timeout(900) == [followed.id]
        assert followed.idle_timeout_s == 40 and fixed.idle_timeout_s == 600
        assert not await alive_at(sup, 40.001, resource="followed")
        assert await alive_at(sup, 599.999, resource="fixed")
        nursery.cancel_scope.cancel()
