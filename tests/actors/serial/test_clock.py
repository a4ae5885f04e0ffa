"""Serial timers and slicing on MockClock(autojump_threshold=0) with a scripted fake port.

The whole tool path runs in-process (registry -> handler -> supervisor -> actor); only the port
is fake, so every assertion on time is exact virtual time. `Harness` and `FakeSerial` are also
used by the pty tests.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
import trio.testing

from diagd.actors import serial
from diagd.actors.runtime import Client
from diagd.actors.serial.backend import SerialBackend
from diagd.actors.serial.port import PortGone, PortIO
from diagd.actors.serial.rawlog import session_logs
from diagd.actors.serial.record import PortRecord
from diagd.actors.serial.settings import PortSettings, port_slug
from diagd.actors.tooling import CallContext
from diagd.daemon import config as config_mod
from diagd.daemon.server.server import Daemon

Script = Sequence[tuple[float, bytes | None]]

PORT = "/dev/ttyFAKE0"


class FakeSerial:
    """A scripted port on the Trio clock.

    `script`: (delay after the previous item, bytes) from the moment the port is opened; `None`
    instead of bytes hangs up. `replies`: a written payload -> items scheduled after the write.
    """

    def __init__(self, script: Script = (), replies: dict[bytes, Script] | None = None, *,
                 stall_writes: bool = False, has_lines: bool = True) -> None:
        self.script = list(script)
        self.replies = replies or {}
        self.stall_writes = stall_writes
        self.has_lines = has_lines
        self.writes: list[tuple[float, bytes]] = []
        self.breaks: list[tuple[float, bool]] = []
        self.lines: list[tuple[bool | None, bool | None]] = []
        self.applied: list[PortSettings] = []
        self.closed = False
        self.opened_with: tuple[str, PortSettings, dict[str, bool]] | None = None
        self._heap: list[tuple[float, int, bytes | None]] = []
        self._seq = itertools.count()
        self._changed = trio.Event()

    def bind(self, device: str, settings: PortSettings, lines: dict[str, bool]) -> None:
        self.opened_with = (device, settings, dict(lines))
        self._schedule(self.script)

    def _schedule(self, items: Script) -> None:
        due = trio.current_time()
        for delay, data in items:
            due += delay
            heapq.heappush(self._heap, (due, next(self._seq), data))
        self._changed.set()

    async def receive(self) -> bytes:
        while True:
            await trio.lowlevel.checkpoint()  # honour a deadline before taking anything
            if self.closed:
                raise PortGone("closed")
            if self._heap and self._heap[0][0] <= trio.current_time():
                _, _, data = heapq.heappop(self._heap)
                if data is None:
                    raise PortGone("scripted hang-up")
                return data
            self._changed = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._changed.wait()

    async def write_some(self, data: memoryview) -> int:
        if self.stall_writes:
            await trio.sleep_forever()
        payload = bytes(data)
        self.writes.append((trio.current_time(), payload))
        self._schedule(self.replies.get(payload, ()))
        return len(payload)

    def apply(self, settings: PortSettings) -> None:
        self.applied.append(settings)

    def set_lines(self, dtr: bool | None, rts: bool | None) -> None:
        if not self.has_lines:
            raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")
        self.lines.append((dtr, rts))

    def set_break(self, on: bool) -> None:
        self.breaks.append((trio.current_time(), on))

    def modem_lines(self) -> dict[str, bool] | None:
        return {"cts": True, "dsr": True, "ri": False, "cd": True} if self.has_lines else None

    def close(self) -> None:
        self.closed = True
        self._changed.set()


async def inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


@dataclass
class Harness:
    """A real `Daemon` object in the test's Trio run, with only the serial back end loaded."""

    daemon: Daemon
    backend: SerialBackend
    client: str = "mcp:100"
    ports: list[FakeSerial] = field(default_factory=list)

    async def call(self, tool: str, *, client: str | None = None, **args: Any) -> dict[str, Any]:
        result = await self.daemon.registry.call(tool, args, CallContext(client=client or self.client))
        assert not result.is_error, result.payload
        schema = self.daemon.registry.get(tool).output_schema
        assert schema is not None
        jsonschema.validate(result.payload, schema)  # what the MCP SDK client checks
        assert json.loads(result.text) == result.payload
        return result.payload

    async def error(self, tool: str, *, client: str | None = None, **args: Any) -> dict[str, Any]:
        result = await self.daemon.registry.call(tool, args, CallContext(client=client or self.client))
        assert result.is_error, result.payload
        return result.payload

    def connect(self, client: str) -> None:
        """Make `client` (kind:pid) look connected, as the daemon tells back ends."""
        _kind, _, pid = client.partition(":")
        self.daemon.clients.connected(Client(client, int(pid)))

    def disconnect(self, client: str) -> None:
        _kind, _, pid = client.partition(":")
        self.daemon.clients.gone(Client(client, int(pid)))

    def use_fakes(self, *ports: FakeSerial) -> None:
        """Open these scripted ports (in order) instead of real devices; run helpers inline."""
        queue = list(ports)
        self.ports.extend(ports)

        async def opener(device: str, settings: PortSettings, lines: dict[str, bool]) -> PortIO:
            port = queue.pop(0)
            port.bind(device, settings, lines)
            return port

        self.backend.opener = opener
        self.backend.run_blocking = inline

    def record(self, port: str = PORT) -> PortRecord:
        return self.backend.records[port]


