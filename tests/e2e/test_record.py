"""A recorded reproduction end to end: diagd_record_start with a live capture on a veth pair, a serial
session on the simulated modem (a real pty) and a bpftrace program; the test then does four things in
order (an AT command, a corpus capture replayed with tcpreplay, a syscall the program traces, another AT
command); diagd_record_stop's bundle holds the capture (frame for frame what was sent), the serial
session as pcapng, the program's output and a merged timeline whose order is the order things were done.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, Env
from tests.e2e.test_mcp import mcp_client, payload
from tests.e2e.test_serial import SimProcess, error, ok, start_sim
from tests.pcaps import pcap
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace
from tests.support.veth import Veth, frames, start_capture_daemon

pytestmark = [pytest.mark.e2e]

# The program prints one line when this test's own process sends signal 0 to itself (os.kill(pid, 0)).
PROGRAM = ('tracepoint:syscalls:sys_enter_kill /args->pid == %d && args->sig == 0/ '
           '{ printf("marker %%d\\n", args->pid); }')


@pytest.fixture
def modem(tmp_path: Path) -> Iterator[SimProcess]:
    sim = start_sim(tmp_path / "modem0")
    yield sim
    sim.stop()


@pytest.fixture
def record_daemon(env: Env, veth: Veth, tmp_path: Path) -> Iterator[DaemonProcess]:
    ensure_tracefs()
    env.write_config(env.config.read_text() + f'\n[serial]\nallowed_ports = ["{tmp_path}/modem*"]\n')
    daemon = start_capture_daemon(env, veth)
    try:
        yield daemon
    finally:
        daemon.stop()


async def stop(client: Any, recording_id: str) -> dict[str, Any]:
    """diagd_record_stop, bounded by the tool's own timeout only (it stops three parts, exports and merges)."""
    result = await client.call_tool("diagd_record_stop", {"recording_id": recording_id, "timeline_rows": 2000})
    assert not result.is_error, payload(result)
    answer: dict[str, Any] = result.structured_content
    return answer


def order(rows: list[dict[str, Any]], port: str) -> list[str]:
    """The timeline as the steps it shows: consecutive rows of one step count once."""
    steps: list[str] = []
    for row in rows:
        if row["source"] == "capture":
            step = "capture"
        elif row["source"] == "bpftrace" and row["output"]:
            step = "bpftrace"  # its marker (the empty lines it prints as it exits are not a step)
        elif row["source"] == f"serial:{port}" and row.get("dir") == "tx":
            step = f"tx {row.get('data', '').strip()}"
        else:
            continue  # the modem's replies (rx) and session records
        if not steps or steps[-1] != step:
            steps.append(step)
    return steps


@needs_bpftrace
async def test_a_recorded_reproduction_bundles_capture_serial_and_bpftrace_in_send_order(
        record_daemon: DaemonProcess, veth: Veth, modem: SimProcess, tmp_path: Path) -> None:
    sent = pcap("adrian_sandbox_n2.pcap")  # 44 Ethernet frames (NGAP over SCTP)
    port = str(modem.link)
    async with mcp_client(record_daemon.env) as client:
        # A part that fails (the program's timeout is over [bpftrace] max_run_s) stops the parts already started.
        refused = await error(client, "diagd_record_start", capture={"interfaces": [veth.capture]},
                              serial_ports=[port], bpftrace={"program": PROGRAM % os.getpid(), "timeout": 3000})
        assert refused["code"] == "INVALID_ARGUMENT" and "max_run_s" in refused["message"]
        assert refused["details"]["part"] == "bpftrace"
        bad = await error(client, "diagd_record_start", capture={"interfaces": "eth0"})  # checked by start_capture
        assert bad["code"] == "INVALID_ARGUMENT" and bad["details"]["part"] == "capture"
        assert bad["details"]["path"] == "$.interfaces" and bad["message"].startswith("capture (start_capture): ")
        assert (await ok(client, "list_captures", status="running"))["total"] == 0
        state = record_daemon.env.state / "capture"
        assert not list(state.glob("exports/rec-*")) and not list(state.glob("recordings/rec-*"))  # no record left

        started = await ok(client, "diagd_record_start", capture={"interfaces": [veth.capture], "duration_s": 300},
                           serial_ports=[port], bpftrace={"program": PROGRAM % os.getpid(), "timeout": 50})
        rid = started["recording_id"]
        assert started["capture_id"] and started["execution_id"] and started["ports"] == [port]

        first = await ok(client, "send_data", port=port, payload="AT\r", stop_pattern=["OK\r\n"])
        assert first["success"]
        await trio.sleep(1)
        await trio.to_thread.run_sync(veth.replay, sent)
        await trio.sleep(1)
        os.kill(os.getpid(), 0)  # what the program traces
        await trio.sleep(1)
        second = await ok(client, "send_data", port=port, payload="ATI\r", stop_pattern=["OK\r\n"])
        assert second["success"]

        other = await error(client, "diagd_record_stop", recording_id="rec-00000000")
        assert other["code"] == "NOT_FOUND"
        bundle = await stop(client, rid)
        assert bundle["status"] == "stopped" and not bundle["already_stopped"]

        # The capture: what was sent, frame for frame, and the recording's id reads it with the pcap tools.
        capture = bundle["capture"]
        assert capture["stop_reason"] == "requested" and capture["packets"] == 44
        assert [f for p in capture["files"] for f in frames(p, tmp_path)] == frames(sent, tmp_path)
        info = await ok(client, "pcap_info", pcap_path=f"capture:{rid}")
        assert info["packet_count"] == 44 and not info["source"]["live"]["running"]

        # The serial session as pcapng (two commands out, their replies in), read by the pcap tools.
        serial = bundle["serial"][0]
        assert serial["port"] == port and serial["packets"] >= 4
        assert Path(serial["pcapng_path"]).name.startswith(f"{rid}-modem0")
        session = await ok(client, "pcap_timeline", pcap_path=serial["pcapng_path"], fields=["frame.p2p_dir"])
        assert {r["frame.p2p_dir"] for r in session["rows"]} == {"0", "1"}

        # The program's output, and its run stopped with the recording.
        trace = bundle["bpftrace"]
        lines = Path(trace["output_path"]).read_text().splitlines()
        assert [line for line in lines if line] == [f"marker {os.getpid()}"] and trace["lines_total"] == len(lines)
        assert trace["status"] != "running"

        # One timeline, in the order things were done.
        timeline = bundle["timeline"]
        assert {s["source"] for s in timeline["sources"]} == {"capture", "bpftrace", f"serial:{port}"}
        assert order(timeline["rows"], port) == ["tx AT", "capture", "bpftrace", "tx ATI"], timeline["rows"]
        assert sum(r["source"] == "capture" for r in timeline["rows"]) == 44

        # Stopped once: the same bundle again; the port the recording opened is closed.
        again = await stop(client, rid)
        assert again["already_stopped"] and again["capture"] == capture
        status = await ok(client, "connection_status", port=port)
        assert status["ports"][0]["state"] != "open", status


