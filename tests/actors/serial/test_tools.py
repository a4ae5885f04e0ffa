"""The serial tools against a fake runtime (no daemon) and a scripted port, on the virtual clock:
what a tool changes on a port it changes through the port's actor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from diagd.actors import serial
from diagd.actors.runtime import Client
from diagd.actors.serial.backend import SerialBackend
from diagd.actors.serial.port import PortIO
from diagd.actors.serial.settings import PortSettings
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.actors.serial.test_clock import PORT, FakeSerial, inline
from tests.support.fake_runtime import fake_runtime


def use(backend: SerialBackend, *ports: FakeSerial) -> None:
    queue = list(ports)

    async def opener(device: str, settings: PortSettings, lines: dict[str, bool]) -> PortIO:
        port = queue.pop(0)
        port.bind(device, settings, lines)
        return port

    backend.opener = opener
    backend.run_blocking = inline


def events(backend: SerialBackend) -> list[dict[str, Any]]:
    path = backend.records[PORT].log_path
    assert path is not None
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["dir"] == "event"]


async def test_schema_defaults_reach_the_actor(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with fake_runtime(tmp_path, "serial") as rt:
        backend = serial.register(rt)
        use(backend, FakeSerial(replies={b"AT\r": [(0.1, b"OK")]}))
        opened = await rt.call("configure_connection", {"port": PORT})  # action=open by default
        assert opened["outcome"] == "opened" and opened["owner"] == "mcp:1"
        started = trio.current_time()
        sent = await rt.call("send_data", {"port": PORT, "payload": "AT"})  # timeout policy, 1000 ms, utf8, CR
        assert sent["wait_policy"] == "timeout" and sent["data"] == "OK" and sent["format"] == "text"
        assert trio.current_time() - started == 1.0
        page = await rt.call("get_log", {"port": PORT})  # offset 0, limit 100
        assert page["offset"] == 0 and page["records"][0]["event"] == "session"


async def test_read_urc_takes_from_the_actors_buffer_and_a_peek_needs_no_ownership(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with fake_runtime(tmp_path, "serial") as rt:
        backend = serial.register(rt)
        use(backend, FakeSerial([(0.1, b"u0"), (1.0, b"u1")]))
        rt.connect(Client("mcp:1", 1))
        await rt.call("configure_connection", {"port": PORT})
        await trio.sleep(2)
        peek = await rt.call("read_urc", {"port": PORT, "peek": True}, client="mcp:2")
        assert [p["data"] for p in peek["packets"]] == ["u0", "u1"] and peek["pending_urc_count"] == 2
        with pytest.raises(DiagdError) as info:
            await rt.call("read_urc", {"port": PORT}, client="mcp:2")
        assert info.value.code == ErrorCode.BUSY and info.value.details["owner"] == "mcp:1"
        taken = await rt.call("read_urc", {"port": PORT, "max_packets": 1})
        assert [p["data"] for p in taken["packets"]] == ["u0"] and taken["has_more"]
        assert len(backend.records[PORT].urc) == 1


async def test_the_actor_decides_ownership_and_logs_each_take_over(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with fake_runtime(tmp_path, "serial") as rt:
        backend = serial.register(rt)
        use(backend, FakeSerial())
        rt.connect(Client("mcp:1", 1))
        await rt.call("configure_connection", {"port": PORT})
        with pytest.raises(DiagdError) as info:
            await rt.call("send_data", {"port": PORT, "payload": "x", "wait_policy": "none"}, client="mcp:2")
        assert info.value.code == ErrorCode.BUSY
        forced = await rt.call("configure_connection", {"port": PORT, "force": True}, client="mcp:2")
        assert forced["took_over_from"] == "mcp:1" and forced["you_own"]
        rt.disconnect(Client("mcp:2", 2))
        sent = await rt.call("send_data", {"port": PORT, "payload": "y", "wait_policy": "none"})  # passes silently
        assert sent["bytes_sent"] == 2 and backend.records[PORT].owner == "mcp:1"  # "y\r"
        owners = [(e["owner"], e["previous"], e["forced"]) for e in events(backend) if e["event"] == "owner"]
        assert owners == [("mcp:2", "mcp:1", True), ("mcp:1", "mcp:2", False)]


async def test_closing_goes_through_the_actor_then_stops_it(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with fake_runtime(tmp_path, "serial") as rt:
        backend = serial.register(rt)
        port = FakeSerial([(0.1, b"unread")])
        use(backend, port)
        await rt.call("configure_connection", {"port": PORT})
        await trio.sleep(1)
        closed = await rt.call("configure_connection", {"port": PORT, "action": "close"})
        assert closed["state"] == "Closed" and closed["discarded_urc_packets"] == 1 and port.closed
        await trio.testing.wait_all_tasks_blocked()
        assert rt.find("serial", PORT) is None and not backend.records
        page = await rt.call("get_log", {"port": PORT})  # the last session's log, closed
        assert not page["live"] and page["records"][-1]["event"] == "closed"
