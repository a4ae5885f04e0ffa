"""Serial sessions as captures, end to end: a real pty session with the simulated modem through the
real shim and daemon, exported with export_serial_pcapng, then checked against the raw log (read
from its JSON lines, not through diagd) by tshark and capinfos, and analysed by the pcap tools."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.actors.serial.test_export import capinfos, check_packets
from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import mcp_client
from tests.e2e.test_serial import AT_END, SimProcess, error, ok, start_sim

pytestmark = pytest.mark.e2e


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "allowed"
    path.mkdir()
    return path


@pytest.fixture
def serial_daemon(env: Env, tmp_path: Path, allowed: Path) -> Iterator[DaemonProcess]:
    # A restricted allow-list: the pcap tools must still read what export_serial_pcapng wrote.
    config = env.config.read_text().replace("[daemon]\n", f'[daemon]\nallowed_dirs = ["{allowed}"]\n')
    env.write_config(config + f'\n[serial]\nallowed_ports = ["{tmp_path}/modem*"]\n')
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        daemon.stop()


def raw_records(log_file: str) -> list[dict[str, Any]]:
    return [json.loads(line, parse_float=Decimal) for line in Path(log_file).read_text().splitlines()]


def tshark_count(path: str, display_filter: str) -> int:
    out = subprocess.run(["tshark", "-r", path, "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                         capture_output=True, text=True, check=True).stdout
    return len(out.splitlines())


async def test_a_modem_session_exports_as_a_capture_the_pcap_tools_read(
        serial_daemon: DaemonProcess, sim: SimProcess, allowed: Path) -> None:
    port = str(sim.link)
    async with mcp_client(serial_daemon.env) as client:
        await ok(client, "configure_connection", port=port, line_ending="cr")
        for command in ("AT", "ATI", "AT+CSQ", "AT+NOPE"):
            await ok(client, "send_data", port=port, payload=command, stop_pattern=AT_END, timeout_ms=5000)
        frame = await ok(client, "send_data", port=port, payload="AT+SIMBIN=40", stop_pattern="FF 00 7E",
                         stop_pattern_encoding="hex", timeout_ms=5000)
        assert frame["is_hex"] and frame["bytes_received"] >= 46
        await ok(client, "send_data", port=port, payload="AT+SIMURC=1,50", stop_pattern=AT_END, timeout_ms=5000)
        with trio.fail_after(10):  # the URC comes after the OK, between calls
            while not any("+CMTI" in p["data"] for p in (await ok(client, "read_urc", port=port))["packets"]):
                await trio.sleep(0.05)

        live = await ok(client, "export_serial_pcapng", port=port)
        assert live["live"] and any("still open" in note for note in live["notes"])
        records = raw_records(live["log_file"])
        assert live["packets"] == len(check_packets(Path(live["pcapng_path"]), Path(live["log_file"])))
        assert live["packets"] <= sum(r["dir"] in ("tx", "rx") for r in records)
        await ok(client, "configure_connection", port=port, action="close")

        done = await ok(client, "export_serial_pcapng", port=port, session=live["session"])
        assert not done["live"] and done["notes"] == [] and done["session"] == live["session"]
        records = raw_records(done["log_file"])
        data = [r for r in records if r["dir"] in ("tx", "rx")]
        out = done["pcapng_path"]
        assert Path(out).parent == serial_daemon.env.state / "serial" / "exports"
        assert Path(out).stat().st_mode & 0o777 == 0o600
        check_packets(Path(out), Path(done["log_file"]))  # bytes, direction, time: every record, in order
        info = capinfos(Path(out))
        assert int(info["Number of packets"]) == len(data) == done["packets"]
        assert (done["tx_packets"], done["rx_packets"]) == (sum(r["dir"] == "tx" for r in data),
                                                            sum(r["dir"] == "rx" for r in data))
        assert done["rx_bytes"] == sum(len(bytes.fromhex(r["hex"])) for r in data if r["dir"] == "rx")
        assert info["Capture application"].startswith("diagd ")

        # pcap_text_search finds every Rx packet whose bytes hold "OK", and only those.
        found = await ok(client, "pcap_text_search", pcap_path=out, query="OK", case_sensitive=True,
                         display_filter="frame.p2p_dir == 1", max_matches=1000)
        expected = [n for n, r in enumerate(data, start=1) if r["dir"] == "rx" and b"OK" in bytes.fromhex(r["hex"])]
        assert expected and sorted({m["frame_number"] for m in found["matches"]}) == expected
        assert all(m["line"].startswith("OK") for m in found["matches"])

        timeline = await ok(client, "pcap_timeline", pcap_path=out, fields=["frame.number", "frame.p2p_dir",
                                                                            "frame.time_epoch"], limit=5000)
        assert timeline["total"] == len(data)
        for row, record in zip(timeline["rows"], data, strict=True):
            assert int(row["frame.p2p_dir"]) == (1 if record["dir"] == "rx" else 0)
            assert Decimal(row["frame.time_epoch"]) == record["ts"]

        sent = await ok(client, "pcap_extract_subcapture", pcap_path=out, display_filter="frame.p2p_dir == 0")
        assert sent["packet_count"] == done["tx_packets"] == tshark_count(out, "frame.p2p_dir == 0")
        assert tshark_count(sent["output_path"], "data-text-lines contains \"AT+CSQ\"") == 1

        # A caller-chosen stem: diagd's exports dir, diagd's extension, a new file, its path returned.
        named = await ok(client, "export_serial_pcapng", port=port, name="modem-run1")
        exports = serial_daemon.env.state / "serial" / "exports"
        assert named["pcapng_path"] == str(exports / "modem-run1.pcapng") and named["packets"] == done["packets"]
        assert (await ok(client, "pcap_info", pcap_path=named["pcapng_path"]))["packet_count"] == done["packets"]
        again = await error(client, "export_serial_pcapng", port=port, name="modem-run1")
        assert again["code"] == "INVALID_ARGUMENT" and "another name" in again["details"]["hint"]
        # A stem that reads like a sensitive name is only a stem: it lands in the exports dir as .pcapng.
        keys = await ok(client, "export_serial_pcapng", port=port, name="authorized_keys")
        assert keys["pcapng_path"] == str(exports / "authorized_keys.pcapng")
        await refuses_every_name_form_but_a_stem(client, port, allowed)
        unknown = await error(client, "export_serial_pcapng", port=port, session=live["session"][:-8])
        assert unknown["code"] == "NOT_FOUND" and unknown["details"]["did_you_mean"] == [live["session"]]
    assert not any(allowed.iterdir())  # nothing was written where a caller pointed


async def refuses_every_name_form_but_a_stem(client: Any, port: str, allowed: Path) -> None:
    """The attack of issue 20: the agent's Tx bytes into authorized_keys, .bashrc, names with a newline,
    a path out; each refused with INVALID_ARGUMENT and a hint, nothing written."""
    for name in (str(allowed / "authorized_keys"), ".bashrc", "x\nssh-ed25519 AAAA", "../../authorized_keys",
                 "/root/.ssh/authorized_keys", "keys.sh", "modem.pcapng", "-x"):
        refused = await error(client, "export_serial_pcapng", port=port, name=name)
        assert refused["code"] == "INVALID_ARGUMENT" and ".pcapng" in refused["details"]["hint"], (name, refused)
    # The argument that once named any new file in allowed_dirs is gone: refused, saying what is taken.
    for target in (allowed / "authorized_keys", allowed / ".bashrc", allowed / "a\nb"):
        refused = await error(client, "export_serial_pcapng", port=port, out_path=str(target))
        assert refused["code"] == "INVALID_ARGUMENT" and "name" in refused["details"]["hint"], refused


async def test_an_empty_session_exports_an_empty_capture_and_says_so(
        serial_daemon: DaemonProcess, tmp_path: Path) -> None:
    quiet = start_sim(tmp_path / "modem1")  # no URC timer: nothing is said unless asked
    port = str(quiet.link)
    try:
        async with mcp_client(serial_daemon.env) as client:
            await empty_session(client, port)
    finally:
        quiet.stop()


async def empty_session(client: Any, port: str) -> None:
    assert (await error(client, "export_serial_pcapng", port=port))["code"] == "NOT_FOUND"  # never opened
    await ok(client, "configure_connection", port=port)
    await ok(client, "configure_connection", port=port, action="close")
    empty = await ok(client, "export_serial_pcapng", port=port)
    assert empty["packets"] == 0
    assert any("no Tx/Rx data" in note for note in empty["notes"])
    assert capinfos(Path(empty["pcapng_path"]))["Number of packets"] == "0"
    info = await ok(client, "pcap_text_search", pcap_path=empty["pcapng_path"], query="OK")
    assert info["matches"] == []
