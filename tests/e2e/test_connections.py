"""Connection exhaustion and slow peers against a real daemon: idle connections make room, busy
ones make newcomers wait with a coded refusal, half-sent messages are dropped at their deadline,
and half-sent large frames cost the daemon a bounded amount of memory."""

from __future__ import annotations

import json
import select
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd.protocol import control
from tests.conftest import DIAGD, DaemonProcess, Env, start_daemon
from tests.support.raw import INITIALIZE, RawMCP

pytestmark = pytest.mark.e2e
ECHO = '[daemon]\nextra_backends = ["echo_actor"]\n'


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


def read_frame(sock: socket.socket) -> control.Message | None:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    return control.decode(data[4:])


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def close_test_sockets() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def connect(path: Any) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _opened.append(sock)
    sock.settimeout(20)
    sock.connect(str(path))
    return sock


def raw_mcp(daemon: DaemonProcess) -> RawMCP:
    raw = RawMCP(daemon.mcp_socket, timeout=20)
    _opened.append(raw.sock)
    return raw


def greeted_control(daemon: DaemonProcess) -> socket.socket:
    sock = connect(daemon.control_socket)
    sock.sendall(frame({"t": "hello", "version": control.PROTOCOL_VERSION}))
    assert isinstance(read_frame(sock), control.Hello)
    return sock


def assert_closed_with(sock: socket.socket, code: str) -> str:
    """The control connection got a coded error and then EOF; returns the message."""
    reply = read_frame(sock)
    assert isinstance(reply, control.ErrorReply) and reply.code == code, reply
    assert read_frame(sock) is None
    return reply.message


def mcp_closed_with(raw: RawMCP, code: str) -> str:
    notice = raw.read()
    assert notice is not None and notice["id"] is None and notice["error"]["data"]["code"] == code, notice
    assert raw.read_line() is None
    return str(notice["error"]["message"])


def status(daemon: DaemonProcess) -> dict[str, Any]:
    out = daemon.env.run("status", "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


@contextmanager
def daemon_with(env: Env, settings: str) -> Iterator[DaemonProcess]:
    env.write_config(ECHO + settings)
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        daemon.stop()


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def has_data(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


async def test_idle_connections_filling_the_table_make_room_for_status_and_an_mcp_client(env: Env) -> None:
    # Deadlines out of the way: this is about the full table, not about slow peers.
    with daemon_with(env, "handshake_timeout_s = 600\n") as daemon:
        silent = [connect(daemon.control_socket) for _ in range(16)]
        assert len(status(daemon)["daemon"]["clients"]) == 17  # admitted, in this order
        silent_mcp = [connect(daemon.mcp_socket) for _ in range(16)]
        greeted = [greeted_control(daemon) for _ in range(16)]
        sessions = [raw_mcp(daemon) for _ in range(16)]
        for raw in sessions:
            raw.initialize()
        # 64 = the default max_connections: every slot is taken by a connection doing nothing.

        data = status(daemon)
        assert len(data["daemon"]["clients"]) == 64 and data["daemon"]["connections_dropped"] == 1
        extra = connect(daemon.mcp_socket)  # takes the slot the status connection left
        params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=daemon.env.vars)
        with trio.fail_after(30):
            async with Client(params, mode="legacy") as client:
                result = await client.call_tool("echo", {"message": "still served"})
                assert json.loads(result.content[0].text)["message"] == "still served"

        # The never-greeted connections went first, oldest first, each told why; nobody else was touched.
        assert "dropped to make room" in assert_closed_with(silent[0], "BUSY")
        assert "dropped to make room" in assert_closed_with(silent[1], "BUSY")
        assert not any(has_data(sock) for sock in [*silent[2:], *silent_mcp, *greeted, extra])
        greeted[0].sendall(frame({"t": "status", "id": 1}))
        assert isinstance(read_frame(greeted[0]), control.Reply)
        sessions[0].send({"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
        assert sessions[0].read()["id"] == 5  # type: ignore[index]


def busy_mcp(daemon: DaemonProcess, resource: str) -> RawMCP:
    """An MCP connection with a 30 s tool call in flight (its progress notice proves it started)."""
    raw = raw_mcp(daemon)
    raw.initialize()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "echo", "_meta": {"progressToken": resource},
                         "arguments": {"message": "x", "resource": resource, "delay_s": 30, "progress_steps": 1}}})
    progress = raw.read()
    assert progress is not None and progress.get("method") == "notifications/progress", progress
    return raw