MakeHarness = Callable[..., Harness]


@contextmanager
def harnesses(nursery: trio.Nursery, tmp_path: Path) -> Iterator[MakeHarness]:
    """Yields `make(**serial_config)`: a harness whose [serial] table is `serial_config`."""
    made: list[Harness] = []

    def make(**serial_config: Any) -> Harness:
        cfg = config_mod.parse({"daemon": {"idle_timeout_s": 600}, "serial": serial_config})
        state = tmp_path / f"state{len(made)}"
        daemon = Daemon(cfg, nursery, runtime_dir=tmp_path, state_dir=state)
        made.append(Harness(daemon, serial.register(daemon.runtime("serial"))))
        return made[-1]

    try:
        yield make
    finally:
        for h in made:
            h.daemon.audit.close()


@pytest.fixture
def make_harness(nursery: trio.Nursery, tmp_path: Path) -> Iterator[MakeHarness]:
    with harnesses(nursery, tmp_path) as make:
        yield make


@pytest.fixture
def harness(make_harness: MakeHarness) -> Harness:
    return make_harness()


async def open_fake(h: Harness, port: FakeSerial, **settings: Any) -> float:
    h.use_fakes(port)
    await h.call("configure_connection", port=PORT, **settings)
    return trio.current_time()


def log_records(h: Harness, port: str = PORT) -> list[dict[str, Any]]:
    path = h.record(port).log_path
    assert path is not None
    return [json.loads(line) for line in path.read_text().splitlines()]


# -- the idle slicer --------------------------------------------------------------------------


async def test_a_packet_ends_exactly_one_idle_gap_after_its_last_byte(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial([(0.5, b"+CMTI: 1"), (0.03, b"\r\n"), (1.0, b"RING\r\n")]),
                         idle_ms=50)
    urc = harness.record().urc
    await trio.sleep_until(t0 + 0.58 - 1e-6)
    assert len(urc) == 0  # 30 ms after the first read the packet is still open
    await trio.sleep_until(t0 + 0.58 + 1e-6)
    assert len(urc) == 1
    await trio.sleep_until(t0 + 1.58 + 1e-6)
    packets, _ = urc.take(10, 1 << 20)
    assert [p.data for p in packets] == [b"+CMTI: 1\r\n", b"RING\r\n"]
    assert packets[0].t_first == pytest.approx(t0 + 0.5, abs=1e-9)
    assert packets[0].t_last == pytest.approx(t0 + 0.53, abs=1e-9)
    assert packets[1].t_first == pytest.approx(t0 + 1.53, abs=1e-9)


