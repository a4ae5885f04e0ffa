"""Daemon memory: idle, after a pcap session, under big crash/drgn outputs (issue 12).

Run from the repository root:

    .venv/bin/python bench/memory.py [--outputs 20] [--mb 40] [--settle 60] [--pcap FILE] [--json]

It starts its own isolated daemon and records its RSS (VmRSS of `diagd serve`, children such as
sharkd, crash and drgn not included), talking through the MCP SDK client + `diagd mcp` shim:

0. idle: right after start, no client (target <= 60 MB); then with an MCP client connected after
   one diagd_status call (the MCP SDK is imported on the first MCP connection; reported);
1. after a pcap session on --pcap (default: bench/pcap.py's 55 MB capture when cached, else
   magma_gx_gy_combined_04.pcapng): field list/search, pcap_info, frames_by_filter, timeline, frame
   details, text search, ngap summaries (target <= 90 MB);
2. crash baseline: after the vmcore open and a few small calls;
3. after --outputs crash commands of ~--mb MB each (`rd -64 _stext <count>`, force_execute so none is
   answered from the cache);
4. after --outputs drgn calls printing ~--mb MB each (100-byte lines);
5. settled: polled every second until it is back under the pcap-session target, for at most
   --settle seconds (target: under it within 60 s; also within 50 MB of the crash baseline).

It also checks that the last output of each
kind pages to its end and that its size is what was produced, and reports the daemon's open fds and
child processes at the start and at the end (no zombie may remain).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import trio
from _daemon import DIAGD, isolated_daemon
from _proc import children, fd_count, rss_mb, vmcore_fixture
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.pcaps import PCAPS  # the test corpus' cache (_proc put the repository on sys.path)

TARGET_MB = 50.0  # settled growth over the crash baseline
IDLE_TARGET_MB = 60.0
SESSION_TARGET_MB = 90.0  # after a pcap session; and where big outputs must come back to within 60 s
BENCH_PCAP = Path("/tmp/diagd-bench-cache/magma_gx_gy_combined_04-x19-day0-r1.pcapng")  # bench/pcap.py builds it
SHARED_PCAP = PCAPS / "magma_gx_gy_combined_04.pcapng"
RD_BYTES_PER_QWORD = 36.5  # `rd -64` prints 2 qwords per ~73-byte line






class Bench:
    def __init__(self, client: Client, pid: int) -> None:
        self.client = client
        self.pid = pid

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        with trio.fail_after(300):
            result = await self.client.call_tool(tool, args)
        payload: dict[str, Any] = json.loads(result.content[0].text)
        if result.is_error:
            raise RuntimeError(f"{tool}: {json.dumps(payload)[:2000]}")
        return payload

    async def last_page(self, command_id: str, total_lines: int) -> dict[str, Any]:
        return await self.call("get_command_output", command_id=command_id, offset=max(0, total_lines - 3), limit=3)


async def pcap_session(bench: Bench, pcap: Path) -> dict[str, Any]:
    """One call of each pcap kind on the capture; the daemon's RSS after it (sharkd not counted)."""
    cap = str(pcap)
    started = time.monotonic()
    await bench.call("pcap_list_fields", query="ngap")
    await bench.call("pcap_fields_search", prefix="ngap.")
    await bench.call("pcap_info", pcap_path=cap)
    for flt in ("diameter", "gtp", "s1ap", ""):
        await bench.call("pcap_frames_by_filter", pcap_path=cap, display_filter=flt, limit=500)
    await bench.call("pcap_timeline", pcap_path=cap, display_filter="diameter",
                     fields=["frame.number", "diameter.cmd.code", "diameter.Session-Id"], limit=2000)
    for first in range(1, 400, 20):
        await bench.call("pcap_frame_detail", pcap_path=cap, frame_numbers=list(range(first, first + 5)))
    await bench.call("pcap_text_search", pcap_path=cap, query="Session-Id", limit=200)
    await bench.call("pcap_text_search", pcap_path=cap, query="zzz-not-there", limit=200)
    await bench.call("ngap_ue_sessions", pcap_path=cap)
    await bench.call("ngap_pdu_session_summary", pcap_path=cap)
    session_s = time.monotonic() - started
    await trio.sleep(3)  # the heap is trimmed 2 s after the last call
    status = await bench.call("diagd_status")
    return {"pcap": cap, "pcap_session_s": session_s,
            "after_pcap_mb": rss_mb(bench.pid), "status_rss_mb": status["daemon"]["rss_bytes"] / 2**20,
            "sharkd_workers": [w for a in status["actors"] for w in a["details"].get("workers", [])]}


