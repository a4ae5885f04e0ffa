"""MCP over Streamable HTTP against a real daemon: the SDK's HTTP client with a token lists and
calls tools; a request without a valid token gets 401 (a revoke applies without a restart); the
Host check stops DNS rebinding; a bind other hosts can reach is refused without TLS."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.conftest import DaemonProcess, Env, start_daemon

pytestmark = pytest.mark.e2e

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HttpDaemon:
    daemon: DaemonProcess
    url: str
    token: str


def add_token(env: Env, name: str) -> str:
    done = env.run("token", "add", name)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_for_http(env: Env, daemon: DaemonProcess) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = env.run("status", "--json")
        if done.returncode == 0 and "http" in (sockets := json.loads(done.stdout)["daemon"]["sockets"]):
            return str(sockets["http"])
        assert daemon.proc.poll() is None, daemon.log()
        time.sleep(0.05)
    raise TimeoutError(daemon.log())


@contextmanager
def running(env: Env, config: str, *, token_name: str = "laptop") -> Iterator[HttpDaemon]:
    """A daemon started with `config` (its [http] listen set) and a token made before it started."""
    env.write_config(config)
    token = add_token(env, token_name)
    daemon = start_daemon(env)
    try:
        yield HttpDaemon(daemon, wait_for_http(env, daemon), token)
    finally:
        daemon.stop()


@pytest.fixture
def http_daemon(env: Env) -> Iterator[HttpDaemon]:
    port = free_port()
    with running(env, f'[daemon]\nextra_backends = ["echo_actor"]\n[http]\nlisten = "127.0.0.1:{port}"\n') as http:
        assert http.url == f"http://127.0.0.1:{port}/mcp"
        yield http


@asynccontextmanager
async def mcp_over_http(url: str, token: str) -> AsyncIterator[Client]:
    async with (create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http), mode="legacy") as client):
        yield client


def post_initialize(url: str, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(url, json=INIT, headers={**ACCEPT, **headers}, timeout=30)


async def test_an_sdk_client_with_a_token_lists_and_calls_tools_audited_under_the_token_name(
        http_daemon: HttpDaemon, env: Env) -> None:
    with trio.fail_after(60):
        async with mcp_over_http(http_daemon.url, http_daemon.token) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"echo", "diagd_status", "pcap_info"} <= names
            result = await client.call_tool("echo", {"message": "over http"})
            assert not result.is_error and json.loads(result.content[0].text)["message"] == "over http"
            status = await client.call_tool("diagd_status", {})
            assert json.loads(status.content[0].text)["daemon"]["sockets"]["http"] == http_daemon.url
    records = [json.loads(line) for line in (env.state / "audit.jsonl").read_text().splitlines()]
    assert {r["client"] for r in records if r["tool"] == "echo"} == {"http:laptop"}
    status = json.loads(env.run("status", "--json").stdout)
    assert status["tools"]["echo"]["count"] == 1  # counted like calls over the other sockets
    assert f"http={http_daemon.url}" in env.run("status").stdout


def test_a_request_without_a_token_gets_401_with_a_bearer_challenge(http_daemon: HttpDaemon) -> None:
    for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"}):
        answer = post_initialize(http_daemon.url, headers)
        assert answer.status_code == 401, headers
        assert answer.headers["www-authenticate"].startswith("Bearer")


def test_a_wrong_token_gets_401(http_daemon: HttpDaemon) -> None:
    answer = post_initialize(http_daemon.url, {"Authorization": f"Bearer {http_daemon.token}x"})
    assert answer.status_code == 401
    assert post_initialize(http_daemon.url, {"Authorization": f"Bearer {http_daemon.token}"}).status_code == 200


async def test_a_revoked_token_gets_401_without_a_restart(http_daemon: HttpDaemon, env: Env) -> None:
    other = add_token(env, "ci")  # added while the daemon runs: accepted at once too
    auth = {"Authorization": f"Bearer {other}"}
    assert post_initialize(http_daemon.url, auth).status_code == 200
    done = env.run("token", "revoke", "ci")
    assert done.returncode == 0, done.stderr
    assert post_initialize(http_daemon.url, auth).status_code == 401
    with trio.fail_after(60):  # the other token is untouched
        async with mcp_over_http(http_daemon.url, http_daemon.token) as client:
            assert not (await client.call_tool("echo", {"message": "still here"})).is_error


async def test_relative_paths_are_refused_over_http(http_daemon: HttpDaemon) -> None:
    with trio.fail_after(60):
        async with mcp_over_http(http_daemon.url, http_daemon.token) as client:
            result = await client.call_tool("pcap_info", {"pcap_path": "capture.pcap"})
    refused = json.loads(result.content[0].text)
    assert result.is_error and refused["code"] == "INVALID_ARGUMENT" and "HTTP client" in refused["message"]


def test_a_foreign_host_or_origin_is_refused_even_with_a_token(http_daemon: HttpDaemon) -> None:
    # DNS rebinding: a web page whose name now points at 127.0.0.1 sends its own Host and Origin.
    auth = {"Authorization": f"Bearer {http_daemon.token}"}
    assert post_initialize(http_daemon.url, {**auth, "Host": "evil.example:80"}).status_code == 421
    assert post_initialize(http_daemon.url, {**auth, "Origin": "http://evil.example"}).status_code == 403
    assert post_initialize(http_daemon.url, {**auth, "Host": "localhost"}).status_code == 200


def test_other_paths_are_not_served(http_daemon: HttpDaemon) -> None:
    auth = {"Authorization": f"Bearer {http_daemon.token}"}
    assert httpx2.get(http_daemon.url.replace("/mcp", "/"), headers=auth, timeout=30).status_code == 404


def test_a_non_loopback_listen_without_tls_is_refused_at_start(env: Env) -> None:
    env.write_config(f'[http]\nlisten = "0.0.0.0:{free_port()}"\n')
    done = env.run("serve", timeout=60)
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("diagd: INVALID_ARGUMENT: [http] listen")
    assert "tls_cert and tls_key" in line and "allow_insecure_non_loopback" in line and "Traceback" not in done.stderr


def test_a_port_in_use_is_one_coded_line(env: Env) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env.write_config(f'[http]\nlisten = "127.0.0.1:{taken.getsockname()[1]}"\n')
        done = env.run("serve", timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "diagd: BACKEND_UNAVAILABLE: cannot listen on 127.0.0.1:" in done.stderr


def test_the_token_file_is_owner_only_and_the_listing_shows_no_secret(env: Env) -> None:
    secret = add_token(env, "laptop")
    assert (env.state / "http_tokens.json").stat().st_mode & 0o777 == 0o600
    for args in (("token", "list"), ("token", "list", "--json")):
        done = env.run(*args)
        assert done.returncode == 0 and "laptop" in done.stdout
        assert secret not in done.stdout + done.stderr
    unknown = env.run("token", "revoke", "laptp")
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr and "laptop" in unknown.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the throw-away certificate")
def test_with_tls_files_the_listener_speaks_https(env: Env) -> None:
    cert, key = env.root / "cert.pem", env.root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   capture_output=True, check=True, timeout=60)
    port = free_port()
    with running(env, f'[http]\nlisten = "127.0.0.1:{port}"\ntls_cert = "{cert}"\ntls_key = "{key}"\n') as http:
        assert http.url == f"https://127.0.0.1:{port}/mcp"
        trust = ssl.create_default_context(cafile=str(cert))  # the client checks the name against the certificate
        ok = httpx2.post(http.url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {http.token}"},
                         verify=trust, timeout=30)
        assert ok.status_code == 200 and '"result"' in ok.text
        assert httpx2.post(http.url, json=INIT, headers=ACCEPT, verify=trust, timeout=30).status_code == 401


async def test_http_sessions_see_the_configured_tool_groups_only(env: Env) -> None:
    """HTTP has no `--tools` (no shim): its sessions get `[mcp] tools`, listed and enforced."""
    port = free_port()
    config = (f'[daemon]\nextra_backends = ["echo_actor"]\n[mcp]\ntools = ["pcap"]\n'
              f'[http]\nlisten = "127.0.0.1:{port}"\n')
    with running(env, config, token_name="pcap-only") as http, trio.fail_after(60):
        async with mcp_over_http(http.url, http.token) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert "pcap_info" in names and "diagd_status" in names
            assert not names & {"echo", "open_vmcore_session", "exec_program", "send_data"}
            with pytest.raises(MCPError) as refused:  # a protocol error, naming the tool's group
                await client.call_tool("echo", {"message": "not selected"})
            assert refused.value.code == -32602 and refused.value.error.data["group"] == "echo_actor"
