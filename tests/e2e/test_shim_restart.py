"""Sessions survive a daemon restart: the real SDK client (or raw JSON-RPC lines) over `diagd mcp`, while
the daemon under it is stopped, killed and started again on the same runtime directory."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from tests.conftest import DIAGD, DaemonProcess, Env, start_daemon
from tests.support.raw import INITIALIZE, RawMCP

pytestmark = pytest.mark.e2e

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def echo(ident: Any, message: str = "hi", **more: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": message, **more}}}


def restart(daemon: DaemonProcess, how: str) -> DaemonProcess:
    """Stop (SIGTERM: the daemon says DAEMON_STOPPING) or kill (a plain drop) the daemon, start another."""
    if how == "kill":
        daemon.proc.send_signal(signal.SIGKILL)
    daemon.stop()
    return start_daemon(daemon.env)


@contextmanager
def restartable(env: Env) -> Iterator[list[DaemonProcess]]:
    """The daemons of one test, in order; every one is stopped at the end."""
    daemons = [start_daemon(env)]
    try:
        yield daemons
    finally:
        for d in daemons:
            d.stop()


@asynccontextmanager
async def sdk_client(env: Env, **extra_env: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env={**env.vars, **extra_env})
    async with Client(params, mode="legacy") as client:
        yield client


async def status_pid(client: Client) -> int:
    with trio.fail_after(30):
        result = await client.call_tool("diagd_status", {})
    assert not result.is_error, result
    pid: int = result.structured_content["daemon"]["pid"]
    return pid


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_restart_under_an_open_session_loses_nothing_the_next_call_succeeds(env: Env, how: str) -> None:
    with restartable(env) as daemons:
        async with sdk_client(env) as client:
            assert await status_pid(client) == daemons[0].proc.pid
            daemons.append(restart(daemons[0], how))
            assert await status_pid(client) == daemons[1].proc.pid  # the same ClientSession
            daemons.append(restart(daemons[1], how))  # and again
            with trio.fail_after(30):
                result = await client.call_tool("echo", {"message": "after two restarts"})
            assert result.structured_content == {"message": "after two restarts", "resource": "default"}


async def test_diagd_restart_under_an_open_session_the_next_call_succeeds(env: Env) -> None:
    """The command a user types, under the real SDK client's open stdio session."""
    assert env.run("start", timeout=60).returncode == 0
    try:
        async with sdk_client(env) as client:
            before = await status_pid(client)
            done = await trio.to_thread.run_sync(lambda: env.run("restart", timeout=90))
            assert done.returncode == 0, done.stderr
            after = await status_pid(client)  # the same ClientSession, on the new daemon
            assert after != before and f"pid {after}" in done.stdout
            with trio.fail_after(30):
                result = await client.call_tool("echo", {"message": "after diagd restart"})
            assert result.structured_content == {"message": "after diagd restart", "resource": "default"}
    finally:
        env.run("stop", timeout=60)


async def wait_busy(client: Client, resource: str) -> None:
    with trio.fail_after(20):
        while True:
            result = await client.call_tool("diagd_status", {})
            if any(a["resource"] == resource and a["state"] == "busy" for a in result.structured_content["actors"]):
                return
            await trio.sleep(0.02)


@pytest.mark.parametrize("how", ["stop", "kill"])
async def test_a_call_in_flight_at_the_restart_gets_daemon_restarted_and_the_session_goes_on(
        env: Env, how: str) -> None:
    errors: list[MCPError] = []

    async def slow_call(client: Client) -> None:
        try:
            await client.call_tool("echo", {"message": "slow", "resource": "inflight", "delay_s": 60})
        except MCPError as exc:
            errors.append(exc)

    with restartable(env) as daemons:
        async with sdk_client(env) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow_call, client)
                await wait_busy(client, "inflight")
                daemons.append(await trio.to_thread.run_sync(restart, daemons[0], how))
            assert len(errors) == 1
            assert errors[0].error.data == {"code": "DAEMON_RESTARTED", "method": "tools/call"}
            assert "may be retried" in errors[0].error.message
            with trio.fail_after(30):
                result = await client.call_tool("echo", {"message": "retried", "resource": "inflight"})
            assert not result.is_error and result.structured_content["message"] == "retried"


class StdioShim:
    """`diagd mcp` driven with raw JSON-RPC lines on its pipes (stdin stays open until `close`)."""

    def __init__(self, env: Env, *args: str, **extra_env: str) -> None:
        self.proc = subprocess.Popen([DIAGD, "mcp", *args], env={**env.vars, **extra_env}, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.buffer = b""

    def send(self, message: dict[str, Any] | bytes) -> None:
        assert self.proc.stdin is not None
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout: float = 30) -> dict[str, Any] | None:
        """The next line from the shim's stdout, None at EOF."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError(f"no line from the shim within {timeout} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        result: dict[str, Any] = json.loads(line)
        return result

    def initialize(self) -> None:
        self.send(INITIALIZE)
        reply = self.read()
        assert reply is not None and reply["id"] == 0 and "result" in reply, reply
        self.send(INITIALIZED)

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Its exit status and stderr (stdin left open: it must end by itself)."""
        assert self.proc.stderr is not None
        code = self.proc.wait(timeout)
        return code, self.proc.stderr.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@contextmanager
