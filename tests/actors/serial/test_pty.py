"""The serial tools against a simulated AT modem on a real pseudo-terminal (pyserial opens the
slave path like any port); the daemon object runs in-process, on the real clock.

A pty opens only when [serial] allowed_ports names it, so each test names its modems (their links in
tmp_path, resolved to the ptys). The modems run in this process, which is also the daemon's: the
harness's scan of the ptys diagd holds leaves them out (`held_ptys` below), except in the tests of
that rule, which put the real scan back."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import serial as pyserial
import trio

from diagd.actors.serial.access import PtyId, held_ptys, pty_id
from tests.actors.serial.test_clock import Harness, MakeHarness, harnesses
from tests.support.sim_modem import SimModem, binary_frame, flood_bytes

OK_OR_ERROR = ["OK\r\n", "ERROR\r\n"]


def no_ptys_held() -> set[PtyId]:
    """The harness's scan of the ptys diagd holds: none. The daemon object shares this process with
    the simulated modems, whose masters and slaves it would otherwise count as its own."""
    return set()


def modems(tmp_path: Path, *names: str) -> list[str]:
    """[serial] allowed_ports naming the test's modems: their links in tmp_path, which reach their ptys
    (a modem that comes back on the same link is named too; one that is gone is NOT_FOUND, not refused)."""
    return [str(tmp_path / name) for name in names or ("modem", "other")]


@pytest.fixture
def make_harness(nursery: trio.Nursery, tmp_path: Path) -> Iterator[MakeHarness]:
    with harnesses(nursery, tmp_path) as make:
        def make_beside_modems(**serial_config: Any) -> Harness:
            harness = make(**serial_config)
            harness.backend.held_ptys = no_ptys_held
            return harness

        yield make_beside_modems


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimModem]:
    with SimModem(link=tmp_path / "modem") as modem:
        yield modem


@pytest.fixture
async def h(make_harness: MakeHarness, sim: SimModem, tmp_path: Path) -> Harness:
    harness = make_harness(allowed_ports=modems(tmp_path))
    harness.connect(harness.client)
    await harness.call("configure_connection", port=sim.port, line_ending="cr")
    return harness


async def at(h: Harness, sim: SimModem, command: str, **kw: Any) -> dict[str, Any]:
    """send_data with AT defaults; an argument given as None is left out."""
    kw = {"stop_pattern": OK_OR_ERROR, "timeout_ms": 5000, **kw}
    with trio.fail_after(10):
        return await h.call("send_data", port=sim.port, payload=command,
                            **{k: v for k, v in kw.items() if v is not None})


async def urcs_until(h: Harness, sim: SimModem, count: int, needle: str = "+CMTI") -> list[dict[str, Any]]:
    packets: list[dict[str, Any]] = []
    with trio.fail_after(10):
        while sum(p["data"].count(needle) for p in packets) < count:
            packets += (await h.call("read_urc", port=sim.port))["packets"]
            await trio.sleep(0.02)
    return packets


def logged(path: str, direction: str) -> bytes:
    lines = [json.loads(line) for line in Path(path).read_text().splitlines()]
    return b"".join(bytes.fromhex(r["hex"]) for r in lines if r["dir"] == direction)


# -- the AT dialogue --------------------------------------------------------------------------


async def test_at_commands_get_their_answers(h: Harness, sim: SimModem) -> None:
    assert (await at(h, sim, "AT"))["data"] == "\r\nOK\r\n"
    ati = await at(h, sim, "ATI")
    assert "SIMMODEM" in ati["data"] and ati["stop_pattern_matched"] == "OK\r\n"
    assert "+CSQ: 23,99" in (await at(h, sim, "AT+CSQ"))["data"]
    unknown = await at(h, sim, "AT+NOPE")
    assert unknown["data"] == "\r\nERROR\r\n" and unknown["stop_pattern_matched"] == "ERROR\r\n"
    assert sim.commands == ["AT", "ATI", "AT+CSQ", "AT+NOPE"]


async def test_an_sms_goes_through_the_prompt(h: Harness, sim: SimModem) -> None:
    prompt = await at(h, sim, 'AT+CMGS="+4912345"', stop_pattern="> ")
    assert prompt["data"] == "\r\n> " and prompt["found_keyword"]
    sent = await at(h, sim, "hello from diagd\x1a", line_ending="none")
    assert "+CMGS: 1" in sent["data"] and sent["stop_pattern_matched"] == "OK\r\n"
    assert sim.messages == [b"hello from diagd"]


async def test_keyword_timeout_on_a_silent_modem(h: Harness, sim: SimModem) -> None:
    result = await at(h, sim, "AT+SIMSILENT", timeout_ms=150)
    assert result["timed_out"] and result["data"] == "" and result["elapsed_ms"] >= 150


async def test_timeout_policy_collects_the_answer_and_the_urcs_inside_its_window(h: Harness, sim: SimModem) -> None:
    result = await at(h, sim, "AT+SIMURC=2,40", wait_policy="timeout", stop_pattern=None, timeout_ms=600)
    assert result["data"].startswith("\r\nOK\r\n") and result["data"].count("+CMTI") == 2
    assert result["pending_urc_count"] == 0


async def test_urcs_between_calls_wait_in_the_buffer_as_separate_packets(h: Harness, sim: SimModem) -> None:
    # 400 ms between URCs: far above the idle slice (50 ms) even when the suite's load wakes the reader late
    # (at 150 ms a loaded 2-core run once read two URCs as one packet).
    sent = await at(h, sim, "AT+SIMURC=3,400", wait_policy="none", stop_pattern=None)
    assert sent["data"] == "" and sent["bytes_received"] == 0
    packets = await urcs_until(h, sim, 3)
    assert [p["data"] for p in packets] == ["\r\nOK\r\n"] + [f'\r\n+CMTI: "SM",{k}\r\n' for k in (1, 2, 3)]
    assert [p["ts"] for p in packets] == sorted(p["ts"] for p in packets)


async def test_urcs_on_a_timer_are_kept_while_nobody_asks(make_harness: MakeHarness, tmp_path: Path) -> None:
    h = make_harness(allowed_ports=modems(tmp_path, "beeper"))
    with SimModem(link=tmp_path / "beeper", urc_interval=0.1) as beeper:
        await h.call("configure_connection", port=beeper.port)
        packets = await urcs_until(h, beeper, 3)
        peek = await h.call("read_urc", port=beeper.port, peek=True)
        assert all(p["data"].startswith('\r\n+CMTI: "SM",') for p in packets + peek["packets"])
        numbers = [int(p["data"].rsplit(",", 1)[1]) for p in packets]
        assert numbers == list(range(1, len(numbers) + 1))  # none missed, none twice


async def test_urcs_during_a_call_are_in_its_reply_not_in_the_buffer(h: Harness, sim: SimModem) -> None:
    sim.emit(b'\r\n+CMTI: "SM",9\r\n', delay=0.05)
    result = await at(h, sim, "AT+SIMDELAY=200")
    assert '+CMTI: "SM",9' in result["data"] and result["data"].endswith("OK\r\n")
    assert (await h.call("read_urc", port=sim.port))["packets"] == []


# -- bytes: hex, truncation, the log ----------------------------------------------------------


async def test_hex_round_trip_with_zero_and_ff_bytes(h: Harness, sim: SimModem) -> None:
    result = await at(h, sim, "7E 00 01 FF 7E", encoding="hex", stop_pattern="FF 00 7E")
    assert result["data"] == "7E 00 FF 00 01 FF FF 00 7E" and result["format"] == "hex" and result["is_hex"]
    assert bytes(sim.received).endswith(b"\x7e\x00\x01\xff\x7e")
    frame = await at(h, sim, "AT+SIMBIN=300", stop_pattern="FF 00 7E", stop_pattern_encoding="hex")
    assert frame["found_keyword"] and not frame["timed_out"]
    assert bytes.fromhex(frame["data"]) == binary_frame(bytes(i % 256 for i in range(300)))


async def test_text_that_happens_to_be_sent_can_be_read_back_as_hex(h: Harness, sim: SimModem) -> None:
    assert (await at(h, sim, "AT", as_hex=True))["data"] == "0D 0A 4F 4B 0D 0A"


@pytest.mark.parametrize(("payload", "position"), [("7E 0", 3), ("7E GG", 3), ("0x7E", 1)])
async def test_bad_hex_is_refused_with_its_position_and_nothing_is_written(
        h: Harness, sim: SimModem, payload: str, position: int) -> None:
    before = bytes(sim.received)
    err = await h.error("send_data", port=sim.port, payload=payload, encoding="hex")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["position"] == position
    bad_pattern = await h.error("send_data", port=sim.port, payload="7E", encoding="hex", stop_pattern="F")
    assert bad_pattern["details"]["argument"] == "stop_pattern"
    await trio.sleep(0.05)
    assert bytes(sim.received) == before


async def test_a_flood_is_truncated_in_the_reply_and_complete_in_the_log(h: Harness, sim: SimModem) -> None:
    result = await at(h, sim, "AT+SIMFLOOD=20000", stop_pattern="OK\r\n")
    expected = flood_bytes(20000) + b"\r\nOK\r\n"
    assert result["truncated"] and "Output Truncated" in result["note"]
    assert result["data"].encode() == expected[:4096] and result["bytes_received"] == len(expected)
    rx = b""
    offset: int | None = result["log_offset"]
    with trio.fail_after(10):
        while offset is not None:
            page = await h.call("get_log", port=sim.port, offset=offset, limit=50, as_hex=True)
            rx += b"".join(bytes.fromhex(r["data"]) for r in page["records"] if r["dir"] == "rx")
            offset = page["next_offset"]
    assert rx == expected


async def test_the_raw_log_has_every_byte_both_ways(h: Harness, sim: SimModem) -> None:
    await at(h, sim, "AT+CSQ")
    await at(h, sim, "7E 00 FF 7E", encoding="hex", stop_pattern="FF 00 7E")
    await at(h, sim, "AT+SIMURC=1,10", wait_policy="none", stop_pattern=None)
    await urcs_until(h, sim, 1)
    path = (await h.call("connection_status", port=sim.port))["ports"][0]["log_file"]
    assert logged(path, "tx") == bytes(sim.received)
    assert logged(path, "rx") == bytes(sim.sent)


async def test_a_flood_nobody_reads_overflows_the_buffer_visibly_and_the_log_keeps_it(
        make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(urc_max_packets=4, max_reply_bytes=512, idle_ms=20, allowed_ports=[sim.port])
    await h.call("configure_connection", port=sim.port, line_ending="cr")
    await h.call("send_data", port=sim.port, payload="AT+SIMFLOOD=30000", wait_policy="none")
    path = (await h.call("connection_status", port=sim.port))["ports"][0]["log_file"]
    with trio.fail_after(10):
        while len(logged(path, "rx")) < 30006:
            await trio.sleep(0.02)
    urc = await h.call("read_urc", port=sim.port, max_packets=100)
    assert urc["dropped"] > 0 and urc["returned"] <= 4
    assert logged(path, "rx") == flood_bytes(30000) + b"\r\nOK\r\n"


# -- the device going away --------------------------------------------------------------------


async def test_a_device_that_disappears_is_disconnected_and_reopens_when_back(
        h: Harness, sim: SimModem, tmp_path: Path) -> None:
    await at(h, sim, "AT")
    old_log = (await h.call("connection_status", port=sim.port))["ports"][0]["log_file"]
    sim.close()
    with trio.fail_after(10):
        while (await h.call("connection_status", port=sim.port))["ports"][0]["state"] != "Disconnected":
            await trio.sleep(0.01)
    err = await h.error("send_data", port=sim.port, payload="AT", stop_pattern="OK")
    assert err["code"] == "BACKEND_UNAVAILABLE" and err["details"]["state"] == "Disconnected"
    assert "configure_connection" in err["details"]["hint"]
    gone = await h.error("configure_connection", port=sim.port)
    assert gone["code"] == "NOT_FOUND"  # not back yet: the link is gone, like a by-id link
    with SimModem(link=tmp_path / "modem") as back:
        reopened = await h.call("configure_connection", port=back.port)
        assert reopened["outcome"] == "reopened" and reopened["log_file"] != old_log
        assert reopened["settings"]["line_ending"] == "cr"
        assert (await at(h, back, "AT"))["data"] == "\r\nOK\r\n"
        page = await h.call("get_log", port=back.port)
        assert page["live"] and page["log_file"] == reopened["log_file"]
    events = [json.loads(line).get("event") for line in Path(old_log).read_text().splitlines()]
    assert events[-2:] == ["disconnected", "closed"]


async def test_closing_and_reopening_at_once_does_not_trip_over_our_own_lock(h: Harness, sim: SimModem) -> None:
    for _ in range(3):
        closed = await h.call("configure_connection", port=sim.port, action="close")
        assert closed["state"] == "Closed"
        reopened = await h.call("configure_connection", port=sim.port, line_ending="cr")
        assert reopened["outcome"] == "opened"  # a fresh session: close forgets the settings
        assert (await at(h, sim, "AT"))["found_keyword"]
    page = await h.call("get_log", port=sim.port)
    assert page["live"] and page["records"][0]["event"] == "session"


async def test_the_last_session_log_is_readable_after_close(h: Harness, sim: SimModem) -> None:
    await at(h, sim, "ATI")
    await h.call("configure_connection", port=sim.port, action="close")
    page = await h.call("get_log", port=sim.port, limit=1000)
    assert not page["live"] and page["records"][-1]["event"] == "closed"
    assert any(r["dir"] == "tx" and r["data"] == "ATI\r" for r in page["records"])


async def test_stopping_the_actor_by_hand_closes_the_port(h: Harness, sim: SimModem) -> None:
    ref = h.daemon.supervisor.find("serial", sim.port)
    assert ref is not None
    h.daemon.supervisor.stop(ref.id, reason="operator")
    await trio.testing.wait_all_tasks_blocked()
    err = await h.error("send_data", port=sim.port, payload="AT")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["state"] == "Closed"
    await h.call("configure_connection", port=sim.port)  # the lock was released


# -- ownership and contention -----------------------------------------------------------------


async def test_a_second_connected_client_is_refused_until_it_forces_a_take_over(h: Harness, sim: SimModem) -> None:
    other = "mcp:200"
    h.connect(other)
    busy = await h.error("send_data", client=other, port=sim.port, payload="AT", stop_pattern="OK")
    assert busy["code"] == "BUSY" and busy["details"]["owner"] == h.client and "force" in busy["details"]["hint"]
    reopen = await h.error("configure_connection", client=other, port=sim.port)
    assert reopen["code"] == "BUSY"
    seen = (await h.call("connection_status", client=other, port=sim.port))["ports"][0]
    assert seen["state"] == "Occupied" and not seen["you_own"]
    assert (await h.call("connection_status", port=sim.port))["ports"][0]["state"] == "Connected"
    assert (await h.call("read_urc", client=other, port=sim.port, peek=True))["returned"] == 0  # peeking is fine
    taken = await h.call("configure_connection", client=other, port=sim.port, force=True)
    assert taken["took_over_from"] == h.client and taken["owner"] == other and taken["outcome"] == "reconfigured"
    assert (await h.error("send_data", port=sim.port, payload="AT"))["code"] == "BUSY"
    assert (await h.call("send_data", client=other, port=sim.port, payload="AT", stop_pattern="OK"))["found_keyword"]


async def test_a_port_whose_owner_went_away_passes_to_the_next_client(h: Harness, sim: SimModem) -> None:
    h.disconnect(h.client)  # e.g. one `diagd call` after another
    result = await h.call("send_data", client="cli:301", port=sim.port, payload="AT", stop_pattern="OK")
    assert result["found_keyword"]
    assert (await h.call("connection_status", port=sim.port))["ports"][0]["owner"] == "cli:301"


async def test_a_port_locked_by_another_program_is_occupied(make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(allowed_ports=[sim.port])
    with pyserial.Serial(sim.path, exclusive=True):
        err = await h.error("configure_connection", port=sim.port)
        assert err["code"] == "BUSY" and err["details"]["state"] == "Occupied"
        assert os.getpid() in [p["pid"] for p in err["details"]["holders"]]
        status = (await h.call("connection_status", port=sim.port))["ports"][0]
        assert status["state"] == "Occupied" and status["holders"]
    assert (await h.call("configure_connection", port=sim.port))["state"] == "Connected"


async def test_two_names_of_one_device_share_one_session(h: Harness, sim: SimModem) -> None:
    again = await h.call("configure_connection", port=sim.path)
    assert again["port"] == sim.port and again["outcome"] == "reconfigured"
    assert (await h.call("send_data", port=sim.path, payload="AT", stop_pattern="OK"))["port"] == sim.port


# -- refusals ---------------------------------------------------------------------------------


async def test_unknown_unopened_and_unsuitable_ports_are_coded_errors(
        make_harness: MakeHarness, sim: SimModem, tmp_path: Path) -> None:
    h = make_harness()
    missing = await h.error("configure_connection", port="/dev/ttyNOPE9")
    assert missing["code"] == "NOT_FOUND" and "list_ports" in missing["details"]["hint"]
    assert (await h.error("connection_status", port="ttyNOPE9"))["code"] == "NOT_FOUND"
    not_open = await h.error("send_data", port=sim.port, payload="AT")
    assert not_open["code"] == "INVALID_ARGUMENT" and "configure_connection" in not_open["details"]["hint"]
    assert (await h.error("read_urc", port=sim.port))["code"] == "INVALID_ARGUMENT"
    plain = tmp_path / "notatty"
    plain.write_text("x")
    assert (await h.error("configure_connection", port=str(plain)))["code"] == "INVALID_ARGUMENT"
    bad = await h.error("configure_connection", port=sim.port, baudrate=0)
    assert bad["code"] == "INVALID_ARGUMENT" and bad["details"]["path"] == "$.baudrate"
    assert (await h.error("configure_connection", port=sim.port, parity="X"))["code"] == "INVALID_ARGUMENT"
    assert (await h.error("get_log", port="/dev/ttyNOPE9"))["code"] == "NOT_FOUND"


async def test_arguments_that_contradict_each_other_are_refused(h: Harness, sim: SimModem) -> None:
    for args in ({"wait_policy": "keyword"}, {"wait_policy": "timeout", "stop_pattern": "OK"},
                 {"encoding": "hex", "payload": "41", "line_ending": "cr"}, {"stop_pattern": ""}):
        err = await h.error("send_data", **{"port": sim.port, "payload": "AT", **args})
        assert err["code"] == "INVALID_ARGUMENT", args
    assert (await h.error("set_signals", port=sim.port))["code"] == "INVALID_ARGUMENT"


async def test_ports_outside_the_allow_list_are_refused(make_harness: MakeHarness, sim: SimModem,
                                                        tmp_path: Path) -> None:
    h = make_harness(allowed_ports=[str(tmp_path / "allowed*")])
    err = await h.error("configure_connection", port=sim.port)
    assert err["code"] == "PERMISSION_DENIED" and err["details"]["device"] == sim.path
    os.symlink(sim.path, tmp_path / "allowed0")
    assert (await h.call("configure_connection", port=str(tmp_path / "allowed0")))["state"] == "Connected"


async def test_a_pty_opens_only_when_allowed_ports_names_it(make_harness: MakeHarness, sim: SimModem,
                                                            tmp_path: Path) -> None:
    shipped = make_harness()  # allowed_ports = []: any serial line, no pty
    disguised = tmp_path / "ttyUSB0"  # a link is judged by the pty it reaches, not by its name
    disguised.symlink_to(sim.path)
    for port in (sim.path, sim.port, str(disguised)):
        err = await shipped.error("configure_connection", port=port)
        assert err["code"] == "PERMISSION_DENIED" and err["details"]["reason"] == "pty_not_allowed", err
        assert err["details"]["device"] == sim.path and "[serial] allowed_ports" in err["details"]["hint"]
        assert "pseudo-terminal" in err["message"] and "Traceback" not in json.dumps(err)
    assert not shipped.backend.records and not list(shipped.backend.log_dir.glob("*.jsonl"))  # nothing opened
    listed = await make_harness(allowed_ports=["/dev/pts/*"]).call("list_ports")
    assert next(p for p in listed["ports"] if p["port"] == sim.path)["allowed"]
    for port in (sim.path, str(disguised)):
        named = make_harness(allowed_ports=["/dev/pts/*"])  # a glob naming the pty itself
        opened = await named.call("configure_connection", port=port, line_ending="cr")
        assert opened["state"] == "Connected" and opened["device"] == sim.path
        assert (await named.call("send_data", port=port, payload="AT", stop_pattern=OK_OR_ERROR))["found_keyword"]
        await named.call("configure_connection", port=port, action="close")


async def test_a_pty_diagd_itself_holds_is_refused_even_when_allowed_ports_names_every_pty(
        make_harness: MakeHarness, sim: SimModem, tmp_path: Path) -> None:
    h = make_harness(allowed_ports=["/dev/pts/*", *modems(tmp_path)])
    h.backend.held_ptys = held_ptys  # the real scan: this process, the daemon here, holds the modem's pty
    for port in (sim.path, sim.port):
        err = await h.error("configure_connection", port=port)
        assert err["code"] == "PERMISSION_DENIED" and err["details"]["reason"] == "daemon_pty", err
        assert err["details"]["device"] == sim.path and "diagd itself holds" in err["message"]
        assert "Traceback" not in json.dumps(err)
    assert not h.backend.records
    listed = (await h.call("list_ports"))["ports"]
    assert not next(p for p in listed if p["port"] == sim.port)["allowed"]  # listed as configure_connection judges


async def test_a_pty_port_diagd_holds_because_it_is_open_can_be_configured_again(
        make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(allowed_ports=[sim.port])
    h.backend.held_ptys = lambda: {pty_id(os.stat(sim.path))} if h.backend.records else set()  # held while open
    await h.call("configure_connection", port=sim.port)
    again = await h.call("configure_connection", port=sim.port, baudrate=9600)
    assert again["outcome"] == "reconfigured" and again["settings"]["baudrate"] == 9600
    assert (await h.call("configure_connection", port=sim.path))["outcome"] == "reconfigured"  # its other name too
    await h.call("configure_connection", port=sim.port, action="close")
    assert (await h.call("configure_connection", port=sim.port))["outcome"] == "opened"


async def test_a_bad_serial_config_table_is_a_coded_error_at_open(make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(max_reply=5)
    err = await h.error("configure_connection", port=sim.port)
    assert err["code"] == "INVALID_ARGUMENT" and "max_reply" in err["message"]


async def test_line_control_on_a_pty_is_a_clear_unsupported_error(h: Harness, sim: SimModem) -> None:
    err = await h.error("set_signals", port=sim.port, dtr=False)
    assert err["code"] == "BACKEND_UNAVAILABLE" and err["details"]["errno"] == "ENOTTY"
    assert (await at(h, sim, "AT"))["found_keyword"]  # the port is fine afterwards


# -- discovery --------------------------------------------------------------------------------


async def test_list_ports_shows_configured_ports_and_hot_plug_changes(make_harness: MakeHarness,
                                                                      tmp_path: Path) -> None:
    h = make_harness(allowed_ports=[str(tmp_path / "dev*")])
    first = await h.call("list_ports")
    assert first["first_call"] and first["added"] == []
    assert not any(p["port"].startswith(str(tmp_path)) for p in first["ports"])
    assert all(not p["allowed"] for p in first["ports"])  # e.g. /dev/ttyS0: not in the allow-list
    with SimModem(link=tmp_path / "dev0") as plugged:
        listed = await h.call("list_ports")
        assert listed["added"] == [plugged.port] and not listed["first_call"]
        entry = next(p for p in listed["ports"] if p["port"] == plugged.port)
        assert entry["allowed"] and entry["state"] == "Closed" and entry["label"].startswith(plugged.port + " - ")
        await h.call("configure_connection", port=plugged.port)
        assert next(p for p in (await h.call("list_ports"))["ports"] if p["port"] == plugged.port)["state"] == \
            "Connected"
        await h.call("configure_connection", port=plugged.port, action="close")
    unplugged = await h.call("list_ports")
    assert unplugged["removed"] == [str(tmp_path / "dev0")] and unplugged["added"] == []


async def test_a_new_device_reusing_a_vanished_ports_device_name_is_not_taken_for_it(
        h: Harness, sim: SimModem, tmp_path: Path) -> None:
    sim.close()
    with trio.fail_after(10):
        while (await h.call("connection_status", port=sim.port))["ports"][0]["state"] != "Disconnected":
            await trio.sleep(0.01)
    with SimModem(link=tmp_path / "other") as other:  # the kernel may hand out the same /dev/pts/N
        opened = await h.call("configure_connection", port=other.port)
        assert opened["port"] == other.port and opened["outcome"] == "opened"


# -- what a call says it did is what happened ---------------------------------------------------


def tx_records(path: str) -> list[bytes]:
    return [bytes.fromhex(r["hex"]) for r in map(json.loads, Path(path).read_text().splitlines())
            if r["dir"] == "tx"]


async def test_an_empty_payload_writes_nothing_not_even_the_line_ending(h: Harness, sim: SimModem) -> None:
    sim.emit(b"\r\nRDY\r\n", delay=0.05)
    listened = await at(h, sim, "", stop_pattern="RDY\r\n")  # the port's line_ending is cr
    assert listened["found_keyword"] and listened["data"] == "\r\nRDY\r\n" and listened["bytes_sent"] == 0
    quiet = await at(h, sim, "", wait_policy="none", stop_pattern=None)
    assert quiet["bytes_sent"] == 0
    # The modem reads in order: had either call written a CR, it would be in front of this AT.
    assert (await at(h, sim, "AT"))["found_keyword"]
    assert bytes(sim.received) == b"AT\r"
    path = (await h.call("connection_status", port=sim.port))["ports"][0]["log_file"]
    assert tx_records(path) == [b"AT\r"]
    # Only the line ending, asked for explicitly with nothing to end, is a contradiction: say so.
    err = await h.error("send_data", port=sim.port, payload="", line_ending="crlf")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == "line_ending"
    assert bytes(sim.received) == b"AT\r"


async def test_peeking_leaves_the_packets_pending_and_says_so(h: Harness, sim: SimModem) -> None:
    await at(h, sim, "AT+SIMURC=2,400", wait_policy="none", stop_pattern=None)  # gaps far above the idle slice
    with trio.fail_after(10):  # the OK and both URCs, each its own packet
        while (await h.call("connection_status", port=sim.port))["ports"][0]["pending_urc_count"] < 3:
            await trio.sleep(0.02)
    peek = await h.call("read_urc", port=sim.port, peek=True)
    assert peek["returned"] == 3 and peek["pending_urc_count"] == 3 and not peek["has_more"]
    page = await h.call("read_urc", port=sim.port, peek=True, max_packets=1)
    assert page["returned"] == 1 and page["pending_urc_count"] == 3 and page["has_more"]
    taken = await h.call("read_urc", port=sim.port, max_packets=2)
    assert [p["data"] for p in taken["packets"]] == [p["data"] for p in peek["packets"][:2]]
    assert taken["pending_urc_count"] == 1 and taken["has_more"]
    rest = await h.call("read_urc", port=sim.port)
    assert rest["returned"] == 1 and rest["pending_urc_count"] == 0 and not rest["has_more"]


@pytest.mark.parametrize(("setting", "value"), [("parity", "E"), ("bytesize", 7)])
async def test_a_setting_the_device_refuses_leaves_the_open_port_as_it_was(
        h: Harness, sim: SimModem, setting: str, value: object) -> None:
    before = (await h.call("connection_status", port=sim.port))["ports"][0]
    ref = h.daemon.supervisor.find("serial", sim.port)
    # baudrate is changed first (pyserial's order) and must be walked back when parity/bytesize fails.
    err = await h.error("configure_connection", port=sim.port, baudrate=9600, **{setting: value})
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == setting
    assert setting in err["message"] and err["details"]["value"] == value
    after = (await h.call("connection_status", port=sim.port))["ports"][0]
    assert after["settings"] == before["settings"] and after["log_file"] == before["log_file"]
    assert after["state"] == "Connected" and h.daemon.supervisor.find("serial", sim.port) is ref
    assert pyserial_settings(sim.path) == pyserial_settings_of(before["settings"])
    assert (await at(h, sim, "AT"))["found_keyword"]  # still working, same session
    events = [json.loads(line).get("event") for line in Path(after["log_file"]).read_text().splitlines()]
    assert events.count("session") == 1 and "settings" not in events
    # A change the device takes still works afterwards (pyserial's idea of the port was put back too).
    changed = await h.call("configure_connection", port=sim.port, baudrate=9600)
    assert changed["settings"]["baudrate"] == 9600 and pyserial_settings(sim.path)["baudrate"] == 9600


async def test_a_setting_the_device_refuses_at_open_leaves_it_closed(make_harness: MakeHarness,
                                                                     sim: SimModem) -> None:
    h = make_harness(allowed_ports=[sim.port])
    err = await h.error("configure_connection", port=sim.port, parity="O")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == "parity"
    status = (await h.call("connection_status", port=sim.port))["ports"][0]
    # Not open in diagd (the modem's own end of the pty is what shows as a holder).
    assert status["owner"] is None and "log_file" not in status and os.getpid() in [p["pid"] for p in status["holders"]]
    assert h.daemon.supervisor.find("serial", sim.port) is None and not h.backend.records
    assert not list(h.backend.log_dir.glob("*.jsonl"))  # no session was started
    opened = await h.call("configure_connection", port=sim.port, line_ending="cr")  # nothing held on to it
    assert opened["outcome"] == "opened" and (await at(h, sim, "AT"))["found_keyword"]


def pyserial_settings(path: str) -> dict[str, Any]:
    """What the kernel has for the line now, read through a second, non-exclusive descriptor."""
    import termios

    fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    try:
        _iflag, _oflag, cflag, _lflag, _ispeed, ospeed, _cc = termios.tcgetattr(fd)
    finally:
        os.close(fd)
    speeds = {getattr(termios, f"B{b}"): b for b in (9600, 19200, 38400, 57600, 115200)}
    return {"baudrate": speeds.get(ospeed, ospeed), "csize": cflag & termios.CSIZE,
            "parenb": bool(cflag & termios.PARENB)}


def pyserial_settings_of(settings: dict[str, Any]) -> dict[str, Any]:
    import termios

    sizes = {5: termios.CS5, 6: termios.CS6, 7: termios.CS7, 8: termios.CS8}
    return {"baudrate": settings["baudrate"], "csize": sizes[settings["bytesize"]],
            "parenb": settings["parity"] != "N"}


async def test_escapes_in_payload_and_stop_pattern_are_the_bytes_they_name(h: Harness, sim: SimModem) -> None:
    # As `diagd call send_data payload='AT\r' stop_pattern='OK\r\n'` delivers them: with backslashes.
    ok = await at(h, sim, "AT\\r", line_ending="none", stop_pattern="OK\\r\\n")
    assert ok["found_keyword"] and ok["data"] == "\r\nOK\r\n" and ok["stop_pattern_matched"] == "OK\\r\\n"
    assert ok["bytes_sent"] == 3 and bytes(sim.received) == b"AT\r"
    listed = await at(h, sim, "AT+NOPE", stop_pattern=["OK\\r\\n", "ERROR\\r\\n"])
    assert listed["stop_pattern_matched"] == "ERROR\\r\\n"
    # An SMS ended with Ctrl-Z written as \x1a; a doubled backslash is one backslash in the text.
    await at(h, sim, 'AT+CMGS="+4912345"', stop_pattern="> ")
    sent = await at(h, sim, "C:\\\\temp\\x1a", line_ending="none")
    assert sent["found_keyword"] and sim.messages == [b"C:\\temp"]
    # escapes=false: the text as it is, backslashes included.
    await at(h, sim, 'AT+CMGS="+4912345"', stop_pattern="> ")
    raw = await at(h, sim, "a\\tb\\x1a", line_ending="none", escapes=False, wait_policy="timeout",
                   stop_pattern=None, timeout_ms=100)
    assert raw["bytes_sent"] == len("a\\tb\\x1a")
    await at(h, sim, "\\x1a", line_ending="none")  # now end that message
    assert sim.messages[-1] == b"a\\tb\\x1a"


async def test_a_bad_escape_is_refused_with_its_position_and_nothing_is_written(h: Harness, sim: SimModem) -> None:
    err = await h.error("send_data", port=sim.port, payload="AT\\q")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == "payload"
    assert err["details"]["position"] == 2 and err["details"]["escape"] == "\\q"
    bad_pattern = await h.error("send_data", port=sim.port, payload="AT", stop_pattern=["OK", "ERR\\x4"])
    assert bad_pattern["details"]["argument"] == "stop_pattern" and bad_pattern["details"]["position"] == 3
    assert (await at(h, sim, "AT"))["found_keyword"]
    assert bytes(sim.received) == b"AT\r"  # the modem reads in order: nothing came before this AT


async def test_a_baud_rate_the_driver_refuses_leaves_the_open_port_as_it_was(
        h: Harness, sim: SimModem, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pty takes any rate; a UART driver may not. pyserial sets a non-standard rate with TCSETS2
    # after its tcsetattr, and turns a refusal into ValueError: make that ioctl refuse, as such a
    # driver does, and keep everything else real.
    class RefusingSerial(pyserial.Serial):  # type: ignore[misc]
        def _set_special_baudrate(self, baudrate: int) -> None:
            raise ValueError(f"Failed to set custom baud rate ({baudrate}): [Errno 22] Invalid argument")

    before = (await h.call("connection_status", port=sim.port))["ports"][0]
    await h.call("configure_connection", port=sim.port, action="close")
    monkeypatch.setattr(pyserial, "Serial", RefusingSerial)
    opened = await h.call("configure_connection", port=sim.port, line_ending="cr")
    line = pyserial_settings(sim.path)
    err = await h.error("configure_connection", port=sim.port, baudrate=250000)
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["argument"] == "baudrate"
    assert err["details"]["value"] == 250000 and "Failed to set custom baud rate" in err["message"]
    after = (await h.call("connection_status", port=sim.port))["ports"][0]
    assert after["settings"] == opened["settings"] == before["settings"]
    assert after["log_file"] == opened["log_file"] and pyserial_settings(sim.path) == line
    assert (await at(h, sim, "AT"))["found_keyword"]
    await h.call("configure_connection", port=sim.port, action="close")
    at_open = await h.error("configure_connection", port=sim.port, baudrate=250000)
    assert at_open["code"] == "INVALID_ARGUMENT" and at_open["details"]["argument"] == "baudrate"
    assert h.daemon.supervisor.find("serial", sim.port) is None and not h.backend.records


async def test_a_diagd_call_whose_process_has_exited_no_longer_holds_the_port(h: Harness, sim: SimModem) -> None:
    # The daemon may learn that a `diagd call` closed its socket only after the next one's call has
    # arrived; a finished process is gone either way.
    done = subprocess.Popen(["true"])
    done.wait()  # exited and reaped: its pid names no process now
    previous = f"cli:{done.pid}"
    h.connect(previous)  # still in the connection table
    taken = await h.call("configure_connection", client=previous, port=sim.port, force=True)
    assert taken["owner"] == previous
    result = await h.call("send_data", client=f"cli:{os.getpid()}", port=sim.port, payload="AT", stop_pattern="OK")
    assert result["found_keyword"]
    # A `diagd call` still running keeps it, as any connected client does.
    h.connect(f"cli:{os.getpid()}")
    busy = await h.error("send_data", client="mcp:200", port=sim.port, payload="AT")
    assert busy["code"] == "BUSY" and busy["details"]["owner"] == f"cli:{os.getpid()}"


# -- line endings and keyword waits that fail ---------------------------------------------------


async def test_an_at_command_goes_out_with_cr_by_default(make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(allowed_ports=[sim.port])
    h.connect(h.client)
    opened = await h.call("configure_connection", port=sim.port)  # no line_ending given, none configured
    assert opened["settings"]["line_ending"] == "cr"
    answer = await at(h, sim, "AT+CSQ")
    assert answer["success"] and answer["found_keyword"] and "+CSQ: 23,99" in answer["data"]
    assert bytes(sim.received) == b"AT+CSQ\r" and "reason" not in answer


async def test_a_port_table_sets_its_line_ending_and_the_first_matching_table_wins(
        make_harness: MakeHarness, sim: SimModem) -> None:
    h = make_harness(line_ending="lf", ports={"/nowhere/*": {"line_ending": "none"},
                                              str(sim.link.parent / "mod*"): {"line_ending": "crlf", "idle_ms": 20},
                                              sim.port: {"line_ending": "none"}}, allowed_ports=[sim.port])
    h.connect(h.client)
    opened = await h.call("configure_connection", port=sim.port)
    assert opened["settings"]["line_ending"] == "crlf" and opened["settings"]["idle_ms"] == 20
    assert (await at(h, sim, "ATI"))["found_keyword"]
    assert bytes(sim.received) == b"ATI\r\n"
    given = await h.call("configure_connection", port=sim.port, line_ending="lf")  # the tool still decides
    assert given["settings"]["line_ending"] == "lf"


async def test_a_keyword_wait_that_times_out_fails_and_says_why(h: Harness, sim: SimModem) -> None:
    silent = await at(h, sim, "AT+SIMSILENT", timeout_ms=300)
    assert silent["success"] is False and silent["timed_out"] and silent["bytes_received"] == 0
    assert silent["reason"] == "no stop_pattern ('OK\\r\\n', 'ERROR\\r\\n') came within 300 ms; 0 bytes came"
    partial = await at(h, sim, "AT+CSQ", stop_pattern="NEVER", timeout_ms=300)
    assert partial["success"] is False and "+CSQ: 23,99" in partial["data"]
    assert partial["reason"] == f"no stop_pattern ('NEVER') came within 300 ms; {partial['bytes_received']} " \
                                "bytes came (in data)"
    # The mistake the old default made: a command without its CR is never answered; the reason says so.
    unsent = await at(h, sim, "AT+CSQ", line_ending="none", timeout_ms=300)
    assert unsent["success"] is False and unsent["bytes_received"] == 0
    assert unsent["reason"].endswith("the payload went out with no line ending (line_ending='none'): "
                                     "AT commands need 'cr'")
    assert (await at(h, sim, "AT", timeout_ms=5000))["success"]  # the default is still the port's cr
