"""The smallest back end (tests/support/echo_actor.py) against a fake runtime: what a back end's unit
tests look like without a daemon, on the virtual clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support import echo_actor
from tests.support.fake_runtime import fake_runtime


async def test_schema_defaults_reach_the_handler_and_the_table_is_read_per_call(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with fake_runtime(tmp_path, "echo_actor", {"prefix": "> "}) as rt:
        echo_actor.register(rt)
        assert await rt.call("echo", {"message": "hi"}) == {"message": "> hi", "resource": "default"}
        rt.set_table({})
        assert (await rt.call("echo", {"message": "hi", "resource": "r"}))["message"] == "hi"
        assert sorted(ref.resource for ref in rt.actors("echo")) == ["default", "r"]
        rt.set_table({"prefx": "x"})  # echo has no reload hook to refuse it: its next call does
        with pytest.raises(DiagdError) as info:
            await rt.call("echo", {"message": "hi"})
        assert info.value.details["setting"] == "[echo_actor] prefx"


async def test_a_crash_message_restarts_the_actor_by_its_policy_and_progress_is_reported(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    seen: list[float] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(done)

    async with fake_runtime(tmp_path, "echo_actor") as rt:
        echo_actor.register(rt)
        with pytest.raises(DiagdError) as info:
            await rt.call("echo", {"message": "x", "resource": "k", "crash": True})
        assert info.value.code == ErrorCode.ACTOR_FAILED
        await trio.sleep(1)  # its backoff
        [ref] = rt.actors("echo")
        assert ref.statistics()["restarts"] == 1
        started = trio.current_time()
        await rt.call("echo", {"message": "p", "resource": "k", "progress_steps": 4, "delay_s": 2}, progress=progress)
        assert seen == [1, 2, 3, 4] and trio.current_time() - started == 2