def shim(env: Env, *args: str, **extra_env: str) -> Iterator[StdioShim]:
    s = StdioShim(env, *args, **extra_env)
    try:
        yield s
    finally:
        s.close()


def test_calls_sent_while_no_daemon_runs_wait_and_go_through_the_replayed_session(env: Env) -> None:
    with restartable(env) as daemons, shim(env, "--no-autostart") as client:
        client.initialize()
        client.send(echo(1, "before"))
        assert client.read()["result"]["structuredContent"]["message"] == "before"  # type: ignore[index]
        daemons[0].stop()
        client.send(echo(2, "while down"))
        client.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        daemons.append(start_daemon(env))
        # The replayed initialize's answer is swallowed: the next two lines answer 2 and 3 (in any order).
        answers = {a["id"]: a for a in (client.read(), client.read()) if a is not None}
        assert answers[2]["result"]["structuredContent"]["message"] == "while down", answers
        assert any(t["name"] == "echo" for t in answers[3]["result"]["tools"])


def test_the_daemon_tells_connected_mcp_clients_it_stops_with_daemon_stopping(daemon: DaemonProcess) -> None:
    raw = RawMCP(daemon.mcp_socket)
    raw.initialize()
    daemon.stop()
    notice = raw.read()
    assert notice is not None and notice["id"] is None, notice
    assert notice["error"]["data"] == {"code": "DAEMON_STOPPING", "closing": True}
    assert notice["error"]["message"].startswith("DAEMON_STOPPING: the daemon is stopping (signal SIGTERM)")
    assert raw.read() is None
    raw.close()


def test_a_refusal_ends_the_shim_with_one_line_and_no_reconnect(env: Env) -> None:
    env.write_config('[daemon]\nextra_backends = ["echo_actor"]\nmax_line_bytes = 4096\n')
    with restartable(env), shim(env, "--no-autostart") as client:
        client.initialize()
        client.send(echo(1, "x" * 10000))  # a line past the limit: the daemon refuses and closes
        refusal = client.read()
        assert refusal is not None and refusal["id"] is None and refusal["error"]["data"]["closing"] is True
        code, stderr = client.wait()
        assert code == 1  # FAILED: the daemon refused what the client sent, not the connection
        assert stderr.splitlines() == ["diagd mcp: the daemon closed the connection: message exceeds 4096 bytes"]
        assert client.read() is None  # nothing after the refusal: no replayed session, no reconnect


def test_a_line_that_never_ends_meets_the_daemons_line_limit_not_unbounded_shim_memory(env: Env) -> None:
    """The shim holds an incomplete line back (a reconnect must not split it), but only so far."""
    env.write_config('[daemon]\nextra_backends = ["echo_actor"]\nmax_line_bytes = 4096\n')
    with restartable(env), shim(env, "--no-autostart") as client:
        client.initialize()
        client.send(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"'
                    + b"x" * (16 * 1024 * 1024 + 1))  # no newline, and stdin stays open
        refusal = client.read()
        assert refusal is not None and refusal["id"] is None and refusal["error"]["data"]["closing"] is True
        code, stderr = client.wait()
        assert code == 1 and "message exceeds 4096 bytes" in stderr, stderr


def test_a_daemon_that_does_not_come_back_within_the_bound_ends_the_shim_with_one_line(env: Env) -> None:
    with restartable(env) as daemons, shim(env, "--no-autostart", DIAGD_SHIM_RECONNECT_S="1") as client:
        client.initialize()
        client.send(echo(1, "slow", resource="bound", delay_s=60))
        wait_busy_over_control(env, "bound")  # the call is in flight
        daemons[0].stop()
        failed = client.read()  # the call in flight is answered before the shim waits for a daemon
        assert failed is not None and failed["id"] == 1 and failed["error"]["data"]["code"] == "DAEMON_RESTARTED"
        code, stderr = client.wait()
        assert code == 3 and client.read() is None  # NO_DAEMON
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in stderr, stderr
        assert lines[0].startswith("diagd mcp: the daemon went away (it is stopping) and did not come back within 1 s"
                                   " (autostart disabled)"), lines


