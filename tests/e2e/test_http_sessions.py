"""HTTP MCP sessions against a real daemon: bounded per token and overall, no id minted by a refused
request, freed when idle and revived, and carried across a daemon restart for the real SDK clients
(Python here, TypeScript through tests/support/http_session_client.mjs)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
import trio

from tests.conftest import Env
from tests.e2e.test_http import ACCEPT, INIT, add_token, free_port, mcp_over_http

pytestmark = pytest.mark.e2e

SUPPORT = Path(__file__).resolve().parent.parent / "support"
NODE_SDK = Path(os.environ.get("DIAGD_NODE_SDK", Path.home() / ".cache" / "diagd" / "node-sdk"))


def config(port: int, extra: str = "") -> str:
    return f'[daemon]\nextra_backends = ["echo_actor"]\n[http]\nlisten = "127.0.0.1:{port}"\n{extra}'


def started(env: Env) -> None:
    done = env.run("start", timeout=60)
    assert done.returncode == 0, done.stderr


def stopped(env: Env) -> None:
    done = env.run("stop", timeout=60)
    assert done.returncode == 0, done.stderr


def restarted(env: Env) -> None:
    """`diagd restart`: the old daemon's pid gone, the new one answering on every listener."""
    done = env.run("restart", timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("diagd stopped (pid "), done.stdout


@pytest.fixture
def http_env(env: Env) -> Iterator[tuple[Env, int, str]]:
    """A daemon started with `diagd start` (`diagd restart` replaces it), its port and a token."""
    port = free_port()
    env.write_config(config(port, "max_sessions_per_token = 3\nmax_sessions = 4\n"))
    token = add_token(env, "laptop")
    started(env)
    try:
        yield env, port, token
    finally:
        env.run("stop", timeout=60)


def initialize(url: str, token: str) -> httpx2.Response:
    return httpx2.post(url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {token}"}, timeout=30)


def listed(url: str, token: str, sid: str) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    return httpx2.post(url, json=body, timeout=30, headers={
        **ACCEPT, "Authorization": f"Bearer {token}", "Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"})


def test_diagd_start_and_restart_return_when_the_http_port_accepts(http_env: tuple[Env, int, str]) -> None:
    env, port, _token = http_env

    def accepts() -> None:  # no retry: the first connect must succeed
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

    accepts()
    stopped(env)
    started(env)
    accepts()
    restarted(env)
    accepts()


def test_requests_without_a_session_id_other_than_initialize_get_no_id(http_env: tuple[Env, int, str]) -> None:
    _env, port, token = http_env
    url, auth = f"http://127.0.0.1:{port}/mcp", {"Authorization": f"Bearer {token}"}
    answers = [httpx2.get(url, headers={**auth, "Accept": "text/event-stream"}, timeout=30),
               httpx2.delete(url, headers=auth, timeout=30),
               httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                           headers={**ACCEPT, **auth}, timeout=30),
               httpx2.post(url, content=b"{not json", headers={**ACCEPT, **auth}, timeout=30)]
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert "mcp-session-id" not in answer.headers
    for answer in answers[:3]:
        assert "Mcp-Session-Id header is required" in answer.json()["error"]["message"]
    # Bad JSON is screened first (as on stdio): a JSON-RPC parse error, and still no session id.
    assert answers[3].json()["error"]["code"] == -32700
    # The sessionless protocol era (no initialize, no session id) goes straight to the SDK.
    modern = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
                         headers={**ACCEPT, **auth, "Mcp-Protocol-Version": "2026-07-28"}, timeout=30)
    assert "Mcp-Session-Id" not in modern.text and "mcp-session-id" not in modern.headers


def test_a_token_at_its_cap_replaces_its_longest_idle_session_and_the_overall_cap_refuses(
        http_env: tuple[Env, int, str]) -> None:
    env, port, token = http_env
    url = f"http://127.0.0.1:{port}/mcp"
    sids = []
    for _ in range(5):
        answer = initialize(url, token)
        assert answer.status_code == 200
        sids.append(answer.headers["mcp-session-id"])
    assert [listed(url, token, sid).status_code for sid in sids] == [404, 404, 200, 200, 200]
    other = add_token(env, "ci")
    assert initialize(url, other).status_code == 200  # 4 of max_sessions = 4
    refused = initialize(url, other)
    assert refused.status_code == 503 and "mcp-session-id" not in refused.headers
    assert all(listed(url, token, sid).status_code == 200 for sid in sids[2:])  # never another token's
    assert listed(url, other, sids[4]).status_code == 404  # a session answers only its own token


async def test_the_python_sdk_keeps_its_session_across_a_restart(http_env: tuple[Env, int, str]) -> None:
    env, port, token = http_env
    with trio.fail_after(120):
        async with mcp_over_http(f"http://127.0.0.1:{port}/mcp", token) as client:
            before = await client.call_tool("echo", {"message": "before"})
            assert not before.is_error
            await trio.to_thread.run_sync(restarted, env)
            assert (env.state / "http_sessions.json").stat().st_mode & 0o777 == 0o600
            after = await client.call_tool("echo", {"message": "after"})
            assert not after.is_error and json.loads(after.content[0].text)["message"] == "after"
            assert "echo" in {t.name for t in (await client.list_tools()).tools}