async def test_a_gap_of_exactly_idle_ms_splits_and_a_shorter_one_does_not(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial([(0.0, b"a"), (0.1, b"b"), (0.0999, b"c"), (0.5, b"d")]), idle_ms=100)
    await trio.sleep(2)
    packets = (await harness.call("read_urc", port=PORT))["packets"]
    assert [p["data"] for p in packets] == ["a", "bc", "d"]


async def test_the_idle_time_can_be_changed_on_an_open_port(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial([(1.0, b"a"), (0.2, b"b"), (1.0, b"c"), (0.2, b"d")]), idle_ms=100)
    await trio.sleep(1.5)
    changed = await harness.call("configure_connection", port=PORT, idle_ms=300)
    assert changed["outcome"] == "reconfigured" and changed["settings"]["idle_ms"] == 300
    await trio.sleep(2)
    packets = (await harness.call("read_urc", port=PORT))["packets"]
    assert [p["data"] for p in packets] == ["a", "b", "cd"]


async def test_a_continuous_stream_is_cut_at_max_reply_bytes(
        autojump_clock: trio.testing.MockClock, make_harness: MakeHarness) -> None:
    h = make_harness(max_reply_bytes=8)
    await open_fake(h, FakeSerial([(0.01, b"0123456789")] * 2))
    await trio.sleep(1)
    packets = (await h.call("read_urc", port=PORT))["packets"]
    assert [(p["data"], p["split"]) for p in packets] == [
        ("01234567", True), ("89012345", True), ("6789", False)]


# -- wait policies ----------------------------------------------------------------------------