def test_when_every_connection_is_busy_newcomers_get_one_line_and_a_nonzero_exit(env: Env) -> None:
    with daemon_with(env, "max_connections = 3\n") as daemon:
        busy = [busy_mcp(daemon, f"r{i}") for i in range(3)]

        out = env.run("status")
        assert out.returncode == 3 and "BUSY" in one_line(out.stderr) and "none is idle" in out.stderr
        call = env.run("call", "echo", "message=x", "--visibility=off")
        assert call.returncode == 3 and call.stdout == ""
        assert one_line(call.stderr).startswith("diagd call: BUSY: ")
        shim = env.run("mcp", "--no-autostart", input=json.dumps(INITIALIZE).encode() + b"\n")
        assert shim.returncode == 3  # no daemon served it, as `status` and `call` say it (daemon/exits.py)
        assert one_line(shim.stderr).startswith("diagd mcp: the daemon closed the connection: BUSY: ")
        raw = raw_mcp(daemon)
        assert "none is idle" in mcp_closed_with(raw, "BUSY")

        busy[0].close()  # its call is cancelled and its slot freed
        for _ in range(100):
            if env.run("status").returncode == 0:
                break
        assert env.run("call", "echo", "message=back", "--visibility=off").returncode == 0
        assert '"refused connection: every connection is busy"' in daemon.log()


def test_half_sent_messages_are_dropped_at_their_deadline_and_others_keep_being_served(env: Env) -> None:
    with daemon_with(env, "handshake_timeout_s = 0.5\nframe_timeout_s = 0.5\n") as daemon:
        waiting = greeted_control(daemon)  # idle between frames: no deadline applies
        silent = connect(daemon.control_socket)
        partial_hello = connect(daemon.control_socket)
        partial_hello.sendall(frame({"t": "hello", "version": 1})[:6])
        slow_frame = greeted_control(daemon)
        slow_frame.sendall(frame({"t": "status", "id": 1})[:3])
        mcp_partial = raw_mcp(daemon)
        mcp_partial.send_bytes(json.dumps(INITIALIZE).encode()[:40])
        mcp_silent = raw_mcp(daemon)

        assert "hello" in assert_closed_with(silent, "TIMEOUT")
        assert assert_closed_with(partial_hello, "TIMEOUT")
        assert "frame not complete" in assert_closed_with(slow_frame, "TIMEOUT")
        assert "first message" in mcp_closed_with(mcp_partial, "TIMEOUT")
        assert "first message" in mcp_closed_with(mcp_silent, "TIMEOUT")

        waiting.sendall(frame({"t": "status", "id": 9}))  # idle longer than every deadline above
        reply = read_frame(waiting)
        assert isinstance(reply, control.Reply) and reply.id == 9


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_forty_half_sent_large_frames_cost_the_daemon_a_few_mb_not_forty(env: Env) -> None:
    with daemon_with(env, "frame_timeout_s = 120\n") as daemon:
        status(daemon)
        before = rss_kib(daemon.proc.pid)
        length = control.MAX_REQUEST_BYTES
        body = b"\x00" * (length - 1)  # all but the last byte of a maximal request
        senders = [greeted_control(daemon) for _ in range(40)]
        pending = {}
        for sock in senders:
            sock.setblocking(False)
            pending[sock] = memoryview(struct.pack(">I", length) + body)
        # Push until the daemon stops taking bytes from anyone (it reads frames it has budget for).
        while writable := select.select([], [s for s, data in pending.items() if data], [], 1.0)[1]:
            for sock in writable:
                try:
                    pending[sock] = pending[sock][sock.send(pending[sock]):]
                except BlockingIOError:
                    pass
        taken = sum(len(body) + 4 - len(data) for data in pending.values())
        assert taken > 4 * length  # more than the budget: the rest sits in kernel buffers, not the daemon
        data = status(daemon)  # answered meanwhile: small frames never wait for the budget
        assert sum(c["state"] == "reading" for c in data["daemon"]["clients"]) == 40
        grown_mib = (rss_kib(daemon.proc.pid) - before) / 1024
        # Unbounded, this is 40 x 1 MiB (and was 40 x 16 MiB before the limits): the shared budget
        # (4 MiB by default) caps what half-sent frames hold.
        assert grown_mib < 8, f"daemon RSS grew by {grown_mib:.1f} MiB"
