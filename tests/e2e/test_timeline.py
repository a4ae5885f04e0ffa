"""diagd_timeline through the real path (SDK client -> diagd mcp shim -> daemon -> each back end), every row
compared with what the underlying tool says on its own: tshark -T fields for frames, the raw log file for
serial records, bpftrace's stored output and times, and `crash -s` `log` / `log -T` run directly for the kernel.
"""

from __future__ import annotations

import calendar
import itertools
import json
import math
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client

from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_mcp import mcp_client, payload
from tests.e2e.test_serial import AT_END, SimProcess
from tests.fixtures.vmcore import (
    VmcoreFixture,
    vmcore_fixture,  # noqa: F401 - the fixture
)
from tests.pcaps import PCAPS, pcap
from tests.support import pcap_oracle as oracle
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace

pytestmark = pytest.mark.e2e


async def ok(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    with trio.fail_after(150):
        result = await client.call_tool(tool, args)
    assert not result.is_error, payload(result)
    structured: dict[str, Any] = result.structured_content  # checked against outputSchema by the SDK
    assert structured == payload(result)
    return structured


async def error(client: Client, tool: str, **args: Any) -> dict[str, Any]:
    with trio.fail_after(60):
        result = await client.call_tool(tool, args)
    assert result.is_error
    return payload(result)


SBI_DECODE = "tcp.port==7777,http2"  # HTTP/2 SBI on 7777 is never detected by tshark 4.0 (MANIFEST.md)


def decode_as(path: str) -> list[str]:
    return [SBI_DECODE] if "sbi" in Path(path).name else []


def tshark_rows(path: str, display_filter: str = "") -> list[tuple[int, float, str]]:
    """(frame, epoch, Info) as tshark prints them (two passes, default preferences), in time order."""
    argv = ["tshark", "-n", "-2", "-r", path, *[a for r in decode_as(path) for a in ("-d", r)], "-T", "fields",
            "-E", "separator=\t", "-e", "frame.number", "-e", "frame.time_epoch", "-e", "_ws.col.Info"]
    argv += ["-Y", display_filter] if display_filter else []
    with tempfile.TemporaryDirectory() as wsconf:  # an empty config dir: nobody's profile changes the columns
        env = {"PATH": "/usr/bin:/bin", "TZ": "UTC", "WIRESHARK_CONFIG_DIR": wsconf, "HOME": wsconf}

        def run() -> str:  # kept on disk (tests/support/pcap_oracle.cached_text): the same rows are asked again
            return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout
        out = oracle.cached_text(Path(path), [*argv, oracle.config_key(env)], run)
    rows = []
    for line in out.splitlines():
        number, epoch, info = line.split("\t", 2)
        rows.append((int(number), round(float(epoch), 6), info))
    return sorted(rows, key=lambda r: r[1])  # stable: frame order on equal times, as diagd merges


async def test_frames_of_every_shared_capture_equal_tshark_fields_shifted_by_the_offset(
        serial_daemon: DaemonProcess) -> None:
    captures = sorted(p.name for p in PCAPS.glob("*.pcap*")) or [pcap("adrian_auth_failure.pcap")]
    async with mcp_client(serial_daemon.env) as client:
        for name in captures:
            path = pcap(name)
            expected = tshark_rows(path)
            answer = await ok(client, "diagd_timeline", limit=2000,
                              sources=[{"pcap": path, "fields": ["_ws.col.Info"], "offset_ms": 1500,
                                         **({"decode_as": decode_as(path)} if decode_as(path) else {})}])
            got = [(r["frame"], round(r["t"] - 1.5, 6), r["fields"]["_ws.col.Info"]) for r in answer["rows"]]
            src = answer["sources"][0]
            if src["cut"]:  # past the cap the rows stop before the cut source's last time
                assert got == expected[:len(got)], name
                assert all(r["t"] < answer["complete_until"] for r in answer["rows"])
            else:
                assert answer["total"] == len(expected) == src["rows"], name
                assert got == expected[:2000], name
            assert all(r["source"] == f"pcap:{name}" for r in answer["rows"])


async def test_a_window_and_filter_pick_the_frames_tshark_picks(serial_daemon: DaemonProcess) -> None:
    path = pcap("adrian_auth_failure.pcap")
    every = tshark_rows(path, "ngap")
    start, end = every[2][1], every[-3][1]
    async with mcp_client(serial_daemon.env) as client:
        answer = await ok(client, "diagd_timeline", start=start, end=end,
                          sources=[{"pcap": path, "filter": "ngap", "fields": ["_ws.col.Info"]}])
        assert [r["frame"] for r in answer["rows"]] == [r[0] for r in every if start <= r[1] <= end]
        nothing = await ok(client, "diagd_timeline", sources=[{"pcap": path, "filter": "sip"}])
        assert nothing["rows"] == [] and "no frame matched" in nothing["sources"][0]["note"]
        wrong = await error(client, "diagd_timeline", sources=[{"pcap": path, "filter": "ngap.nope == 1"}])
        assert wrong["code"] == "INVALID_FILTER" and wrong["message"].startswith("source pcap:")
        unknown = await error(client, "diagd_timeline", sources=[{"pcap": path, "filtre": "ngap"}])
        assert unknown["code"] == "INVALID_ARGUMENT" and unknown["details"]["did_you_mean"] == ["filter"]


async def test_serial_records_equal_the_raw_log_and_interleave_with_a_capture(
        serial_daemon: DaemonProcess, sim: SimProcess) -> None:
    port = str(sim.link)
    path = pcap("adrian_auth_failure.pcap")
    first_frame = tshark_rows(path)[0][1]
    async with mcp_client(serial_daemon.env) as client:
        await ok(client, "configure_connection", port=port, baudrate=115200, line_ending="cr")
        await ok(client, "send_data", port=port, payload="AT+CSQ", stop_pattern=AT_END, timeout_ms=5000)
        await ok(client, "send_data", port=port, payload="AT", stop_pattern=AT_END, timeout_ms=5000)
        log_file = (await ok(client, "get_log", port=port))["log_file"]
        await ok(client, "configure_connection", port=port, action="close")
        records = [json.loads(line) for line in Path(log_file).read_text().splitlines()]
        # Shift the capture so that its first frame lands just after the session started.
        shift_ms = (records[0]["ts"] + 0.001 - first_frame) * 1000
        answer = await ok(client, "diagd_timeline", limit=2000, sources=[
            {"serial": port, "label": "modem"}, {"pcap": path, "offset_ms": shift_ms, "label": "core"}])
    rows = answer["rows"]
    assert [r["t"] for r in rows] == sorted(r["t"] for r in rows)
    serial = [r for r in rows if r["source"] == "modem"]
    assert [(r["record"], r["t"], r["dir"]) for r in serial] == [(i, round(rec["ts"], 6), rec["dir"])
                                                                   for i, rec in enumerate(records)]
    data = [(r["dir"], r["bytes"]) for r in serial if r["dir"] != "event"]
    assert data == [(rec["dir"], len(rec["hex"]) // 2) for rec in records if rec["dir"] != "event"]
    assert any(r["dir"] == "tx" and "AT+CSQ" in r["data"] for r in serial)
    core = [r for r in rows if r["source"] == "core"]
    assert core[0]["t"] == pytest.approx(records[0]["ts"] + 0.001, abs=2e-6)
    assert rows.index(core[0]) > 0 and rows[0]["source"] == "modem"  # interleaved, not appended
    assert {s["source"]: s["rows"] for s in answer["sources"]} == {"modem": len(records), "core": len(core)}


@needs_bpftrace
async def test_bpftrace_lines_carry_their_arrival_times(serial_daemon: DaemonProcess) -> None:
    ensure_tracefs()
    async with mcp_client(serial_daemon.env) as client:
        before = time.time()
        started = await ok(client, "exec_program", program='interval:ms:100 { printf("tick %d\\n", @n++); }',
                           timeout=1)
        done = await ok(client, "get_result", execution_id=started["execution_id"], wait_s=20, until="done",
                        times=True)
        after = time.time()
        answer = await ok(client, "diagd_timeline", sources=[{"bpftrace": started["execution_id"]}])
    times = done["line_ts"]
    assert len(times) == len(done["output"]) >= 3 and times == sorted(times) and before <= times[0] <= after
    assert [(r["line"], r["output"], r["t"]) for r in answer["rows"]] == [
        (i, line, t) for i, (line, t) in enumerate(zip(done["output"], times, strict=True))]
    stored = serial_daemon.env.state / "bpftrace" / started["execution_id"]
    assert [float(x) for x in (stored / "times.txt").read_text().split()] == times
    assert (stored / "output.txt").read_text().splitlines() == done["output"]


def crash_direct(fixture: VmcoreFixture, out: Path) -> tuple[list[str], list[str]]:
    """`log` and `log -T` of crash run directly (redirected to files: only the commands' own output)."""
    script = f"log > {out}/log.txt\nlog -T > {out}/log_t.txt\nquit\n"
    subprocess.run(["crash", "-s", str(fixture.vmlinux), str(fixture.vmcore)], input=script, capture_output=True,
                   text=True, timeout=300, check=True, env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
    return (out / "log.txt").read_text().splitlines(), (out / "log_t.txt").read_text().splitlines()


@pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed")
async def test_kernel_log_rows_match_crash_log_minus_t_run_directly(
        env: Env, tmp_path: Path, vmcore_fixture: VmcoreFixture) -> None:  # noqa: F811 - the fixture
    daemon = start_daemon(env, {"TZ": "UTC"})
    try:
        async with mcp_client(daemon.env) as client:
            session = await ok(client, "open_vmcore_session", vmcore_path=str(vmcore_fixture.vmcore),
                               vmlinux_path=str(vmcore_fixture.vmlinux))
            answer = await ok(client, "diagd_timeline", limit=2000,
                              sources=[{"crash": session["session_id"], "label": "kernel"}])
    finally:
        daemon.stop()
    relative, ctime = crash_direct(vmcore_fixture, tmp_path)
    rows = answer["rows"]
    assert [r["line"] for r in rows] == list(range(len(relative))) and len(rows) > 10
    assert rows[-1]["text"].startswith("---[ end Kernel panic") and {r["source"] for r in rows} == {"kernel"}
    # The rows keep the log's record order; where printk's clock steps back (crash's own prefixes say where),
    # the source summary counts it rather than the merge reordering the log.
    uptimes = [float(rel[1:rel.index("]")]) for rel in relative if rel.startswith("[")]
    steps_back = sum(1 for a, b in itertools.pairwise(uptimes) if b < a)
    assert answer["sources"][0].get("steps_back", 0) == steps_back
    assert sum(1 for a, b in itertools.pairwise(rows) if b["t"] < a["t"]) == steps_back
    for row, rel, wall in zip(rows, relative, ctime, strict=True):
        assert rel.endswith(row["text"])
        if not rel.startswith("["):
            continue  # a continuation line: the time of its record
        # Seconds since boot are crash's `log` prefix; the wall time floors to the second `log -T` prints.
        assert float(rel[1:rel.index("]")]) == row["uptime"]
        # Compared as times, not text: crash pads a one-digit day with a space (ctime), strftime with a zero.
        shown = calendar.timegm(time.strptime(wall[1:wall.index("]")], "%a %b %d %H:%M:%S UTC %Y"))
        assert shown == math.floor(row["t"] + 1e-7), (wall, row["t"])
    assert "boot date" in answer["sources"][0]["note"]