async def test_keyword_returns_the_moment_the_pattern_arrives(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    port = FakeSerial(replies={b"AT+CSQ\r": [(0.2, b"\r\n+CSQ: 23,99\r\n"), (0.3, b"\r\nOK\r\n")]})
    t0 = await open_fake(harness, port, line_ending="cr")
    result = await harness.call("send_data", port=PORT, payload="AT+CSQ", stop_pattern=["OK\r\n", "ERROR\r\n"],
                                timeout_ms=5000)
    assert trio.current_time() - t0 == pytest.approx(0.5, abs=1e-9)
    assert result["elapsed_ms"] == 500.0
    assert result["data"] == "\r\n+CSQ: 23,99\r\n\r\nOK\r\n" and result["format"] == "text"
    assert result["found_keyword"] and result["stop_pattern_matched"] == "OK\r\n"
    assert not result["timed_out"] and not result["truncated"] and result["bytes_sent"] == 7
    assert port.writes == [(pytest.approx(t0), b"AT+CSQ\r")]


async def test_keyword_matches_a_pattern_split_over_two_reads(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial(replies={b"AT\r\n": [(0.1, b"\r\nO"), (0.2, b"K\r\n")]}))
    result = await harness.call("send_data", port=PORT, payload="AT", line_ending="crlf", stop_pattern="OK")
    assert result["elapsed_ms"] == 300.0 and result["data"] == "\r\nOK\r\n"


async def test_keyword_timeout_returns_what_arrived_and_marks_it(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial(replies={b"AT+COPS=?\r": [(0.4, b"\r\n+COPS: (2,")]}))  # CR: the default
    result = await harness.call("send_data", port=PORT, payload="AT+COPS=?", stop_pattern="OK", timeout_ms=1500)
    assert result["elapsed_ms"] == 1500.0
    assert result["timed_out"] and not result["found_keyword"] and result["data"] == "\r\n+COPS: (2,"
    assert result["success"] is False
    assert result["reason"] == "no stop_pattern ('OK') came within 1500 ms; 12 bytes came (in data)"
    assert harness.record().urc.bytes == 0  # the partial reply was returned, not turned into a URC


async def test_timeout_waits_the_whole_time_and_returns_everything(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    replies = {b"\x01\x03": [(0.05, b"\x01\x03\x02"), (0.1, b"\x00\xff")]}
    await open_fake(harness, FakeSerial(replies=replies))
    result = await harness.call("send_data", port=PORT, payload="0103", encoding="hex", wait_policy="timeout",
                                timeout_ms=400)
    assert result["elapsed_ms"] == 400.0 and not result["timed_out"]
    assert result["data"] == "01 03 02 00 FF" and result["is_hex"] and result["bytes_received"] == 5


async def test_none_returns_at_once_and_the_reply_becomes_a_urc_after_the_idle_gap(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial(replies={b"AT+CFUN=1\r": [(0.5, b"\r\nOK\r\n")]}), line_ending="cr")
    result = await harness.call("send_data", port=PORT, payload="AT+CFUN=1", wait_policy="none")
    assert result["elapsed_ms"] == 0.0 and result["data"] == "" and result["pending_urc_count"] == 0
    assert trio.current_time() == t0
    await trio.sleep_until(t0 + 0.55 + 1e-6)
    urc = await harness.call("read_urc", port=PORT)
    assert [p["data"] for p in urc["packets"]] == ["\r\nOK\r\n"]


async def test_default_policy_is_keyword_with_a_pattern_and_timeout_without(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial(replies={b"x\r": [(0.1, b"OK")]}))
    assert (await harness.call("send_data", port=PORT, payload="x", stop_pattern="OK"))["wait_policy"] == "keyword"
    plain = await harness.call("send_data", port=PORT, payload="x", timeout_ms=250)
    assert plain["wait_policy"] == "timeout" and plain["elapsed_ms"] == 250.0 and plain["data"] == "OK"


async def test_an_empty_payload_just_listens(autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    port = FakeSerial([(0.7, b"boot: done\r\n")])
    await open_fake(harness, port)
    result = await harness.call("send_data", port=PORT, payload="", stop_pattern="done", timeout_ms=2000)
    assert result["elapsed_ms"] == 700.0 and result["data"] == "boot: done\r\n" and port.writes == []


# -- what belongs to a reply and what is a URC ------------------------------------------------


async def test_a_urc_arriving_during_a_call_is_part_of_its_reply(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial([(0.2, b'\r\n+CMTI: "SM",1\r\n')],
                                             replies={b"AT\r": [(0.3, b"\r\nOK\r\n")]}), line_ending="cr")
    result = await harness.call("send_data", port=PORT, payload="AT", stop_pattern="OK\r\n")
    assert trio.current_time() - t0 == pytest.approx(0.3, abs=1e-9)
    assert result["data"] == '\r\n+CMTI: "SM",1\r\n\r\nOK\r\n' and result["pending_urc_count"] == 0


async def test_bytes_after_the_matched_pattern_become_a_urc(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial(replies={b"AT\r": [(0.1, b'\r\nOK\r\n+CMTI: "SM",2\r\n')]}),
                         line_ending="cr")
    result = await harness.call("send_data", port=PORT, payload="AT", stop_pattern="OK")
    assert result["data"] == "\r\nOK\r\n"
    await trio.sleep_until(t0 + 0.15 + 1e-6)
    urc = await harness.call("read_urc", port=PORT)
    assert [p["data"] for p in urc["packets"]] == ['+CMTI: "SM",2\r\n']


async def test_bytes_received_before_a_call_stay_a_urc(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial([(0.0, b"+CREG: 1")], replies={b"AT\r": [(0.01, b"\r\nOK\r\n")]}),
                         line_ending="cr")
    await trio.sleep(0.02)  # mid-packet: the +CREG packet is still open when the call starts
    result = await harness.call("send_data", port=PORT, payload="AT", stop_pattern="OK")
    assert result["data"] == "\r\nOK\r\n"
    await trio.sleep_until(t0 + 0.05 + 1e-6)
    assert [p["data"] for p in (await harness.call("read_urc", port=PORT))["packets"]] == ["+CREG: 1"]


async def test_a_cancelled_call_leaves_what_it_received_in_the_urc_buffer(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial(replies={b"AT+X\r": [(0.1, b"partial ")]}), line_ending="cr")
    with trio.move_on_after(0.3):
        await harness.daemon.registry.call("send_data", {"port": PORT, "payload": "AT+X", "stop_pattern": "OK",
                                                         "timeout_ms": 5000}, CallContext(client=harness.client))
    await trio.testing.wait_all_tasks_blocked()  # the actor sees the cancellation
    urc = await harness.call("read_urc", port=PORT)
    assert [p["data"] for p in urc["packets"]] == ["partial "]
    later = await harness.call("send_data", port=PORT, payload="", wait_policy="timeout", timeout_ms=10)
    assert later["data"] == ""  # the next call starts clean


# -- limits -----------------------------------------------------------------------------------


async def test_a_long_reply_is_truncated_but_counted_and_logged_whole(
        autojump_clock: trio.testing.MockClock, make_harness: MakeHarness) -> None:
    h = make_harness(max_reply_bytes=16)
    body = b"".join(b"line %02d\r\n" % i for i in range(10)) + b"OK\r\n"
    await open_fake(h, FakeSerial(replies={b"dump\r": [(0.1, body[:50]), (0.1, body[50:])]}))
    result = await h.call("send_data", port=PORT, payload="dump", stop_pattern="OK\r\n")
    assert result["truncated"] and result["data"] == body[:16].decode()
    assert result["bytes_received"] == len(body) and result["found_keyword"]
    assert "Output Truncated" in result["note"] and result["log_offset"] == 2
    rx = b"".join(bytes.fromhex(r["hex"]) for r in log_records(h) if r["dir"] == "rx")
    assert rx == body


async def test_urc_overflow_drops_the_oldest_and_reports_how_many(
        autojump_clock: trio.testing.MockClock, make_harness: MakeHarness) -> None:
    h = make_harness(urc_max_packets=3)
    await open_fake(h, FakeSerial([(1.0, b"urc%d" % i) for i in range(5)]))
    await trio.sleep(6)
    status = (await h.call("connection_status", port=PORT))["ports"][0]
    assert status["pending_urc_count"] == 3 and status["urc_dropped"] == 2
    urc = await h.call("read_urc", port=PORT)
    assert [p["data"] for p in urc["packets"]] == ["urc2", "urc3", "urc4"]
    assert urc["dropped"] == 2 and urc["dropped_total"] == 2
    assert (await h.call("read_urc", port=PORT))["dropped"] == 0  # reported once, then reset


async def test_read_urc_peeks_and_pages(autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial([(1.0, b"u%d" % i) for i in range(4)]))
    await trio.sleep(5)
    peek = await harness.call("read_urc", port=PORT, peek=True, max_packets=2)
    # A peek consumes nothing: all four are still pending, two of them past this page.
    assert [p["data"] for p in peek["packets"]] == ["u0", "u1"] and peek["pending_urc_count"] == 4
    assert peek["has_more"]
    first = await harness.call("read_urc", port=PORT, max_packets=3)
    assert first["returned"] == 3 and first["pending_urc_count"] == 1 and first["has_more"]
    assert first["packets"][0]["ts"] < first["packets"][1]["ts"]


async def test_a_stalled_write_fails_after_write_timeout_ms(
        autojump_clock: trio.testing.MockClock, make_harness: MakeHarness) -> None:
    h = make_harness(write_timeout_ms=750)
    t0 = await open_fake(h, FakeSerial(stall_writes=True), rtscts=True)
    err = await h.error("send_data", port=PORT, payload="AT", stop_pattern="OK")
    assert err["code"] == "TIMEOUT" and "stalled" in err["message"] and err["details"]["bytes_written"] == 0
    assert trio.current_time() - t0 == pytest.approx(0.75, abs=1e-9)


# -- lines, disconnects, lifetime -------------------------------------------------------------


async def test_a_break_is_held_for_exactly_break_ms(autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    port = FakeSerial()
    t0 = await open_fake(harness, port)
    result = await harness.call("set_signals", port=PORT, dtr=False, rts=True, break_ms=250)
    assert result["dtr"] is False and result["rts"] is True and result["modem_lines"]["cts"] is True
    assert port.lines == [(False, True)]
    assert port.breaks == [(pytest.approx(t0), True), (pytest.approx(t0 + 0.25), False)]
    assert [r["event"] for r in log_records(harness) if r["dir"] == "event"][-1] == "signals"


async def test_dtr_asked_for_at_open_reaches_the_port_before_it_opens(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    port = FakeSerial()
    await open_fake(harness, port, dtr=False, baudrate=921600, parity="E")
    assert port.opened_with is not None
    _, settings, lines = port.opened_with
    assert lines == {"dtr": False} and settings.baudrate == 921600 and settings.parity == "E"


async def test_a_hang_up_mid_call_is_a_clear_error_and_the_port_is_disconnected(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    t0 = await open_fake(harness, FakeSerial(replies={b"AT\r": [(0.1, b"\r\nO"), (0.1, None)]}), line_ending="cr")
    err = await harness.error("send_data", port=PORT, payload="AT", stop_pattern="OK", timeout_ms=5000)
    assert trio.current_time() - t0 == pytest.approx(0.2, abs=1e-9)
    assert err["code"] == "BACKEND_UNAVAILABLE" and err["details"]["state"] == "Disconnected"
    assert "3 reply bytes" in err["message"]
    again = await harness.error("send_data", port=PORT, payload="AT", stop_pattern="OK")
    assert again["code"] == "BACKEND_UNAVAILABLE" and "Disconnected" in again["message"]
    status = (await harness.call("connection_status", port=PORT))["ports"][0]
    assert status["state"] == "Disconnected" and "hang-up" in status["last_error"]
    assert [p["data"] for p in (await harness.call("read_urc", port=PORT))["packets"]] == ["\r\nO"]
    assert log_records(harness)[-2]["event"] == "disconnected"


async def test_a_disconnected_port_reopens_with_a_new_session_log(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    first = FakeSerial([(0.1, None)])
    second = FakeSerial(replies={b"AT\r": [(0.05, b"\r\nOK\r\n")]})
    harness.use_fakes(first, second)
    opened = await harness.call("configure_connection", port=PORT, line_ending="cr")
    await trio.sleep(0.2)
    assert harness.record().state == "Disconnected" and first.closed
    reopened = await harness.call("configure_connection", port=PORT)
    assert reopened["outcome"] == "reopened" and reopened["state"] == "Connected"
    assert reopened["log_file"] != opened["log_file"] and reopened["settings"]["line_ending"] == "cr"
    assert (await harness.call("send_data", port=PORT, payload="AT", stop_pattern="OK"))["found_keyword"]


async def test_an_open_port_never_idles_out_and_keeps_reading(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    await open_fake(harness, FakeSerial([(3000.0, b"+CMTI: late\r\n")]))
    await trio.sleep(3600)  # six daemon idle timeouts
    ref = harness.daemon.supervisor.find("serial", PORT)
    assert ref is not None and ref.statistics()["idle_s_left"] is None
    assert [p["data"] for p in (await harness.call("read_urc", port=PORT))["packets"]] == ["+CMTI: late\r\n"]


async def test_closing_stops_the_actor_and_reports_discarded_urcs(
        autojump_clock: trio.testing.MockClock, harness: Harness) -> None:
    port = FakeSerial([(0.1, b"unread")])
    await open_fake(harness, port)
    await trio.sleep(1)
    closed = await harness.call("configure_connection", port=PORT, action="close")
    assert closed["state"] == "Closed" and closed["discarded_urc_packets"] == 1 and port.closed
    await trio.testing.wait_all_tasks_blocked()
    assert harness.daemon.supervisor.find("serial", PORT) is None
    err = await harness.error("send_data", port=PORT, payload="AT")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["state"] == "Closed"


async def test_old_session_logs_are_pruned_per_port_and_only_that_ports(
        autojump_clock: trio.testing.MockClock, make_harness: MakeHarness) -> None:
    h = make_harness(log_keep=2)
    neighbour = h.backend.log_dir / f"{port_slug(PORT)}-2-20200101T000000000Z.jsonl"  # port "…FAKE0-2"
    neighbour.parent.mkdir(parents=True)
    neighbour.write_text("{}\n")
    for _ in range(4):
        await open_fake(h, FakeSerial())
        await h.call("configure_connection", port=PORT, action="close")
        await trio.sleep(0.01)  # distinct file names
    assert len(session_logs(h.backend.log_dir, PORT)) == 2
    assert neighbour.exists() and session_logs(h.backend.log_dir, PORT + "-2") == [neighbour]
