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
from tests.support.veth import Veth, bytes_under, frames, start_capture_daemon

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


async def test_the_disk_budget_is_never_crossed_on_disk_and_finished_captures_make_room_first(
        env: Env, veth: Veth) -> None:
    """Each capture's share of [capture] max_bytes is bound by dumpcap's own ring: the files on disk never
    pass the budget, sampled all along; a ring that needs more than is free is refused saying so."""
    sent = pcap("5greplay_oai.pcap")  # about 316 kB once captured; frames up to 7306 bytes
    budget = 1_000_000
    daemon = start_capture_daemon(env, veth, f"max_bytes = {budget}\n")
    exports = env.state / "capture" / "exports"
    peaks: list[int] = []

    async def replay_watching() -> None:
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def sample() -> None:
                while not done.is_set():
                    peaks.append(bytes_under(exports))
                    await trio.sleep(0.01)

            nursery.start_soon(sample)
            await trio.to_thread.run_sync(veth.replay, sent)
            done.set()

    try:
        async with mcp_client(env) as client:
            # No ring asked: one file, which dumpcap ends at the capture's share (a quarter: four may run).
            first = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192)
            await replay_watching()
            ended = await wait_stopped(client, first["capture_id"])
            assert ended["stop_reason"] == "disk_budget" and 0 < ended["packets"] < 753
            assert ended["bytes_on_disk"] <= budget // 4
            # With a ring derived from the share: the newest traffic kept, the oldest files dropped.
            ringed = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192,
                              file_size_kb=64)
            assert ringed["ring"]["file_size_kb"] == 64 and ringed["ring"]["ring_files"] >= 1
            share = ringed["ring"]["ring_files"] * (ringed["ring"]["file_size_kb"] * 1024 + 8192 + 16384)
            await replay_watching()
            with trio.fail_after(30):
                while (await ok(client, "capture_status", capture_id=ringed["capture_id"]))["packets"] < 753:
                    await trio.sleep(0.1)
            status = await ok(client, "capture_status", capture_id=ringed["capture_id"])
            assert status["bytes_on_disk"] <= share and status["bytes_on_disk"] < status["bytes_written"]  # dropped
            await ok(client, "stop_capture", capture_id=ringed["capture_id"])
            # A ring that needs more than is free: the finished capture's files go first to make room.
            big = {"file_size_kb": 100, "ring_files": 6}
            second = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192, **big)
            gone = await ok(client, "capture_status", capture_id=first["capture_id"])
            assert gone["evicted"] and gone["packets"] > 0  # the record stays, its files went
            kept = await ok(client, "capture_status", capture_id=ringed["capture_id"])
            assert not kept["evicted"] and kept["files"]  # the oldest went first, and only what was needed
            # While it runs, its reservation is its own: another such ring does not fit, and says why.
            refused = await error(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192,
                                  **big)
            assert refused["code"] == "INVALID_ARGUMENT" and refused["details"]["free_bytes"] < 6 * 102400
            await replay_watching()
            await ok(client, "stop_capture", capture_id=second["capture_id"])
            assert peaks and max(peaks) <= budget, max(peaks)
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
