"""End to end over the real path: MCP SDK client -> `diagd mcp` shim -> Unix socket -> `diagd serve`."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.conftest import DIAGD, DaemonProcess, Env
from tests.support.progress import delivered
from tests.support.raw import RawMCP

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def mcp_client(env: Env, *args: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", *args], env=env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


async def call(client: Client, name: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    with trio.fail_after(20):
        return await client.call_tool(name, args or {}, **kw)


def payload(result: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.content[0].text)
    return data


async def wait_for_busy_actor(client: Client, resource: str) -> None:
    with trio.fail_after(10):
        while True:
            status = payload(await call(client, "diagd_status"))
            if any(a["resource"] == resource and a["state"] == "busy" for a in status["actors"]):
                return
            await trio.sleep(0.02)


async def test_initialize_gives_instructions_and_tools_with_schemas_and_annotations(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        assert client.instructions is not None
        for workflow in ("pcap", "serial", "bpftrace", "vmcore", "diagd_status"):
            assert workflow in client.instructions
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"diagd_status", "diagd_calls", "diagd_stop_actor", "diagd_reload", "echo"} <= set(tools)
        named = set(re.findall(r"\b([a-z]+(?:_[a-z0-9]+)+)\b", client.instructions))
        named -= {"null_decipher", "decode_as", "wait_policy", "stop_pattern", "wait_s", "output_format",
                  "execution_id", "action", "capture_id", "current_file", "pcap_path", "allowed_interfaces"}
        assert named <= set(tools), f"instructions name unknown tools: {sorted(named - set(tools))}"
        status_tool = tools["diagd_status"]
        assert status_tool.input_schema["type"] == "object"
        assert status_tool.output_schema is not None
        assert status_tool.annotations is not None and status_tool.annotations.read_only_hint is True
        stop = tools["diagd_stop_actor"].annotations
        assert stop is not None and stop.destructive_hint is True and stop.read_only_hint is False


async def test_status_call_returns_compact_json_with_meta_envelope(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        result = await call(client, "diagd_status")
        assert not result.is_error
        text = result.content[0].text
        assert "\n" not in text and ": " not in text  # compact, not pretty-printed
        assert json.loads(text) == result.structured_content
        assert set(result.meta) >= {"duration_ms", "queue_ms", "bytes", "truncated"}
        assert result.meta["bytes"] == len(text.encode())
        assert result.structured_content["daemon"]["pid"] == daemon.proc.pid
        assert any(c["kind"] == "mcp" for c in result.structured_content["daemon"]["clients"])


async def test_bad_arguments_are_coded_errors_and_unknown_tools_protocol_errors(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        missing = await call(client, "echo", {})
        assert missing.is_error
        err = payload(missing)
        assert err["code"] == "INVALID_ARGUMENT" and err["details"]["path"] == "$"
        assert "message" in err["message"]
        wrong_type = payload(await call(client, "echo", {"message": "x", "delay_s": "soon"}))
        assert wrong_type["code"] == "INVALID_ARGUMENT" and wrong_type["details"]["path"] == "$.delay_s"
        as_string = await call(client, "echo", {"message": "x", "delay_s": "0.01"})
        assert not as_string.is_error
        with pytest.raises(MCPError) as unknown:  # 2025-11-25: an unknown tool is -32602, not a tool result
            await call(client, "ecoh", {})
        assert unknown.value.code == -32602 and "echo" in unknown.value.error.data["did_you_mean"]
        assert unknown.value.error.data["code"] == "INVALID_ARGUMENT"


@pytest.mark.filterwarnings("ignore:ping is removed")  # desktop clients still ping (legacy era)
async def test_a_slow_call_blocks_neither_other_clients_nor_its_own_session(daemon: DaemonProcess) -> None:
    events: list[str] = []
    async with mcp_client(daemon.env) as a, mcp_client(daemon.env) as b, trio.open_nursery() as nursery:

        async def slow() -> None:
            await call(a, "echo", {"message": "slow", "resource": "r1", "delay_s": 8})
            events.append("slow done")

        nursery.start_soon(slow)
        await wait_for_busy_actor(b, "r1")
        fast = await call(b, "echo", {"message": "fast", "resource": "r2"})
        assert payload(fast)["message"] == "fast"
        events.append("other resource answered")
        await call(a, "diagd_status")  # same connection as the slow call
        events.append("same session answered")
        with trio.fail_after(5):
            await a.send_ping()
        events.append("ping answered")
        nursery.cancel_scope.cancel()
    assert events == ["other resource answered", "same session answered", "ping answered"]


async def test_progress_notifications_reach_a_client_that_asked(daemon: DaemonProcess) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mcp_client(daemon.env) as client:
        result = await call(client, "echo", {"message": "p", "progress_steps": 3, "delay_s": 0.03},
                            progress_callback=on_progress)
        await delivered()
        assert not result.is_error
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_a_client_cancel_cancels_the_call_inside_the_actor(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, client, "echo", {"message": "x", "resource": "c1", "delay_s": 30})
            await wait_for_busy_actor(client, "c1")
            nursery.cancel_scope.cancel()
        await assert_call_recorded_as_cancelled_and_actor_idle(client, "c1")


async def test_a_disconnect_mid_call_cancels_the_call(daemon: DaemonProcess) -> None:
    raw = RawMCP(daemon.mcp_socket)
    raw.initialize()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "echo", "arguments": {"message": "x", "resource": "d1", "delay_s": 30}}})
    async with mcp_client(daemon.env) as client:
        await wait_for_busy_actor(client, "d1")
        raw.close()
        await assert_call_recorded_as_cancelled_and_actor_idle(client, "d1")


async def assert_call_recorded_as_cancelled_and_actor_idle(client: Client, resource: str) -> None:
    with trio.fail_after(10):
        while True:
            calls = payload(await call(client, "diagd_calls", {"tool": "echo"}))["calls"]
            status = payload(await call(client, "diagd_status"))
            actor = next(a for a in status["actors"] if a["resource"] == resource)
            if calls and calls[0]["outcome"] == "cancelled" and actor["state"] == "idle":
                return
            await trio.sleep(0.05)


async def test_actor_crash_is_a_coded_error_and_the_actor_restarts(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        crashed = payload(await call(client, "echo", {"message": "x", "resource": "k", "crash": True}))
        assert crashed["code"] == "ACTOR_FAILED"
        with trio.fail_after(10):
            while True:
                result = await call(client, "echo", {"message": "again", "resource": "k"})
                if not result.is_error:
                    break
                await trio.sleep(0.02)
        actor = next(a for a in payload(await call(client, "diagd_status"))["actors"] if a["resource"] == "k")
        assert actor["restarts"] == 1


async def test_setup_failure_reaches_the_caller_as_backend_unavailable(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        err = payload(await call(client, "echo", {"message": "x", "resource": "broken-dev"}))
        assert err["code"] == "BACKEND_UNAVAILABLE" and "broken-dev" in err["message"]


async def test_large_results_pass_through_the_shim_intact(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        result = await call(client, "echo", {"message": "big", "big": 6_000_000})
        assert len(result.structured_content["blob"]) == 6_000_000


async def test_stopping_an_actor_by_tool_frees_it(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        await call(client, "echo", {"message": "x", "resource": "s"})
        status = payload(await call(client, "diagd_status"))
        actor_id = next(a["id"] for a in status["actors"] if a["resource"] == "s")
        stopped = await call(client, "diagd_stop_actor", {"actor_id": actor_id})
        assert payload(stopped)["stopped"] == actor_id
        unknown = payload(await call(client, "diagd_stop_actor", {"actor_id": actor_id}))
        assert unknown["code"] == "NOT_FOUND"


def test_a_client_that_half_closes_after_its_requests_gets_every_answer(daemon: DaemonProcess) -> None:
    """`printf '...' | diagd mcp`: stdin ends right after the last request; the SDK's dispatcher
    cancels whatever runs when its input ends, so the daemon must hold it open until all are answered."""
    def echo(ident: int, message: str, delay_s: float = 0) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": message, "delay_s": delay_s}}}

    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        echo(3, "late", 0.5), echo(4, "x"), echo(5, "gone", 30),
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}},
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests).encode()
    for _ in range(5):  # the race it guards against lost an answer about every other run
        done = daemon.env.run("mcp", "--no-autostart", input=stdin, timeout=60)
        assert done.returncode == 0, done.stderr
        answers = {a["id"]: a for a in map(json.loads, done.stdout.splitlines())}
        assert set(answers) == {1, 2, 3, 4}, done.stdout[-500:]  # a cancelled request is not answered (MCP)
        assert json.loads(answers[3]["result"]["content"][0]["text"])["message"] == "late"