async def test_a_recording_is_seen_by_its_owner_only_and_started_only_with_the_groups_it_is_read_with(
        env: Env, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("adrian_sandbox_n2.pcap")
    state = env.state / "capture"
    daemon = start_capture_daemon(env, veth)
    try:
        # A capture's recording is stopped and read with the pcap tools (its timeline, capture:<id>): a client
        # without the pcap group could never stop it. Refused before anything starts; so is a serial part
        # for a client without the serial group.
        async with mcp_client(env, "--tools", "capture") as capture_only:
            refused = await error(capture_only, "diagd_record_start", capture={"interfaces": [veth.capture]})
            assert refused["code"] == "PERMISSION_DENIED" and refused["details"]["missing"] == ["pcap"], refused
            assert "pcap" in refused["details"]["hint"]
        async with mcp_client(env, "--tools", "capture,pcap") as no_serial:
            refused = await error(no_serial, "diagd_record_start", capture={"interfaces": [veth.capture]},
                                  serial_ports=[str(tmp_path / "modem0")])
            assert refused["code"] == "PERMISSION_DENIED" and refused["details"]["missing"] == ["serial"], refused
        assert not list(state.glob("recordings/rec-*")) and not list(state.glob("captures/cap-*"))

        async with mcp_client(env) as owner, mcp_client(env) as other:
            started = await ok(owner, "diagd_record_start",
                               capture={"interfaces": [veth.capture], "duration_s": 300})
            rid = started["recording_id"]
            await trio.to_thread.run_sync(veth.replay, sent)
            never = await error(other, "diagd_record_stop", recording_id="rec-00000000")

            async def hidden() -> None:
                """`other` is told what it is told of an id never made, by every tool that names the id."""
                refused = await error(other, "diagd_record_stop", recording_id=rid)
                assert refused == {**never, "message": f"no recording {rid!r}"}, refused
                named = await error(other, "pcap_info", pcap_path=f"capture:{rid}")
                assert named["code"] == "NOT_FOUND" and named["message"] == f"no recording {rid!r}", named
                assert "packet_count" not in named

            await hidden()  # running: it stays running
            assert (await ok(owner, "capture_status", capture_id=started["capture_id"]))["running"]
            live = await ok(owner, "pcap_info", pcap_path=f"capture:{rid}")
            assert live["source"]["live"]["running"]

            bundle = await stop(owner, rid)
            assert not bundle["already_stopped"] and bundle["capture"]["packets"] == 44
            await hidden()  # stopped: its bundle does not go to another client either
            again = await stop(owner, rid)  # the owner reads it still
            assert again["already_stopped"] and again["capture"] == bundle["capture"]
            assert (await ok(owner, "pcap_info", pcap_path=f"capture:{rid}"))["packet_count"] == 44

        # Its owner has gone: a client of the same user may take it over, as a capture or a port, if it has the
        # groups its parts are read with (a `diagd call` command has every group).
        async with mcp_client(env, "--tools", "capture") as capture_only:
            refused = await error(capture_only, "diagd_record_stop", recording_id=rid)
            assert refused["code"] == "NOT_FOUND" and refused["message"] == f"no recording {rid!r}", refused
        with trio.fail_after(15):  # until the daemon has seen the owner's connection close
            while (out := env.run("call", "diagd_record_stop", f"recording_id={rid}", "--visibility", "off")
                   ).returncode != 0:
                assert "NOT_FOUND" in out.stdout + out.stderr, out
                await trio.sleep(0.2)
        taken = json.loads(out.stdout)
        assert taken["already_stopped"] and taken["capture"] == bundle["capture"]
    finally:
        daemon.stop()