async def settle(pid: int, under_mb: float, max_s: float) -> tuple[float, float]:
    """(RSS, seconds waited) once the RSS is under `under_mb`, or after max_s."""
    started = time.monotonic()
    while rss_mb(pid) > under_mb and time.monotonic() - started < max_s:  # noqa: ASYNC110  (polling /proc)
        await trio.sleep(1)
    return rss_mb(pid), time.monotonic() - started


async def run(env: dict[str, str], pid: int, vmcore: Path, vmlinux: Path, outputs: int, mb: float,
              settle_s: float, pcap: Path | None) -> dict[str, Any]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env)
    idle = rss_mb(pid)
    size = os.stat(pcap).st_size if pcap is not None else 0
    async with Client(params, mode="legacy") as client:
        bench = Bench(client, pid)
        await bench.call("diagd_status")
        connected = rss_mb(pid)
        pcap_r = {**await pcap_session(bench, pcap), "pcap_bytes": size} if pcap is not None else {}
        opened = await bench.call("open_vmcore_session", vmcore_path=str(vmcore), vmlinux_path=str(vmlinux))
        sid = opened["session_id"]
        for _ in range(3):
            await bench.call("run_crash_command", command="sys", session_id=sid, force_execute=True)
            await bench.call("run_drgn_command", code="prog['init_task'].pid", session_id=sid)
        await trio.sleep(1)
        baseline, fds_before, kids_before = rss_mb(pid), fd_count(pid), children(pid)

        count = int(mb * 1e6 / RD_BYTES_PER_QWORD)
        started = time.monotonic()
        crash_rss = []
        last_crash: dict[str, Any] = {}
        for _ in range(outputs):
            last_crash = await bench.call("run_crash_command", command=f"rd -64 _stext {count}", session_id=sid,
                                          force_execute=True)
            crash_rss.append(rss_mb(pid))
        crash_s = time.monotonic() - started

        lines = int(mb * 1e6 / 100)
        code = f"import sys\nfor _ in range({lines // 10000}):\n    sys.stdout.write(('x' * 99 + '\\n') * 10000)"
        started = time.monotonic()
        drgn_rss = []
        last_drgn: dict[str, Any] = {}
        for _ in range(outputs):
            last_drgn = await bench.call("run_drgn_command", code=code, session_id=sid)
            drgn_rss.append(rss_mb(pid))
        drgn_s = time.monotonic() - started

        crash_tail = await bench.last_page(last_crash["command_id"], last_crash["total_lines"])
        drgn_tail = await bench.last_page(last_drgn["command_id"], last_drgn["total_lines"])
        settled, settled_after_s = await settle(pid, SESSION_TARGET_MB, settle_s)
        out_dir = Path(env["DIAGD_STATE_DIR"]) / "crash" / sid
        crash_file = out_dir / f"cmd-{int(last_crash['command_id'].rsplit(':', 1)[1]):06d}.out"
        drgn_file = out_dir / f"cmd-{int(last_drgn['command_id'].rsplit(':', 1)[1]):06d}.out"
        await bench.call("close_vmcore_session", session_id=sid)
        await trio.sleep(1)
        return {
            "idle_mb": idle, "connected_mb": connected, **pcap_r, "settled_after_s": settled_after_s,
            "baseline_mb": baseline, "peak_mb": max(crash_rss + drgn_rss), "after_crash_mb": crash_rss[-1],
            "after_drgn_mb": drgn_rss[-1], "settled_mb": settled, "settle_s": settle_s,
            "growth_mb": settled - baseline, "target_mb": TARGET_MB, "outputs": outputs, "output_mb": mb,
            "crash_output_bytes": crash_file.stat().st_size, "crash_total_lines": last_crash["total_lines"],
            "crash_tail_ok": bool(crash_tail["output"]) and not crash_tail["has_more"],
            "drgn_output_bytes": drgn_file.stat().st_size, "drgn_total_lines": last_drgn["total_lines"],
            "drgn_tail_ok": bool(drgn_tail["output"]) and not drgn_tail["has_more"],
            "crash_phase_s": crash_s, "drgn_phase_s": drgn_s,
            "fds_before": fds_before, "fds_after": fd_count(pid),
            "children_before": kids_before, "children_after": children(pid),
            "crash_rss_mb": crash_rss, "drgn_rss_mb": drgn_rss,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--outputs", type=int, default=20)
    parser.add_argument("--mb", type=float, default=40.0)
    parser.add_argument("--settle", type=float, default=60.0)
    parser.add_argument("--pcap", type=Path, default=BENCH_PCAP if BENCH_PCAP.exists() else SHARED_PCAP)
    parser.add_argument("--no-pcap", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    vmcore, vmlinux = vmcore_fixture()
    pcap = None if args.no_pcap or not args.pcap.exists() else args.pcap.resolve()
    dirs = [str(vmcore.parent), *([str(pcap.parent)] if pcap else [])]
    config = f'[daemon]\nallowed_dirs = {json.dumps(dirs)}\n[crash]\ncommand_timeout_s = 240\n'
    if os.environ.get("DIAGD_LANDLOCK") in ("off", "0"):  # Landlock forced off: drgn code runs unconfined
        config += "allow_unconfined = true\n"
    with isolated_daemon("memory", config=config) as daemon:
        time.sleep(1)
        r = trio.run(run, daemon.env, daemon.proc.pid, vmcore, vmlinux, args.outputs, args.mb, args.settle, pcap)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    return report(r)


def met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report(r: dict[str, Any]) -> int:
    idle_ok = r["idle_mb"] <= IDLE_TARGET_MB
    pcap_ok = r.get("after_pcap_mb", 0.0) <= SESSION_TARGET_MB
    back_ok = r["settled_mb"] <= SESSION_TARGET_MB and r["settled_after_s"] <= 60
    ok = r["growth_mb"] <= TARGET_MB
    zombies = [c for c in r["children_after"] if c[1] == "Z"]
    print(f"daemon RSS idle, no client     {r['idle_mb']:8.1f} MB  (target <= {IDLE_TARGET_MB:g}: {met(idle_ok)})")
    print(f"MCP client connected           {r['connected_mb']:8.1f} MB  (the MCP SDK loads on the first connection)")
    if "after_pcap_mb" in r:
        workers = ", ".join(f"{w['role']} {w['rss_bytes'] / 2**20:.0f} MB" for w in r["sharkd_workers"]
                            if w["rss_bytes"])
        print(f"after a pcap session           {r['after_pcap_mb']:8.1f} MB  (target <= {SESSION_TARGET_MB:g}: "
              f"{met(pcap_ok)}; {r['pcap_bytes'] / 1e6:.0f} MB capture, {r['pcap_session_s']:.1f} s; "
              f"not counted: {workers})")
    print(f"crash session open, baseline   {r['baseline_mb']:8.1f} MB")
    print(f"after {r['outputs']} crash outputs       {r['after_crash_mb']:8.1f} MB  "
          f"({r['crash_output_bytes'] / 1e6:.1f} MB, {r['crash_total_lines']} lines each; {r['crash_phase_s']:.1f} s)")
    print(f"after {r['outputs']} drgn outputs        {r['after_drgn_mb']:8.1f} MB  "
          f"({r['drgn_output_bytes'] / 1e6:.1f} MB, {r['drgn_total_lines']} lines each; {r['drgn_phase_s']:.1f} s)")
    print(f"peak                           {r['peak_mb']:8.1f} MB")
    print(f"settled after {r['settled_after_s']:4.1f} s            {r['settled_mb']:8.1f} MB  "
          f"(target <= {SESSION_TARGET_MB:g} within 60 s: {met(back_ok)}; growth {r['growth_mb']:+.1f} MB, "
          f"target <= {TARGET_MB:g}: {met(ok)})")
    print(f"last pages readable            crash {r['crash_tail_ok']}, drgn {r['drgn_tail_ok']}")
    print(f"daemon fds                     {r['fds_before']} before, {r['fds_after']} after the session closed")
    print(f"children after close           {r['children_after']} (zombies: {len(zombies)})")
    return 0 if ok and not zombies else 1


if __name__ == "__main__":
    sys.exit(main())
