"""Partial MCP lines against a real daemon: a line that trickles in is dropped at its deadline
while other clients are served, half-sent long lines cost the daemon a bounded amount of memory
(the budget control frames share), and large requests sent at a normal pace still work."""

from __future__ import annotations

import json
import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.conftest import DaemonProcess, Env, start_daemon
from tests.support.raw import RawMCP

pytestmark = pytest.mark.e2e
ECHO = '[daemon]\nextra_backends = ["echo_actor"]\n'
MiB = 1024 * 1024
CALL_PREFIX = (b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", '
               b'"params": {"name": "echo", "arguments": {"message": "')


@contextmanager
def daemon_with(env: Env, settings: str) -> Iterator[DaemonProcess]:
    env.write_config(ECHO + settings)
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture
def sessions() -> Iterator[list[RawMCP]]:
    opened: list[RawMCP] = []
    yield opened
    for raw in opened:
        raw.close()


def session(daemon: DaemonProcess, opened: list[RawMCP]) -> RawMCP:
    raw = RawMCP(daemon.mcp_socket, timeout=30)
    opened.append(raw)
    raw.initialize()
    return raw


def echo(raw: RawMCP, ident: int, message: str) -> dict[str, Any]:
    raw.send({"jsonrpc": "2.0", "id": ident, "method": "tools/call",
              "params": {"name": "echo", "arguments": {"message": message}}})
    reply = raw.read()
    assert reply is not None and reply.get("id") == ident, reply
    return reply


def echoed(reply: dict[str, Any]) -> str:
    message: str = json.loads(reply["result"]["content"][0]["text"])["message"]
    return message


def status(daemon: DaemonProcess) -> dict[str, Any]:
    out = daemon.env.run("status", "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def test_slowloris_partial_mcp_lines_are_dropped_at_their_deadline_while_another_client_is_served(
        env: Env, sessions: list[RawMCP]) -> None:
    with daemon_with(env, "frame_timeout_s = 1\n") as daemon:
        other = session(daemon, sessions)  # then idle longer than the deadline: waiting between lines is free
        slow = [session(daemon, sessions) for _ in range(8)]
        for raw in slow:
            raw.send_bytes(CALL_PREFIX)
        notices: dict[int, bytes] = {}
        calls = 0
        # Trickle one byte per connection per round (each round also makes the other client call)
        # until every slow connection got its notice; the round count only bounds a failing test.
        for _ in range(2000):
            for i, raw in enumerate(slow):
                if i in notices:
                    continue
                if select.select([raw.sock], [], [], 0)[0]:
                    line = raw.read_line()
                    assert line is not None
                    notices[i] = line
                    continue
                try:
                    raw.send_bytes(b"x")
                except (BrokenPipeError, ConnectionResetError):
                    pass
            if len(notices) == len(slow):
                break
            calls += 1
            assert echoed(echo(other, 100 + calls, f"served {calls}")) == f"served {calls}"
        assert len(notices) == len(slow)
        assert calls > 0
        for line in notices.values():
            notice = json.loads(line)
            assert notice["id"] is None and notice["error"]["data"]["code"] == "TIMEOUT", notice
            assert notice["error"]["data"]["closing"] is True
            assert "within 1 s of its first byte" in notice["error"]["message"]
        for raw in slow:
            assert raw.read_line() is None  # closed after the notice
        assert echoed(echo(other, 1, "still here")) == "still here"
        assert '"mcp line refused, closing"' in daemon.log()


def push_until_stalled(socks: list[socket.socket], data: bytes) -> int:
    """Send `data` on every socket without blocking until the daemon takes no more from any of
    them for a second; the bytes taken (daemon buffers plus kernel socket buffers)."""
    pending = {sock: memoryview(data) for sock in socks}
    for sock in socks:
        sock.setblocking(False)
    while writable := select.select([], [s for s, left in pending.items() if left], [], 1.0)[1]:
        for sock in writable:
            try:
                pending[sock] = pending[sock][sock.send(pending[sock]):]
            except BlockingIOError:
                pass
    return sum(len(data) - len(left) for left in pending.values())


@pytest.mark.parametrize("lines", [40])
def test_forty_half_sent_multi_mib_mcp_lines_cost_the_daemon_a_few_mb(
        env: Env, sessions: list[RawMCP], lines: int) -> None:
    with daemon_with(env, "frame_timeout_s = 120\n") as daemon:
        senders = [session(daemon, sessions) for _ in range(lines)]
        status(daemon)
        before = rss_kib(daemon.proc.pid)
        taken = push_until_stalled([raw.sock for raw in senders], CALL_PREFIX + b"x" * (3 * MiB))
        assert taken > 8 * MiB  # more than the budget: the rest waits in kernel buffers, not in the daemon
        data = status(daemon)  # answered meanwhile
        assert sum(c["state"] == "reading" for c in data["daemon"]["clients"]) == lines
        grown_mib = (rss_kib(daemon.proc.pid) - before) / 1024
        # Unbounded this is 40 x 3 MiB: the shared 4 MiB budget plus 40 x 64 KiB below the threshold cap it.
        assert grown_mib < 12, f"daemon RSS grew by {grown_mib:.1f} MiB"


def test_one_mib_requests_sent_at_once_by_several_clients_are_all_answered(
        env: Env, sessions: list[RawMCP]) -> None:
    with daemon_with(env, "") as daemon:
        clients = [session(daemon, sessions) for _ in range(6)]  # 6 MiB at once, over the 4 MiB budget
        messages = [chr(ord("a") + i) * MiB for i in range(len(clients))]
        requests = [json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                                "params": {"name": "echo", "arguments": {"message": m}}}).encode() + b"\n"
                    for i, m in enumerate(messages)]
        senders = [threading.Thread(target=raw.send_bytes, args=(req,))
                   for raw, req in zip(clients, requests, strict=True)]
        for thread in senders:
            thread.start()
        replies = [raw.read() for raw in clients]
        for thread in senders:
            thread.join(timeout=30)
        for i, reply in enumerate(replies):
            assert reply is not None and reply["id"] == i and echoed(reply) == messages[i], str(reply)[:300]
        assert status(daemon)["daemon"]["connections_dropped"] == 0
