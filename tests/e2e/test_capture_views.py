"""A live capture read by the pcap tools and diagd_timeline as `capture:<id>`, while it grows and once it
has ended, with real traffic: a real corpus capture replayed with tcpreplay onto a veth pair, captured by
real dumpcap through a real daemon, and each answer compared with tshark on the very file it names
(frame counts, the frame numbers a display filter selects, the frames' bytes against what was sent).
Also a ring of several files read as one (mergecap), masking applied to a live capture as to a file,
a client that did not select the capture group refused, and the views counted in the disk budget
(against the bytes the exports dir holds)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import DaemonProcess, Env
from tests.e2e.test_mcp import mcp_client
from tests.e2e.test_serial import error, ok
from tests.pcaps import pcap
from tests.support.veth import Veth, bytes_under, frames, start_capture_daemon

pytestmark = pytest.mark.e2e

SLOW_PPS = 100  # 753 frames in about 7.5 s: the test reads the capture while the replay is half-way


def tshark_frames(path: str, display_filter: str) -> list[int]:
    done = subprocess.run(["tshark", "-n", "-r", path, "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, check=True)
    return [int(n) for n in done.stdout.split()]


def tshark_count(path: str) -> int:
    return len(tshark_frames(path, "frame"))



async def ring_with_replay(client: Any, veth: Any, sent: Any, *, duration_s: int) -> dict[str, Any]:
    """A ring capture of 100 kB files on the veth's capture end, once all 753 replayed frames are in."""
    started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=duration_s,
                       file_size_kb=100, ring_files=10)
    await trio.to_thread.run_sync(veth.replay, sent)
    with trio.fail_after(30):
        while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < 753:
            await trio.sleep(0.2)
    return started

async def filter_matches(client: Any, ref: str, display_filter: str) -> tuple[list[int], dict[str, Any]]:
    answer = await ok(client, "pcap_frames_by_filter", pcap_path=ref, display_filter=display_filter, limit=1000)
    assert not answer["has_more"]
    return [f["number"] for f in answer["frames"]], answer["source"]


async def test_a_growing_capture_is_read_up_to_its_last_frame_and_whole_once_stopped(
        capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("5greplay_oai.pcap")  # 753 Ethernet frames: NGAP, PFCP, GTP-U, HTTP
    expected = frames(sent, tmp_path)
    async with mcp_client(capture_daemon.env) as client, trio.open_nursery() as nursery:
        started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=120)
        ref = f"capture:{started['capture_id']}"
        nursery.start_soon(trio.to_thread.run_sync, lambda: veth.replay(sent, pps=SLOW_PPS))
        with trio.fail_after(30):
            while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < 150:
                await trio.sleep(0.2)

        # Half-way: the answer covers the frames written so far, says up to which one, and matches tshark
        # on the file it read (a copy of the complete blocks, which never changes under the tools).
        info = await ok(client, "pcap_info", pcap_path=ref)
        live, view = info["source"]["live"], info["source"]["pcap_path"]
        assert live["running"] and live["capture_id"] == started["capture_id"] and live["reference"] == ref
        assert 150 <= info["packet_count"] == live["up_to_frame"] == tshark_count(view) < len(expected), info
        assert live["up_to_time"] == info["time_end"]
        assert f"up to frame {live['up_to_frame']}" in live["note"] and "still running" in live["note"]
        assert frames(view, tmp_path) == expected[:info["packet_count"]]  # the first frames sent, whole
        matched, source = await filter_matches(client, ref, "ngap || pfcp")
        assert matched and matched == tshark_frames(source["pcap_path"], "ngap || pfcp")
        assert source["live"]["up_to_frame"] >= info["packet_count"]

        with trio.fail_after(30):
            while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < len(expected):
                await trio.sleep(0.2)
        done = await ok(client, "stop_capture", capture_id=started["capture_id"])
        assert done["status"] == "stopped" and len(done["files"]) == 1

        # Stopped: the capture's own file, all of it.
        info = await ok(client, "pcap_info", pcap_path=ref)
        assert info["source"]["pcap_path"] == done["files"][0]
        assert info["packet_count"] == len(expected) == tshark_count(done["files"][0])
        assert not info["source"]["live"]["running"] and "has stopped" in info["source"]["live"]["note"]
        for display_filter in ("ngap", "pfcp", "http", "gtp"):
            matched, _ = await filter_matches(client, ref, display_filter)
            assert matched == tshark_frames(done["files"][0], display_filter) == tshark_frames(sent, display_filter)


