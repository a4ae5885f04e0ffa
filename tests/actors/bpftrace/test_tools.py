"""The bpftrace tools against a fake runtime (no daemon) and a scripted bpftrace process: schemas,
defaults from the schema and the config, and the messages the tools send the execution's actor."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.actors.bpftrace import register
from diagd.actors.bpftrace.actor import KIND
from diagd.actors.bpftrace.messages import Page
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.bpftrace_harness import ATTACH, FakeBpftrace, FakeSpawner
from tests.support.fake_runtime import fake_runtime

SETTINGS = {"stop_grace_s": 2.0, "linger_s": 5.0, "default_timeout_s": 7.0}


@dataclass(frozen=True)
class Unknown:
    """A message no bpftrace actor knows."""


TOOLS = ("list_probes", "list_helpers", "exec_program", "get_result", "stop_execution", "list_executions")


async def test_every_tool_is_registered_with_an_output_schema(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "bpftrace") as rt:
        register(rt)
        for name in TOOLS:
            spec = rt.registry.get(name)
            assert spec.output_schema is not None and spec.output_schema["type"] == "object"
            assert spec.input_schema["additionalProperties"] is False


async def test_a_run_takes_its_timeout_from_the_config_and_is_paged_through_its_actor(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0.1, ATTACH.format(n=1)), (1, "one"), (2, "two"), (3, None)])
    async with trio.open_nursery() as nursery:
        async with fake_runtime(tmp_path, "bpftrace", SETTINGS) as rt:
            backend = register(rt)
            backend.spawn = FakeSpawner(nursery, fake)
            started = await rt.call("exec_program", {"program": "interval:s:1 { }"})
            assert started["timeout_s"] == 7.0 and started["output_format"] == "text"
            assert started["status"] == "running" and started["attached_probes"] == 1
            first = await rt.call("get_result", {"execution_id": started["execution_id"], "wait_s": 10})
            assert first["output"] == ["one"] and first["status"] == "running"
            done = await rt.call("get_result", {"execution_id": started["execution_id"], "offset": 1,
                                                "wait_s": 10, "until": "done"})
            assert done["status"] == "completed" and done["output"] == ["two"] and done["lines_total"] == 2
            listed = await rt.call("list_executions")
            assert [row["execution_id"] for row in listed["executions"]] == [started["execution_id"]]
            assert listed["running"] == 0 and listed["max_concurrent"] == 5
        nursery.cancel_scope.cancel()


async def test_stop_execution_asks_the_actor_and_waits_for_the_end(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0.1, ATTACH.format(n=1)), (1, "tick")], on_sigint=["@c: 1"])
    async with trio.open_nursery() as nursery:
        async with fake_runtime(tmp_path, "bpftrace", SETTINGS) as rt:
            backend = register(rt)
            backend.spawn = FakeSpawner(nursery, fake)
            execution_id = (await rt.call("exec_program", {"program": "p", "timeout": 60}))["execution_id"]
            await trio.sleep(2)
            stopped = await rt.call("stop_execution", {"execution_id": execution_id})
            assert stopped["status"] == "stopped" and stopped["already_finished"] is False
            assert stopped["stop_reason"] == "stop_execution" and [s for _, s in fake.signals] == [signal.SIGINT]
            again = await rt.call("stop_execution", {"execution_id": execution_id})
            assert again["already_finished"] is True and again["lines_total"] == 2
        nursery.cancel_scope.cancel()


async def test_the_actor_answers_its_messages_and_refuses_an_unknown_one(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0.1, ATTACH.format(n=1)), (1, "tick")])
    async with trio.open_nursery() as nursery:
        async with fake_runtime(tmp_path, "bpftrace", SETTINGS) as rt:
            backend = register(rt)
            backend.spawn = FakeSpawner(nursery, fake)
            execution_id = (await rt.call("exec_program", {"program": "p"}))["execution_id"]
            ref = rt.find(KIND, execution_id)
            assert ref is not None
            page = await rt.ask(ref, Page(offset=0, limit=10))
            assert page["execution_id"] == execution_id and page["status"] == "running"
            with pytest.raises(DiagdError) as refused:
                await rt.ask(ref, Unknown())
            assert refused.value.code == ErrorCode.INVALID_ARGUMENT
        nursery.cancel_scope.cancel()


async def test_an_unknown_execution_is_not_found(tmp_path: Path) -> None:
    async with fake_runtime(tmp_path, "bpftrace") as rt:
        register(rt)
        for tool in ("get_result", "stop_execution"):
            with pytest.raises(DiagdError) as missing:
                await rt.call(tool, {"execution_id": "bt-0123abcd"})
            assert missing.value.code == ErrorCode.NOT_FOUND
