"""Live capture end to end, with real traffic: a veth pair whose sending end lives in a network
namespace of the test's own, real corpus captures replayed into it with tcpreplay, captured on the
other end through a real daemon and a real MCP client, and compared frame by frame (count, length,
sha256 of the bytes) with what was sent. Also the refusals: an interface that is not allowed, a
filter that does not compile, a client stopping another's capture, a disk budget that fills up,
and a capture that was running when the daemon stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import mcp_client
from tests.e2e.test_serial import error, ok
from tests.pcaps import pcap
from tests.support.veth import Veth, frames, start_capture_daemon

pytestmark = pytest.mark.e2e

async def wait_stopped(client: object, capture_id: str) -> dict[str, object]:
    status = await ok(client, "capture_status", capture_id=capture_id, wait_s=15)  # type: ignore[arg-type]
    assert not status["running"], status
    return status


async def test_replayed_traffic_is_captured_frame_for_frame_and_readable_while_it_grows(
        capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("5greplay_oai.pcap")  # 753 Ethernet frames up to 7306 bytes (NGAP, PFCP, GTP-U, HTTP)
    async with mcp_client(capture_daemon.env) as client:
        listed = await ok(client, "list_interfaces")
        mine = next(i for i in listed["interfaces"] if i["name"] == veth.capture)
        assert mine["allowed"] and mine["up"] and {"dlt": 1, "name": "EN10MB", "description": "Ethernet"} in \
            mine["link_types"]
        assert not any(i["allowed"] for i in listed["interfaces"] if i["name"] != veth.capture)

        started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=120)
        assert started["status"] == "running" and started["files"], started
        await trio.to_thread.run_sync(veth.replay, sent)
        expected = frames(sent, tmp_path)
        with trio.fail_after(15):
            while (status := await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] \
                    < len(expected):
                await trio.sleep(0.1)
        # Analysable while it grows: the pcap tools read the running capture's current file.
        info = await ok(client, "pcap_info", pcap_path=status["current_file"])
        assert info["packet_count"] == len(expected), info

        done = await ok(client, "stop_capture", capture_id=started["capture_id"])
        assert done["status"] == "stopped" and done["stop_reason"] == "requested"
        assert done["packets"] == len(expected)
        assert done["drops"]["kernel"] == 0 and done["drops"]["interface"] == 0, done["drops"]
        assert done["drops"]["interface_statistics"][veth.capture]["received"] == len(expected)
        got = [f for path in done["files"] for f in frames(path, tmp_path)]
        assert got == expected
        assert Path(done["current_file"]).parent == capture_daemon.env.state / "capture" / "exports" / \
            started["capture_id"]

        listed_captures = await ok(client, "list_captures")
        assert [c["capture_id"] for c in listed_captures["captures"]] == [started["capture_id"]]


async def test_a_ring_buffer_keeps_its_newest_files_and_a_packet_limit_stops_the_capture(
        capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("5greplay_oai.pcap")
    async with mcp_client(capture_daemon.env) as client:
        started = await ok(client, "start_capture", interfaces=[veth.capture], ring_files=2, file_size_kb=50,
                           packets=700, filter="not arp")
        await trio.to_thread.run_sync(veth.replay, sent)
        done = await wait_stopped(client, started["capture_id"])
        assert done["stop_reason"] == "packets" and done["packets"] == 700
        assert len(done["files"]) == 2 and done["files_written"] > 2  # dumpcap removed the oldest
        kept = [f for path in done["files"] for f in frames(path, tmp_path)]
        not_arp = tmp_path / "not-arp.pcap"  # what the capture filter lets through, chosen by tshark
        subprocess.run(["tshark", "-r", sent, "-Y", "not arp", "-w", str(not_arp)], check=True, capture_output=True)
        sent_frames = frames(not_arp, tmp_path)[:700]
        assert kept == sent_frames[len(sent_frames) - len(kept):]  # the newest frames, in order


async def test_refusals_interface_not_allowed_and_a_filter_that_does_not_compile(
        capture_daemon: DaemonProcess, veth: Veth) -> None:
    async with mcp_client(capture_daemon.env) as client:
        refused = await error(client, "start_capture", interfaces=["lo"])
        assert refused["code"] == "PERMISSION_DENIED" and "allowed_interfaces" in refused["message"]
        bad = await error(client, "start_capture", interfaces=[veth.capture], filter="udp prt 5")
        assert bad["code"] == "INVALID_FILTER" and "syntax error" in bad["message"], bad
        display = await error(client, "start_capture", interfaces=[veth.capture], filter="ngap && sctp")
        assert display["code"] == "INVALID_FILTER"
        assert (await ok(client, "list_captures"))["total"] == 0  # nothing started, nothing left on disk
    exports = capture_daemon.env.state / "capture" / "exports"
    assert not exports.exists() or not any(exports.iterdir())


async def test_another_client_cannot_stop_a_capture_while_its_owner_is_connected(
        capture_daemon: DaemonProcess, veth: Veth) -> None:
    async with mcp_client(capture_daemon.env) as owner, mcp_client(capture_daemon.env) as other:
        started = await ok(owner, "start_capture", interfaces=[veth.capture], duration_s=60)
        busy = await error(other, "stop_capture", capture_id=started["capture_id"])
        assert busy["code"] == "BUSY" and busy["details"]["owner"] == started["owner"]
        status = await ok(other, "capture_status", capture_id=started["capture_id"])
        assert status["running"]  # refused: still running
        stopped = await ok(owner, "stop_capture", capture_id=started["capture_id"])
        assert stopped["status"] == "stopped" and stopped["took_over_from"] is None


async def test_the_disk_budget_stops_a_running_capture_saying_so_and_evicts_finished_ones_first(
        env: Env, veth: Veth) -> None:
    sent = pcap("5greplay_oai.pcap")  # about 316 kB once captured
    daemon = start_capture_daemon(env, veth, "max_bytes = 400000\n")
    try:
        async with mcp_client(env) as client:
            first = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60)
            await trio.to_thread.run_sync(veth.replay, sent)
            await ok(client, "stop_capture", capture_id=first["capture_id"])
            second = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60)
            await trio.to_thread.run_sync(veth.replay, sent)
            with trio.fail_after(15):
                while (await ok(client, "capture_status", capture_id=first["capture_id"]))["files"]:
                    await trio.sleep(0.1)
            gone = await ok(client, "capture_status", capture_id=first["capture_id"])
            assert gone["evicted"] and gone["packets"] > 0  # the record stays, its files went first
            running = await ok(client, "capture_status", capture_id=second["capture_id"])
            assert running["running"] and not running["evicted"]
            await trio.to_thread.run_sync(veth.replay, sent)  # alone over the budget now: stopped, saying so
            ended = await wait_stopped(client, second["capture_id"])
            assert ended["stop_reason"] == "disk_budget"
    finally:
        daemon.stop()


async def test_a_capture_survives_a_daemon_restart_as_a_stored_result(env: Env, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("adrian_sandbox_n2.pcap")
    daemon = start_capture_daemon(env, veth)
    try:
        async with mcp_client(env) as client:
            started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60)
            await trio.to_thread.run_sync(veth.replay, sent)
            with trio.fail_after(15):
                while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < 44:
                    await trio.sleep(0.1)
    finally:
        daemon.stop()
    daemon = start_daemon(env)
    try:
        async with mcp_client(env) as client:
            after = await ok(client, "capture_status", capture_id=started["capture_id"])
            # The daemon stopped gracefully: dumpcap was stopped with it and closed its file (a daemon that
            # is killed leaves the capture `interrupted`, with the counters as last saved).
            assert after["status"] == "stopped" and after["stop_reason"] == "shutdown", after
            assert after["packets"] == 44 and after["drops"]["kernel"] == 0 and after["files"]
            assert [f for path in after["files"] for f in frames(path, tmp_path)] == frames(sent, tmp_path)
    finally:
        daemon.stop()
