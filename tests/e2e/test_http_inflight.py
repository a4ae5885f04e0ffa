"""A call in flight over HTTP when the daemon restarts is answered on its own stream with the
DAEMON_RESTARTED error the shim gives over the Unix socket, and the session goes on: the real Python
and TypeScript SDK clients, one call and many at once, then many calls racing
the session's revival (after a restart, and after the session was freed while idle).

Without the answer an HTTP client has nothing: the TypeScript SDK waits out its 60 s request timeout,
the Python SDK's session dies (daemon/server/http/inflight.py)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest
import trio
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.conftest import Env
from tests.e2e.test_http import ACCEPT, add_token, free_port, mcp_over_http
from tests.e2e.test_http_sessions import _wait_for, config, http_env, initialize, node_client, restarted, started

pytestmark = pytest.mark.e2e
__all__ = ["http_env"]  # the fixture, used by name

SLOW = 60.0  # the SDKs' own request timeout (TypeScript: 60 s): an answer sooner is the daemon's


async def wait_busy(client: Client, resources: set[str]) -> None:
    """Until every one of `resources` is busy with a call (the echo actor holds it for `delay_s`)."""
    with trio.fail_after(30):
        while True:
            actors = (await client.call_tool("diagd_status", {})).structured_content["actors"]
            if resources <= {a["resource"] for a in actors if a["state"] == "busy"}:
                return
            await trio.sleep(0.05)


@pytest.mark.parametrize("calls", [1, 6])
async def test_calls_in_flight_at_a_restart_get_daemon_restarted_and_the_session_goes_on(
        http_env: tuple[Env, int, str], calls: int) -> None:
    env, port, token = http_env
    errors: list[MCPError] = []
    answered: list[object] = []

    async def slow_call(resource: str) -> None:
        try:
            answered.append(await client.call_tool("echo", {"message": "slow", "resource": resource,
                                                            "delay_s": SLOW}))
        except MCPError as exc:
            errors.append(exc)

    resources = {f"inflight-{n}" for n in range(calls)}
    with trio.fail_after(SLOW - 10):  # each answer comes long before the call would have ended
        async with mcp_over_http(f"http://127.0.0.1:{port}/mcp", token) as client:
            async with trio.open_nursery() as nursery:
                for resource in sorted(resources):
                    nursery.start_soon(slow_call, resource)
                await wait_busy(client, resources)
                await trio.to_thread.run_sync(restarted, env)
            assert answered == []
            assert len(errors) == calls
            for error in errors:
                assert error.error.data == {"code": "DAEMON_RESTARTED", "method": "tools/call"}
                assert "may be retried" in error.error.message
            # The same session, revived by as many requests at once: each is answered.
            results: list[str] = []

            async def retry(resource: str) -> None:
                result = await client.call_tool("echo", {"message": resource, "resource": resource})
                assert not result.is_error, result
                results.append(json.loads(result.content[0].text)["message"])

            async with trio.open_nursery() as nursery:
                for resource in sorted(resources):
                    nursery.start_soon(retry, resource)
            assert sorted(results) == sorted(resources)


@pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                    reason="node and npm are needed for the TypeScript SDK client")
def test_the_typescript_sdk_gets_daemon_restarted_for_its_call_in_flight(http_env: tuple[Env, int, str]) -> None:
    env, port, token = http_env
    client = node_client("http_inflight_client.mjs", port, token)
    try:
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "in flight", client.stderr
        restarted(env)
        # Read before the SDK's own 60 s timeout could have answered: this answer is the daemon's.
        failed = json.loads(client.stdout.readline())
        assert failed["code"] == -32000 and failed["data"] == {"code": "DAEMON_RESTARTED", "method": "tools/call"}
        assert "may be retried" in failed["message"]
        client.stdin.write("go\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=SLOW - 15)
        assert client.returncode == 0, err
        assert [json.loads(line) for line in out.splitlines()] == [{"after": "after"}]
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_many_calls_racing_the_revival_of_an_idle_freed_session_are_all_answered(env: Env) -> None:
    # Raw requests: an SDK client keeps a GET event stream open, which keeps its session from idling.
    port = free_port()
    env.write_config(config(port, "session_idle_s = 0.2\n"))
    token = add_token(env, "laptop")
    started(env)
    log = env.state / "daemon.log"
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        sid = initialize(url, token).headers["mcp-session-id"]
        for freed_before in range(3):  # each round: the session freed while idle, then six calls at once
            _wait_for(lambda: _freed(log) > freed_before, log)  # noqa: B023 (called at once, in this round)
            with ThreadPoolExecutor(6) as pool:
                answers = list(pool.map(lambda n: _echo(url, token, sid, n), range(6)))
            assert answers == [f"m{n}" for n in range(6)]
        assert log.read_text(errors="replace").count("http session revived") >= 3
    finally:
        env.run("stop", timeout=60)


def _echo(url: str, token: str, sid: str, n: int) -> str:
    body = {"jsonrpc": "2.0", "id": n + 10, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": f"m{n}"}}}
    answer = httpx2.post(url, json=body, timeout=30, headers={
        **ACCEPT, "Authorization": f"Bearer {token}", "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"})
    assert answer.status_code == 200, answer.text
    data = next(line for line in answer.text.splitlines() if line.startswith("data: "))
    result = json.loads(data.removeprefix("data: "))["result"]
    assert not result["isError"], result
    return str(json.loads(result["content"][0]["text"])["message"])


def _freed(log: Path) -> int:
    return log.read_text(errors="replace").count("http session freed while idle")