def test_with_autostart_a_stopped_daemon_is_replaced_and_the_session_goes_on(env: Env) -> None:
    with shim(env, DIAGD_SHIM_AUTOSTART_AFTER_S="0") as client:
        client.initialize()  # the shim started the first daemon too
        client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "diagd_status"}})
        first = client.read()["result"]["structuredContent"]["daemon"]["pid"]  # type: ignore[index]
        try:
            assert env.run("stop").returncode == 0
            client.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "diagd_status"}})
            second = client.read()["result"]["structuredContent"]["daemon"]["pid"]  # type: ignore[index]
            assert second != first
        finally:
            client.close()  # first: a shim still running would autostart a daemon again after the stop
            stop_every_daemon(env)


def stop_every_daemon(env: Env) -> None:
    """`diagd stop` until nobody holds the runtime dir's lock (a daemon the shim was starting as it was
    killed comes up a moment later)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        env.run("stop")
        try:
            fd = os.open(env.runtime / "daemon.lock", os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.1)
        finally:
            os.close(fd)
    raise TimeoutError("a daemon still holds the lock")


def hang_up_after_the_handshake(path: os.PathLike[str]) -> tuple[socket.socket, list[int]]:
    """A socket at `path` whose first connection answers `initialize` and then closes, and which accepts
    and closes every later one without a word (a daemon failing right after accept); the connection count."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.fspath(path))
    server.listen(16)
    accepted = [0]

    def serve() -> None:
        with server.accept()[0] as conn, conn.makefile("rb") as lines:
            accepted[0] += 1
            ident = json.loads(lines.readline())["id"]
            answer = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {"name": "x", "version": "0"}}
            conn.sendall(json.dumps({"jsonrpc": "2.0", "id": ident, "result": answer}).encode() + b"\n")
            lines.readline()  # notifications/initialized
        while True:
            try:
                server.accept()[0].close()
            except OSError:
                return
            accepted[0] += 1

    threading.Thread(target=serve, daemon=True).start()
    return server, accepted


def test_a_daemon_that_keeps_hanging_up_ends_the_shim_within_the_bound_not_in_a_reconnect_loop(env: Env) -> None:
    """Each connect succeeds at once there: the bound must count connections that brought nothing."""
    env.runtime.mkdir(mode=0o700, exist_ok=True)
    server, accepted = hang_up_after_the_handshake(env.runtime / "mcp.sock")
    try:
        with shim(env, "--no-autostart", DIAGD_SHIM_RECONNECT_S="1") as client:
            client.initialize()
            code, stderr = client.wait()
            assert code == 3, stderr  # NO_DAEMON
            assert stderr.strip().splitlines()[-1].startswith(
                "diagd mcp: the daemon went away (it keeps closing the connection without a word) and did not "
                "come back within 1 s"), stderr
            assert accepted[0] > 2  # it did reconnect, with backoff
    finally:
        server.close()


def wait_busy_over_control(env: Env, resource: str) -> None:
    """Until the echo actor of `resource` runs a call (seen through `diagd status`)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = json.loads(env.run("status", "--json").stdout)
        if any(a["resource"] == resource and a["state"] == "busy" for a in status.get("actors", [])):
            return
        time.sleep(0.02)
    raise TimeoutError(f"no busy actor for {resource}")


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_after_a_restart_the_shim_exits_0_at_eof_when_every_request_was_answered(env: Env, how: str) -> None:
    """A DAEMON_RESTARTED answer is an answer: the session went on, and the client got every reply."""
    with restartable(env) as daemons, shim(env, "--no-autostart") as client:
        client.initialize()
        client.send(echo(1, "slow", resource="eof", delay_s=60))
        wait_busy_over_control(env, "eof")
        daemons.append(restart(daemons[0], how))
        failed = client.read()
        assert failed is not None and failed["id"] == 1 and failed["error"]["data"]["code"] == "DAEMON_RESTARTED"
        client.send(echo(2, "after"))
        assert client.read()["result"]["structuredContent"]["message"] == "after"  # type: ignore[index]
        assert client.proc.stdin is not None
        client.proc.stdin.close()
        code, stderr = client.wait()
        assert client.read() is None
        assert code == 0, stderr
        assert [line for line in stderr.splitlines() if "reconnected after" not in line] == [], stderr


def test_a_request_the_daemon_never_answers_at_eof_still_ends_the_shim_with_no_daemon_status(env: Env) -> None:
    """The initialize, sent to a daemon that accepts and closes without a word, and stdin closed."""
    env.runtime.mkdir(mode=0o700, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(env.runtime / "mcp.sock"))
    server.listen(4)

    def hang_up() -> None:
        # Gone for good after one connection: a listener left open would accept the shim's reconnect
        # in its backlog and never answer the replayed handshake (a hung daemon, not this case).
        with server.accept()[0] as conn:
            conn.recv(65536)
            server.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        with shim(env, "--no-autostart", DIAGD_SHIM_RECONNECT_S="1") as client:
            client.send(INITIALIZE)
            assert client.proc.stdin is not None
            client.proc.stdin.close()
            code, stderr = client.wait()
            assert code == 3 and "Traceback" not in stderr, stderr  # NO_DAEMON: no answer
    finally:
        server.close()