async def test_a_ring_of_files_is_read_as_one_and_a_live_capture_is_a_timeline_source(
        capture_daemon: DaemonProcess, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("5greplay_oai.pcap")
    async with mcp_client(capture_daemon.env) as client:
        started = await ring_with_replay(client, veth, sent, duration_s=120)
        ref = f"capture:{started['capture_id']}"

        # Running, several files: the closed ones and the current one's complete blocks, merged in ring order.
        running = await ok(client, "capture_status", capture_id=started["capture_id"])
        assert len(running["files"]) > 1
        merged = await ok(client, "pcap_info", pcap_path=ref)
        assert merged["packet_count"] == 753 and merged["source"]["live"]["running"]
        timeline = await ok(client, "diagd_timeline", sources=[{"pcap": ref, "filter": "ngap"}], limit=2000)
        assert [r["frame"] for r in timeline["rows"]] == tshark_frames(merged["source"]["pcap_path"], "ngap")
        assert timeline["sources"][0]["source"] == f"pcap:{ref}"
        assert "up to frame 753" in timeline["sources"][0]["note"] and "still running" in timeline["sources"][0]["note"]

        done = await ok(client, "stop_capture", capture_id=started["capture_id"])
        whole = await ok(client, "pcap_info", pcap_path=ref)
        ring = [f for path in done["files"] for f in frames(path, tmp_path)]
        assert whole["packet_count"] == len(ring) == 753 and not whole["source"]["live"]["running"]
        assert frames(whole["source"]["pcap_path"], tmp_path) == ring == frames(sent, tmp_path)
        matched, _ = await filter_matches(client, ref, "pfcp")
        assert matched == tshark_frames(sent, "pfcp")


async def test_masking_applies_to_a_live_capture_and_other_groups_cannot_name_it(
        env: Env, veth: Veth, tmp_path: Path) -> None:
    sent = pcap("adrian_sandbox_n2.pcap")  # 44 frames, 3 UEs registering (IMSIs in the NAS)
    imsis = set(subprocess.run(["tshark", "-n", "-r", sent, "-o", "nas-5gs.null_decipher:TRUE", "-T", "fields",
                                "-e", "nas_5gs.mm.suci.msin"], capture_output=True, text=True,
                               check=True).stdout.split())
    assert imsis
    env.write_config(env.config.read_text() + "\n[pcap]\nmask_subscriber_ids = true\n")
    daemon = start_capture_daemon(env, veth)
    try:
        async with mcp_client(env) as client:
            started = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=120)
            ref = f"capture:{started['capture_id']}"
            await trio.to_thread.run_sync(veth.replay, sent)
            with trio.fail_after(30):
                while (await ok(client, "capture_status", capture_id=started["capture_id"]))["packets"] < 44:
                    await trio.sleep(0.2)
            for tool, args in (("ngap_ue_sessions", {}), ("pcap_timeline", {"fields": ["nas_5gs.mm.suci.msin"]})):
                answer = await ok(client, tool, pcap_path=ref, **args)
                assert answer["source"]["live"]["running"]
                text = repr(answer)
                assert not [i for i in imsis if i in text], (tool, text[:2000])
                if tool == "pcap_timeline":  # the values are there, masked
                    shown = {r["nas_5gs.mm.suci.msin"] for r in answer["rows"] if r.get("nas_5gs.mm.suci.msin")}
                    assert shown and all(set(str(v)) <= {"*", "[", "]", "'", ",", " "} for v in shown), shown
            await ok(client, "stop_capture", capture_id=started["capture_id"])
        async with mcp_client(env, "--tools", "pcap") as pcap_only:
            refused = await error(pcap_only, "pcap_info", pcap_path=ref)
            assert refused["code"] == "PERMISSION_DENIED" and "capture" in refused["details"]["hint"], refused
    finally:
        daemon.stop()


async def test_views_count_in_the_disk_budget_and_are_made_only_when_they_fit(env: Env, veth: Veth) -> None:
    sent = pcap("5greplay_oai.pcap")  # about 316 kB; a ring of four 64 kB files keeps the newest ~260 kB
    budget = 500_000
    daemon = start_capture_daemon(env, veth, f"max_bytes = {budget}\n")
    exports = env.state / "capture" / "exports"
    try:
        async with mcp_client(env) as client:
            first = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192,
                             file_size_kb=64, ring_files=4)
            await trio.to_thread.run_sync(veth.replay, sent)
            with trio.fail_after(30):
                while (await ok(client, "capture_status", capture_id=first["capture_id"]))["packets"] < 753:
                    await trio.sleep(0.2)
            stopped = await ok(client, "stop_capture", capture_id=first["capture_id"])
            assert len(stopped["files"]) > 1
            ring = bytes_under(exports)
            assert ring < budget and (await ok(client, "list_captures"))["bytes_on_disk"] == ring

            # Read as one file, the ring needs a merged copy as big again: it does not fit, and nothing is made.
            refused = await error(client, "pcap_info", pcap_path=f"capture:{first['capture_id']}")
            assert refused["code"] == "BUSY" and refused["details"]["needed_bytes"] > refused["details"]["free_bytes"]
            assert bytes_under(exports) == ring and bytes_under(exports) <= budget

            # With room, the view is made beside the ring and counted.
            env.write_config(env.config.read_text().replace(f"max_bytes = {budget}", "max_bytes = 2000000"))
            assert env.run("reload").returncode == 0
            view = (await ok(client, "pcap_info", pcap_path=f"capture:{first['capture_id']}"))["source"]["pcap_path"]
            assert Path(view).parent == Path(stopped["dir"]) / "views"
            on_disk = bytes_under(exports)
            assert on_disk >= ring + Path(view).stat().st_size and on_disk <= 2_000_000
            assert (await ok(client, "list_captures"))["bytes_on_disk"] == on_disk

            # A start that needs the room: the finished capture goes, its view with it.
            second = await ok(client, "start_capture", interfaces=[veth.capture], duration_s=60, snaplen=8192,
                              file_size_kb=100, ring_files=14)
            gone = await ok(client, "capture_status", capture_id=first["capture_id"])
            assert gone["evicted"] and not gone["files"] and not Path(view).exists()
            await ok(client, "stop_capture", capture_id=second["capture_id"])  # (its size is measured as it ends)
            assert (await ok(client, "list_captures"))["bytes_on_disk"] == bytes_under(exports) <= 2_000_000
    finally:
        daemon.stop()
