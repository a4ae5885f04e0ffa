"""Readings (actors/pcap/index/readings.py) on the Trio clock: concurrent calls share one reading, a call
that gives up leaves it going for the next, a failure is said at once until it is due to be tried again
(never, when the capture cannot give the value), and only a few values are kept."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from diagd.actors.pcap.index.cut_columns import Lasting
from diagd.actors.pcap.index.readings import RETRY_AFTER_S, Readings
from diagd.protocol.errors import DiagdError, ErrorCode


class Permanent(Exception):
    pass


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def reader(log: list[str], outcome: str | Exception = "value", took_s: float = 10.0
           ) -> Callable[[], Awaitable[str]]:
    async def read() -> str:
        log.append("read")
        await trio.sleep(took_s)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome
    return read


async def test_concurrent_calls_share_one_reading_and_a_call_giving_up_leaves_it_going(
        clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    got: list[str] = []
    async with trio.open_nursery() as actor:
        readings: Readings[str, str] = Readings("the thing", 2)
        readings.start(actor)
        with trio.move_on_after(1):  # gives up long before the reading ends
            await readings.get("k", reader(log))
        assert readings.busy
        async with trio.open_nursery() as calls:
            for _ in range(3):
                calls.start_soon(_append, got, readings, reader(log))
        assert got == ["value"] * 3 and log == ["read"] and not readings.busy
        assert await readings.get("k", reader(log)) == "value" and log == ["read"]  # kept


async def _append(into: list[str], readings: Readings[str, str], read: Callable[[], Awaitable[str]]) -> None:
    into.append(await readings.get("k", read))


async def test_a_failure_is_said_at_once_until_it_is_due_then_read_again(clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    async with trio.open_nursery() as actor:
        readings: Readings[str, str] = Readings("the thing", 2)
        readings.start(actor)
        for _ in range(2):  # the second call is told at once, without reading
            with pytest.raises(DiagdError) as failed:
                await readings.get("k", reader(log, OSError(28, "No space left on device")))
            assert failed.value.code == ErrorCode.NOT_FOUND and failed.value.details["index_unanswered"]
            assert "the thing is not read from the index: OSError" in failed.value.message
        assert log == ["read"]
        refused = DiagdError(ErrorCode.OUTPUT_TOO_LARGE, "too many", limit=5)
        with pytest.raises(DiagdError) as too_big:  # a coded error is said as raised
            await readings.get("other", reader(log, refused))
        assert too_big.value.code == ErrorCode.OUTPUT_TOO_LARGE and too_big.value.details == {"limit": 5}
        clock.jump(RETRY_AFTER_S)
        assert await readings.get("k", reader(log)) == "value" and log == ["read", "read", "read"]


async def test_a_permanent_failure_is_never_read_again_and_few_values_are_kept(
        clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    async with trio.open_nursery() as actor:
        readings: Readings[str, str] = Readings("the thing", 2, permanent=(Permanent, Lasting))
        readings.start(actor)
        with pytest.raises(DiagdError, match="the thing is not read from the index: cut"):
            await readings.get("k", reader(log, Permanent("cut")))
        uncut = Lasting(ErrorCode.NOT_FOUND, "the index cannot pair: not cut", index_unanswered=True)
        with pytest.raises(DiagdError, match=r"^the index cannot pair: not cut$"):  # a coded one as raised
            await readings.get("u", reader(log, uncut))
        clock.jump(RETRY_AFTER_S * 100)
        assert readings.failure("k") is not None and readings.failure("u") is uncut
        for key in ("a", "b", "c"):
            await readings.get(key, reader(log, key))
        assert await readings.get("a", reader(log, "again")) == "again"  # the least recently used went
        assert await readings.get("c", reader(log, "not read")) == "c"


async def test_with_a_limiter_readings_of_different_keys_take_turns(clock: trio.testing.MockClock) -> None:
    """Each cut is read by a child bounded to 1.28 GB: two at once could pass the daemon's budget."""
    at_once, most = 0, 0

    async def read() -> str:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        await trio.sleep(10)
        at_once -= 1
        return "value"

    async with trio.open_nursery() as actor:
        readings: Readings[str, str] = Readings("the thing", 4, limiter=trio.CapacityLimiter(1))
        readings.start(actor)
        async with trio.open_nursery() as calls:
            for key in ("a", "b", "c"):
                calls.start_soon(readings.get, key, read)
        assert most == 1 and trio.current_time() == 30
