"""Connection exhaustion: with max_connections idle (or half-sent) connections open, a real `diagd status`,
`diagd call` and a real MCP client through `diagd mcp` must still be served."""

from __future__ import annotations

import shutil
import socket
import struct
from collections.abc import Iterator

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd.daemon.config import DaemonConfig
from diagd.protocol import control
from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.fault.conftest import fault_env

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

MAX_CONNECTIONS = DaemonConfig().max_connections  # the default configuration's limit


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("exhaust")
    env = fault_env(root, "[daemon]\n", "ex")  # the default configuration
    proc = start_daemon(env)
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


def hold(path: str, data: bytes = b"") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    if data:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon dropped it already: that is allowed
    return sock


async def assert_real_clients_are_served(daemon: DaemonProcess) -> None:
    status = await trio.to_thread.run_sync(lambda: daemon.env.run("status", timeout=60))
    assert status.returncode == 0 and f"pid {daemon.proc.pid}" in status.stdout, \
        f"diagd status was locked out ({status.returncode}): {status.stdout}{status.stderr}"
    called = await trio.to_thread.run_sync(lambda: daemon.env.run("call", "diagd_calls", "--visibility=off",
                                                                  timeout=60))
    assert called.returncode == 0, f"diagd call was locked out ({called.returncode}): {called.stderr}"
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
    with trio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            result = await client.call_tool("diagd_status", {})
    assert not result.is_error and result.structured_content["daemon"]["pid"] == daemon.proc.pid


async def test_max_connections_idle_connections_do_not_lock_out_status_call_or_mcp(daemon: DaemonProcess) -> None:
    held = [hold(str(daemon.control_socket if i % 2 else daemon.mcp_socket)) for i in range(MAX_CONNECTIONS)]
    try:
        await assert_real_clients_are_served(daemon)
        assert daemon.proc.poll() is None
    finally:
        for sock in held:
            sock.close()


async def test_max_connections_half_sent_frames_and_lines_do_not_lock_out_clients(daemon: DaemonProcess) -> None:
    """Each connection stops in the middle of something: a control frame (header promising the largest
    frame, then 64 kB), a hello and a partial request, or an MCP line with no end."""
    partial_frame = struct.pack(">I", control.MAX_FRAME_BYTES) + b"\x00" * 65536
    hello = control.encode(control.Hello(version=control.PROTOCOL_VERSION, client="stuck"))
    kinds = [(str(daemon.control_socket), partial_frame), (str(daemon.control_socket), hello + b"\x00\x00"),
             (str(daemon.mcp_socket), b'{"jsonrpc": "2.0", "method": "initialize", "params": {"x": "' + b"a" * 65536),
             (str(daemon.mcp_socket), b'{"jsonrpc": "2.0", "id": 1')]
    held = [hold(*kinds[i % len(kinds)]) for i in range(MAX_CONNECTIONS)]
    try:
        await assert_real_clients_are_served(daemon)
        assert daemon.proc.poll() is None
    finally:
        for sock in held:
            sock.close()


async def test_more_than_max_connections_idle_connections_still_let_newcomers_in(daemon: DaemonProcess) -> None:
    held = [hold(str(daemon.control_socket if i % 2 else daemon.mcp_socket)) for i in range(MAX_CONNECTIONS * 2)]
    try:
        await assert_real_clients_are_served(daemon)
    finally:
        for sock in held:
            sock.close()
    await assert_real_clients_are_served(daemon)
