"""Serial end to end: MCP SDK client -> `diagd mcp` shim -> `diagd serve` -> pyserial -> a pty whose
other end is a simulated modem in its own process (tests/support/sim_modem.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from tests.conftest import SUPPORT, DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import call, mcp_client, payload
from tests.fixtures.vmcore import build

pytestmark = pytest.mark.e2e

AT_END = ["OK\r\n", "ERROR\r\n"]


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    path: str
    link: Path

    def stop(self) -> None:
        """Close its stdin: it closes the master and removes its link (an unplugged adapter)."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


def start_sim(link: Path, *args: str) -> SimProcess:
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "sim_modem.py"), "--link", str(link), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"the simulated modem exited with {proc.wait(timeout=10)}"
    return SimProcess(proc, json.loads(line)["path"], link)


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await call(client, tool, args)
    assert not result.is_error, payload(result)
    structured: dict[str, Any] = result.structured_content  # checked against outputSchema by the SDK
    assert structured == payload(result)
    return structured


async def error(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    result = await call(client, tool, args)
    assert result.is_error
    return payload(result)


async def test_an_agent_session_over_mcp(serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    port = str(sim.link)
    async with mcp_client(serial_daemon.env) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"list_ports", "configure_connection", "connection_status", "send_data", "read_urc", "set_signals",
                "get_log"} <= set(tools)
        assert tools["get_log"].annotations is not None and tools["get_log"].annotations.read_only_hint
        listed = await ok(client, "list_ports")
        assert any(p["port"] == port and p["allowed"] for p in listed["ports"])
        opened = await ok(client, "configure_connection", port=port, baudrate=115200, line_ending="cr")
        assert opened["state"] == "Connected" and opened["device"] == sim.path
        csq = await ok(client, "send_data", port=port, payload="AT+CSQ", stop_pattern=AT_END, timeout_ms=5000)
        assert "+CSQ: 23,99" in csq["data"] and csq["stop_pattern_matched"] == "OK\r\n"
        frame = await ok(client, "send_data", port=port, payload="7E 00 FF 7E", encoding="hex",
                         stop_pattern="FF 00 7E", timeout_ms=5000)
        assert frame["data"] == "7E 00 FF 00 FF FF 00 7E" and frame["is_hex"]
        later = await ok(client, "send_data", port=port, payload="AT+SIMURC=2,50", stop_pattern=AT_END)
        assert later["data"].strip() == "OK"
        urcs: list[dict[str, Any]] = []
        with trio.fail_after(10):  # the modem keeps talking between calls
            while sum(p["data"].count("+CMTI") for p in urcs) < 2:
                urcs += (await ok(client, "read_urc", port=port))["packets"]
                await trio.sleep(0.05)
        page = await ok(client, "get_log", port=port, limit=5)
        assert page["live"] and page["records"][0]["event"] == "session" and page["next_offset"] == 5
        status = payload(await call(client, "diagd_status"))
        actor = next(a for a in status["actors"] if a["kind"] == "serial")
        assert actor["resource"] == port and actor["idle_s_left"] is None
        assert actor["details"]["state"] == "Connected"
        closed = await ok(client, "configure_connection", port=port, action="close")
        assert closed["state"] == "Closed"
        not_open = await error(client, "send_data", port=port, payload="AT")
        assert not_open["code"] == "INVALID_ARGUMENT" and not_open["details"]["state"] == "Closed"


async def test_two_agents_contend_for_one_port(serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    port = str(sim.link)
    async with mcp_client(serial_daemon.env) as a, mcp_client(serial_daemon.env) as b:
        await ok(a, "configure_connection", port=port, line_ending="cr")
        busy = await error(b, "send_data", port=port, payload="AT", stop_pattern="OK")
        assert busy["code"] == "BUSY" and busy["details"]["state"] == "Occupied"
        assert (await ok(b, "connection_status", port=port))["ports"][0]["state"] == "Occupied"
        taken = await ok(b, "configure_connection", port=port, force=True)
        assert taken["took_over_from"] == busy["details"]["owner"]
        assert (await ok(b, "send_data", port=port, payload="AT", stop_pattern="OK", timeout_ms=5000))["found_keyword"]
        assert (await error(a, "send_data", port=port, payload="AT"))["code"] == "BUSY"


async def test_an_unplugged_modem_is_reported_and_reopened_when_it_returns(
        serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    port = str(sim.link)
    async with mcp_client(serial_daemon.env) as client:
        await ok(client, "configure_connection", port=port, line_ending="cr")
        sim.stop()
        with trio.fail_after(10):
            while (await ok(client, "connection_status", port=port))["ports"][0]["state"] != "Disconnected":
                await trio.sleep(0.02)
        gone = await error(client, "send_data", port=port, payload="AT", stop_pattern="OK")
        assert gone["code"] == "BACKEND_UNAVAILABLE" and gone["details"]["state"] == "Disconnected"
        back = start_sim(sim.link)
        try:
            reopened = await ok(client, "configure_connection", port=port)
            assert reopened["outcome"] == "reopened" and reopened["device"] == back.path
            at = await ok(client, "send_data", port=port, payload="AT", stop_pattern="OK", timeout_ms=5000)
            assert at["data"] == "\r\nOK\r\n"
        finally:
            back.stop()


def test_diagd_call_drives_a_port_from_the_shell(serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    env, port = serial_daemon.env, str(sim.link)
    opened = env.run("call", "configure_connection", f"port={port}", "line_ending=cr", "--visibility", "off")
    assert opened.returncode == 0, opened.stderr
    # Each `diagd call` is a new client; the port passes on once the previous one has gone.
    sent = env.run("call", "send_data", f"port={port}", "payload=ATI", 'stop_pattern=["OK\\r\\n","ERROR\\r\\n"]',
                   "timeout_ms=5000", "--visibility", "off")
    assert sent.returncode == 0, sent.stderr
    assert "SIMMODEM" in json.loads(sent.stdout)["data"]
    bad = env.run("call", "send_data", f"port={port}", "payload=0A 0", "encoding=hex", "--visibility", "off")
    assert bad.returncode == 1 and json.loads(bad.stdout)["details"]["position"] == 3
    denied = env.run("call", "configure_connection", "port=/dev/ttyS0", "--visibility", "off")
    assert denied.returncode == 1 and json.loads(denied.stdout)["code"] == "PERMISSION_DENIED"



def written(records: list[dict[str, Any]]) -> list[str]:
    return [r["data"] for r in records if r["dir"] == "tx"]


def test_diagd_call_sends_escapes_as_a_shell_user_types_them(serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    env, port = serial_daemon.env, str(sim.link)

    def typed(command_line: str) -> dict[str, Any]:
        """`diagd call <command_line>` with the quoting a shell applies to it."""
        done = env.run("call", *shlex.split(command_line), "--visibility", "off")
        assert done.returncode in (0, 1), done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    typed(f"configure_connection port={port} line_ending=none")  # the payload says it all
    ok = typed(f"send_data port={port} payload='AT\\r' stop_pattern='OK\\r\\n' timeout_ms=5000")
    assert ok["found_keyword"] and ok["data"].endswith("\r\nOK\r\n") and ok["bytes_sent"] == 3
    # A literal backslash is a doubled one; an unknown escape is refused, naming where it is.
    err = typed(f"send_data port={port} payload='AT+X\\y\\r'")
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["position"] == 4
    back = typed(f"send_data port={port} payload='AT+X\\\\y\\r' stop_pattern='ERROR\\r\\n' timeout_ms=5000")
    assert back["found_keyword"] and back["bytes_sent"] == len("AT+X\\y\r")
    log = typed(f"get_log port={port} limit=1000")
    assert written(log["records"]) == ["AT\r", "AT+X\\y\r"]


async def test_escapes_through_mcp_name_the_same_bytes_as_real_control_characters(
        serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    port = str(sim.link)
    async with mcp_client(serial_daemon.env) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        schema = tools["send_data"].input_schema["properties"]
        assert "\\r" in schema["payload"]["description"] and schema["escapes"]["default"] is True
        await ok(client, "configure_connection", port=port, line_ending="none")  # the payloads end lines
        # JSON "AT\\r" (an agent writing the escape) and "AT\r" (a real CR) are the same bytes.
        escaped = await ok(client, "send_data", port=port, payload="AT\\r", stop_pattern="OK\\r\\n", timeout_ms=5000)
        real = await ok(client, "send_data", port=port, payload="AT\r", stop_pattern="OK\r\n", timeout_ms=5000)
        assert escaped["found_keyword"] and real["found_keyword"]
        assert escaped["stop_pattern_matched"] == "OK\\r\\n" and real["stop_pattern_matched"] == "OK\r\n"
        literal = await ok(client, "send_data", port=port, payload="AT+X\\\\y\r", stop_pattern="ERROR\r\n",
                           timeout_ms=5000)
        as_is = await ok(client, "send_data", port=port, payload="AT+X\\y\r", escapes=False,
                         stop_pattern="ERROR\r\n", timeout_ms=5000)  # escapes=false covers the pattern too
        assert literal["found_keyword"] and as_is["found_keyword"]
        log = await ok(client, "get_log", port=port, limit=1000)
        assert written(log["records"]) == ["AT\r", "AT\r", "AT+X\\y\r", "AT+X\\y\r"]


@pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed (scripts/setup.sh installs it)")
async def test_the_daemons_own_crash_pty_is_refused_even_when_allowed_ports_names_every_pty(
        env: Env, sim: SimProcess, tmp_path: Path) -> None:
    """A client that opened the pty crash runs on would read what diagd sends crash and make another
    client's crash commands time out: a pty diagd holds is never a port, whatever allowed_ports says."""
    fixture = build()
    config = env.config.read_text().replace("[daemon]\n", f'[daemon]\nallowed_dirs = ["{fixture.dir}"]\n')
    env.write_config(config + '\n[serial]\nallowed_ports = ["/dev/pts/*"]\n')
    daemon = start_daemon(env)
    try:
        async with mcp_client(env) as client:
            with trio.fail_after(300):  # crash loads the dump in 5-10 s
                opened = payload(await client.call_tool("open_vmcore_session", {
                    "vmcore_path": str(fixture.vmcore), "vmlinux_path": str(fixture.vmlinux)}))
            session = opened["session_id"]
            status = payload(await call(client, "diagd_status"))
            crash = next(a for a in status["actors"] if a["kind"] == "crash")["details"]
            crash_pty = os.readlink(f"/proc/{crash['crash_pid']}/fd/0")  # crash's terminal: pexpect's pty
            assert crash_pty.startswith("/dev/pts/"), crash_pty
            link = tmp_path / "ttyUSB0"
            link.symlink_to(crash_pty)
            for port in (crash_pty, str(link)):
                refused = await error(client, "configure_connection", port=port)
                assert refused["code"] == "PERMISSION_DENIED" and refused["details"]["reason"] == "daemon_pty", refused
                assert refused["details"]["device"] == crash_pty and "Traceback" not in json.dumps(refused)
            with trio.fail_after(60):  # crash's terminal is untouched: it answers at once
                answer = payload(await client.call_tool("run_crash_command", {
                    "session_id": session, "command": "sys", "force_execute": True}))
            assert "PANIC" in answer["output"], answer
            # Another program's pty, named by the same glob, is a port.
            mine = await ok(client, "configure_connection", port=sim.path, line_ending="cr")
            assert mine["state"] == "Connected" and mine["device"] == sim.path
            at = await ok(client, "send_data", port=sim.path, payload="AT", stop_pattern=AT_END, timeout_ms=5000)
            assert at["found_keyword"]
    finally:
        daemon.stop()


def test_with_the_shipped_config_a_pty_is_refused_with_a_coded_error(env: Env, sim: SimProcess) -> None:
    daemon = start_daemon(env)  # no [serial] table: allowed_ports = [], any serial line and no pty
    try:
        for port in (sim.path, str(sim.link)):
            done = env.run("call", "configure_connection", f"port={port}", "--visibility", "off")
            refused = json.loads(done.stdout)
            assert done.returncode == 1 and refused["code"] == "PERMISSION_DENIED", done.stdout
            assert refused["details"]["reason"] == "pty_not_allowed" and refused["details"]["device"] == sim.path
            assert "[serial] allowed_ports" in refused["details"]["hint"]
            assert "Traceback" not in done.stdout + done.stderr
    finally:
        daemon.stop()