def test_another_token_cannot_revive_a_session(http_env: tuple[Env, int, str]) -> None:
    env, port, token = http_env
    url = f"http://127.0.0.1:{port}/mcp"
    sid = initialize(url, token).headers["mcp-session-id"]
    other = add_token(env, "ci")
    restarted(env)
    assert listed(url, other, sid).status_code == 404
    assert listed(url, token, sid).status_code == 200


def test_a_token_revoked_and_added_again_under_its_name_has_none_of_the_old_sessions(
        http_env: tuple[Env, int, str]) -> None:
    # Issue 39: sessions belong to the token's id, not its name.
    env, port, token = http_env
    url = f"http://127.0.0.1:{port}/mcp"
    sid = initialize(url, token).headers["mcp-session-id"]
    assert listed(url, token, sid).status_code == 200
    assert env.run("token", "revoke", "laptop").returncode == 0
    assert listed(url, token, sid).status_code == 401  # the revoked secret itself
    again = add_token(env, "laptop")
    unknown = listed(url, again, "f" * 32)
    assert unknown.status_code == 404
    live = listed(url, again, sid)  # its transport is still live in the daemon
    assert (live.status_code, live.json()) == (404, unknown.json())  # answered as an unknown session
    fresh = initialize(url, again)
    assert fresh.status_code == 200 and fresh.headers["mcp-session-id"] != sid
    assert listed(url, again, fresh.headers["mcp-session-id"]).status_code == 200


def test_a_dormant_session_of_a_revoked_token_is_not_revived_for_its_successor(env: Env) -> None:
    port = free_port()
    env.write_config(config(port, "session_idle_s = 0.2\n"))
    token = add_token(env, "laptop")
    started(env)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        sid = initialize(url, token).headers["mcp-session-id"]
        log = env.state / "daemon.log"
        _wait_for(lambda: "http session freed while idle" in log.read_text(errors="replace"), log)
        assert env.run("token", "revoke", "laptop").returncode == 0
        again = add_token(env, "laptop")
        unknown = listed(url, again, "f" * 32)
        dormant = listed(url, again, sid)  # its record is kept, revivable, but for the old token's id only
        assert (dormant.status_code, dormant.json()) == (404, unknown.json())
        assert "http session revived" not in log.read_text(errors="replace")
        fresh = initialize(url, again)
        assert fresh.status_code == 200 and listed(url, again, fresh.headers["mcp-session-id"]).status_code == 200
    finally:
        env.run("stop", timeout=60)


def test_an_idle_session_is_freed_and_revived_on_its_next_request(env: Env) -> None:
    port = free_port()
    env.write_config(config(port, "session_idle_s = 0.2\n"))
    token = add_token(env, "laptop")
    started(env)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        sid = initialize(url, token).headers["mcp-session-id"]
        log = env.state / "daemon.log"
        _wait_for(lambda: "http session freed while idle" in log.read_text(errors="replace"), log)
        answer = listed(url, token, sid)
        assert answer.status_code == 200 and '"echo"' in answer.text
        assert "http session revived" in log.read_text(errors="replace")
    finally:
        env.run("stop", timeout=60)


def test_a_planted_symlink_is_not_followed(env: Env) -> None:
    port = free_port()
    env.write_config(config(port))
    token = add_token(env, "laptop")
    target = env.root / "elsewhere"
    target.write_text("untouched\n")
    (env.state / "http_sessions.json").symlink_to(target)
    started(env)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        assert initialize(url, token).status_code == 200
    finally:
        stopped(env)
    assert target.read_text() == "untouched\n"  # refused when read, replaced (not followed) when written
    assert not (env.state / "http_sessions.json").is_symlink()
    assert (env.state / "http_sessions.json").stat().st_mode & 0o777 == 0o600
    log = (env.state / "daemon.log").read_text(errors="replace")
    assert "http sessions of the last run not restored" in log and "it is a symlink" in log


@pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                    reason="node and npm are needed for the TypeScript SDK client")
def test_the_typescript_sdk_keeps_its_session_across_a_restart(http_env: tuple[Env, int, str]) -> None:
    env, port, token = http_env
    client = node_client("http_session_client.mjs", port, token)
    try:
        assert client.stdout is not None and client.stdin is not None
        assert client.stdout.readline().strip() == "before: before", client.stderr
        restarted(env)
        client.stdin.write("go\n")
        client.stdin.flush()
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        assert out.strip() == "after: after", err
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def node_client(script: str, port: int, token: str) -> subprocess.Popen[str]:
    """tests/support/`script` run by node against the daemon's HTTP port, with the SDK and the token;
    its stdin, stdout and stderr are pipes."""
    return subprocess.Popen(["node", str(SUPPORT / script), f"http://127.0.0.1:{port}/mcp"],
                            env={**os.environ, "DIAGD_NODE_SDK": str(node_sdk()), "DIAGD_TOKEN": token},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def node_sdk() -> Path:
    """`@modelcontextprotocol/sdk` installed from the npm registry into a cache outside the repository."""
    if not (NODE_SDK / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        NODE_SDK.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(NODE_SDK),
                               "@modelcontextprotocol/sdk"], capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            pytest.skip(f"npm could not install @modelcontextprotocol/sdk: {done.stderr.strip()[-300:]}")
    return NODE_SDK


def _wait_for(condition: object, log: Path) -> None:
    import time

    assert callable(condition)
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)
