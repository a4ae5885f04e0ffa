"""A call that waits for a capture to load reports how far the load is (bytes sharkd has read of the
file, every half second), not 0 % until it is done: a real daemon, sharkd and MCP SDK client."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from diagd.actors import system
from tests.conftest import DaemonProcess, start_daemon
from tests.e2e.test_mcp import mcp_client, payload
from tests.e2e.test_pcap import make_env
from tests.support.progress import delivered

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("sharkd") is None, reason="sharkd (wireshark-common) is not installed"),
]


def test_read_position_is_how_far_a_process_has_read_a_file(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"x" * 10000)
    script = "import sys; f = open(sys.argv[1], 'rb', buffering=0); f.read(1234); print(flush=True); sys.stdin.read()"
    reader = subprocess.Popen([sys.executable, "-c", script, str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == b"\n"
        assert system.read_position(reader.pid, data) == 1234
        assert system.read_position(reader.pid, tmp_path / "other") is None
        assert system.read_position(os.getpid(), data) is None
    finally:
        reader.kill()
        reader.wait()
    assert system.read_position(reader.pid, data) is None  # gone


@pytest.fixture(scope="module")
def slow_load(bigger: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~280 MB: a load of seconds, so that reports every 0.5 s fall inside it (`bigger`'s repeated SCTP
    associations dissect so cheaply that sharkd loads its 35 MB within the first half second here)."""
    out = tmp_path_factory.mktemp("slowload") / "slow-load.pcapng"
    subprocess.run(["mergecap", "-a", "-w", str(out), *[str(bigger)] * 8], check=True, capture_output=True)
    return out


async def test_a_call_waiting_for_the_load_reports_bytes_read(slow_load: Path, tmp_path: Path) -> None:
    bigger = slow_load
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{bigger.parent}"]\ncall_timeout_s = 300\n')
    daemon: DaemonProcess = start_daemon(env)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    size = bigger.stat().st_size
    try:
        async with mcp_client(env) as client:
            with trio.fail_after(300):
                result = await client.call_tool("pcap_frame_detail", {"pcap_path": str(bigger), "frame_numbers": [1]},
                                                progress_callback=on_progress)
                await delivered()
            assert not result.is_error, payload(result)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    assert seen and all(total == size for _, total, _ in seen), seen
    done = [progress for progress, _, _ in seen]
    assert done == sorted(set(done)) and done[-1] == size and seen[-1][2] == "capture loaded"  # MCP: increasing
    between = [(p, m) for p, _, m in seen if 0 < p < size]
    assert between, f"no report between 0 and {size} bytes: {seen}"
    assert all(m and m.startswith(f"loading {bigger.name}: ") and m.endswith(" MB read") for _, m in between)
    # Once capinfos has counted the file (beside the load: a big file's first answer has a head start, so
    # under load a report may come before the count, in bytes only) every report estimates frames by the
    # share of bytes read.
    count = int(subprocess.run(["capinfos", "-M", "-T", "-r", "-c", str(bigger)], capture_output=True, text=True,
                               check=True).stdout.split()[-1])
    estimates = [re.search(r": ~([\d,]+) of ([\d,]+) frames, ", m or "") for _, m in between]
    counted_from = next((i for i, found in enumerate(estimates) if found), None)
    assert counted_from is not None, f"no report estimates frames: {between}"
    for (done, m), found in zip(between[counted_from:], estimates[counted_from:], strict=True):
        assert found, m
        assert int(found.group(2).replace(",", "")) == count
        assert int(found.group(1).replace(",", "")) == count * int(done) // size


# (tool, arguments, fewest reports, begun): a call that answers before the load is done (pcap_info after
# at most INFO_WAIT_S, a two-pass filter from one tshark pass) still reports the load, in the same units.
# begun: the load was begun by the same call made before (pcap_info on a big fresh capture answers with the
# count and span before the capture's start, which goes on beside it: no load to report yet).
ANSWERED_WHILE_LOADING = [
    ("pcap_info", {}, 1, True),
    ("pcap_frames_by_filter", {"display_filter": "diameter.answer_in", "limit": 5}, 2, False),  # FT_FRAMENUM
]


@pytest.mark.parametrize(("tool", "arguments", "fewest", "begun"), ANSWERED_WHILE_LOADING,
                         ids=[t[0] for t in ANSWERED_WHILE_LOADING])
async def test_a_call_answered_while_loading_reports_the_load_in_bytes_of_the_file(
        slow_load: Path, tmp_path: Path, tool: str, arguments: dict[str, object], fewest: int, begun: bool) -> None:
    bigger = slow_load
    env = make_env(tmp_path / "d", f'[daemon]\nallowed_dirs = ["{bigger.parent}"]\ncall_timeout_s = 300\n')
    daemon: DaemonProcess = start_daemon(env)
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    try:
        async with mcp_client(env) as client:
            with trio.fail_after(300):
                if begun:
                    first = payload(await client.call_tool(tool, {"pcap_path": str(bigger), **arguments},
                                                           progress_callback=on_progress))
                    assert first["protocols_ready"] is False and first["packet_count"] > 0, first
                    assert seen == []  # answered before the capture's start: nothing loading to report
                    # The call measured is made while sharkd loads (the start, begun beside the answer,
                    # may still be spawning it on a loaded machine: nothing to report yet then).
                    while True:
                        status = payload(await client.call_tool("diagd_status", {}))
                        states = [w["state"] for a in status["actors"] if a["kind"] == "pcap"
                                  and a["details"].get("path") == str(bigger) for w in a["details"].get("workers", [])]
                        if "loading" in states:
                            break
                        await trio.sleep(0.02)
                result = await client.call_tool(tool, {"pcap_path": str(bigger), **arguments},
                                                progress_callback=on_progress)
                await delivered()
            assert not result.is_error, payload(result)
    finally:
        daemon.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)
    size = os.stat(bigger).st_size
    answer = payload(result)
    assert len(seen) >= fewest, (seen, {k: answer.get(k) for k in ("served_by", "protocols_ready", "warnings")})
    assert all(total == size for _, total, _ in seen), (size, seen)  # not 0 of 1, then 1 of 1
    done = [progress for progress, _, _ in seen]
    assert done == sorted(set(done)) and done[-1] <= size, seen
    assert all((m and m.startswith(f"loading {bigger.name}: ")) or m == "capture loaded" for _, _, m in seen), seen
