"""A capture never records diagd's own MCP over HTTP traffic, whose requests carry bearer tokens: the
attack is a client allowed to capture on `lo` (or `any`) reading another client's token off the
wire. A real daemon with its HTTP listener on loopback and `lo` allowed; captures started over that
very listener, one without a filter and one whose filter asks for the listener's port outright;
MCP calls and curl requests carrying the token while they run, and the same token bytes sent on
another loopback port. tshark, on the capture files, finds the token only in the other port's
frames (so the capture did see loopback traffic) and no frame of the listener's port at all."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import Env, start_daemon
from tests.e2e.test_http import INIT, HttpDaemon, add_token, free_port, mcp_over_http, wait_for_http

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["free", "0"], ids=["port", "port-0"])
def http_capture_daemon(env: Env, request: pytest.FixtureRequest) -> Iterator[HttpDaemon]:
    """Its listener on a port the config names, or on port 0 (the port is known once bound)."""
    if os.geteuid() != 0:
        pytest.skip("live capture tests need root (dumpcap in the sandbox)")
    for tool in ("dumpcap", "tshark", "curl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh test installs it)")
    port = free_port() if request.param == "free" else 0
    env.write_config(f'[http]\nlisten = "127.0.0.1:{port}"\n[capture]\nallowed_interfaces = ["lo"]\n')
    token = add_token(env, "laptop")
    daemon = start_daemon(env)
    try:
        yield HttpDaemon(daemon, wait_for_http(env, daemon), token)
    finally:
        daemon.stop()


async def tool(client: Any, name: str, *, refused: bool = False, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(name, args)
    answer: dict[str, Any] = json.loads(result.content[0].text)
    assert result.is_error == refused, answer
    return answer


def curl_initialize(url: str, token: str) -> None:
    done = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                           "-H", f"Authorization: Bearer {token}", "-H", "Accept: application/json, text/event-stream",
                           "-H", "Content-Type: application/json", "--data", json.dumps(INIT), url],
                          capture_output=True, text=True, check=True, timeout=30)
    assert done.stdout == "200", done


def send_elsewhere(payload: bytes) -> int:
    """`payload` over a TCP connection on loopback that is not diagd's: the port it used."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as client, server.accept()[0] as peer:
            client.sendall(payload)
            received = b""
            while len(received) < len(payload):
                received += peer.recv(65536)
        return int(server.getsockname()[1])


def tshark_fields(files: list[str], display_filter: str, field: str) -> list[str]:
    out = []
    for path in files:
        done = subprocess.run(["tshark", "-n", "-r", path, "-Y", display_filter, "-T", "fields", "-e", field],
                              capture_output=True, text=True, check=True)
        out += done.stdout.split()
    return out


async def test_a_capture_on_lo_never_holds_the_http_listeners_traffic_or_its_token(
        http_capture_daemon: HttpDaemon, tmp_path: Path) -> None:
    http = http_capture_daemon
    port = int(http.url.split(":")[2].split("/")[0])  # as bound
    assert port != 0
    with trio.fail_after(120):
        async with mcp_over_http(http.url, http.token) as client:
            everything = await tool(client, "start_capture", interfaces=["lo"], duration_s=60)
            tcp = await tool(client, "start_capture", interfaces=["lo"], duration_s=60, filter="tcp")
            # The reply says what is left out, and the filter dumpcap runs.
            assert everything["excluded_tcp_ports"] == tcp["excluded_tcp_ports"] == [port]
            assert everything["filter"] == "" and everything["applied_filter"] == f"not (tcp port {port})"
            assert tcp["filter"] == "tcp" and tcp["applied_filter"] == f"(tcp) and not (tcp port {port})"
            # A filter asking for the listener's port alone selects nothing that may be captured: refused, saying so.
            asked = await tool(client, "start_capture", refused=True, interfaces=["lo"], filter=f"tcp port {port}")
            assert asked["code"] == "INVALID_FILTER" and "never captures" in asked["message"], json.dumps(asked)
            assert asked["details"]["applied_filter"] == f"(tcp port {port}) and not (tcp port {port})"

            # The token on the wire: MCP calls over HTTP, curl, and the same bytes on another port.
            for _ in range(3):
                assert (await tool(client, "capture_status", capture_id=everything["capture_id"]))["running"]
                await trio.to_thread.run_sync(curl_initialize, http.url, http.token)
            elsewhere = await trio.to_thread.run_sync(send_elsewhere, f"Authorization: Bearer {http.token}".encode())
            with trio.fail_after(15):  # the other port's frames are written: dumpcap has seen that far
                while (await tool(client, "capture_status", capture_id=everything["capture_id"]))["packets"] < 4:
                    await trio.sleep(0.2)
            with trio.fail_after(15):
                while (await tool(client, "capture_status", capture_id=tcp["capture_id"]))["packets"] < 4:
                    await trio.sleep(0.2)
            done = [await tool(client, "stop_capture", capture_id=c["capture_id"]) for c in (everything, tcp)]
    token = http.token.encode()
    for stopped in done:
        files = stopped["files"]
        assert stopped["stop_reason"] == "requested" and stopped["packets"] >= 4 and files
        # The capture saw loopback TCP: the token sent on the other port is there, in that port's frames only.
        holding = tshark_fields(files, f'frame contains "{http.token}"', "tcp.dstport")
        assert holding and set(holding) == {str(elsewhere)}
        # Nothing of the listener's port, though the MCP calls and curl crossed lo while it ran.
        assert tshark_fields(files, f"tcp.port == {port}", "frame.number") == []
        captured = b"".join(Path(f).read_bytes() for f in files)
        assert captured.count(token) == len(holding)  # once per frame of the other port, nowhere else
