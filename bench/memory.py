"""Daemon memory under big crash/drgn outputs, on the real vmcore fixture (tests/fixtures/make-vmcore.sh).

Run from the repository root:

    .venv/bin/python bench/memory.py [--outputs 20] [--mb 40] [--settle 5] [--json]

It starts its own isolated daemon, opens one crash session through the MCP SDK client + `diagd mcp`
shim and records the daemon's RSS (VmRSS of `diagd serve`, children not included):

1. idle baseline: after the open and a few small calls;
2. after --outputs crash commands of ~--mb MB each (`rd -64 _stext <count>`, force_execute so none is
   answered from the cache);
3. after --outputs drgn calls printing ~--mb MB each (100-byte lines);
4. --settle seconds later, idle.

Target: the settled RSS within 50 MB of the idle baseline. It also checks that the last output of each
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
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.vmcore import CACHE, SCRIPT, cached  # noqa: E402

TARGET_MB = 50.0
RD_BYTES_PER_QWORD = 36.5  # `rd -64` prints 2 qwords per ~73-byte line


def fixture_paths() -> tuple[Path, Path]:
    found = cached()
    if found is None:
        import subprocess

        subprocess.run(["bash", str(SCRIPT), str(CACHE)], check=True)
        found = cached()
        assert found is not None
    return found.vmcore, found.vmlinux


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def fd_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, comm) of every child of `pid` (all its threads' children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                stat = Path(f"/proc/{kid}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            found.append((int(kid), stat[stat.rindex(")") + 2], comm))
    return found


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


async def run(env: dict[str, str], pid: int, vmcore: Path, vmlinux: Path, outputs: int, mb: float,
              settle_s: float) -> dict[str, Any]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env)
    async with Client(params, mode="legacy") as client:
        bench = Bench(client, pid)
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
        await trio.sleep(settle_s)
        settled = rss_mb(pid)
        out_dir = Path(env["DIAGD_STATE_DIR"]) / "crash" / sid
        crash_file = out_dir / f"cmd-{int(last_crash['command_id'].rsplit(':', 1)[1]):06d}.out"
        drgn_file = out_dir / f"cmd-{int(last_drgn['command_id'].rsplit(':', 1)[1]):06d}.out"
        await bench.call("close_vmcore_session", session_id=sid)
        await trio.sleep(1)
        return {
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
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    vmcore, vmlinux = fixture_paths()
    config = f'[daemon]\nallowed_dirs = ["{vmcore.parent}"]\n[crash]\ncommand_timeout_s = 240\n'
    if os.environ.get("DIAGD_LANDLOCK") in ("off", "0"):  # Landlock forced off: drgn code runs unconfined
        config += "allow_unconfined = true\n"
    with isolated_daemon("memory", config=config) as daemon:
        r = trio.run(run, daemon.env, daemon.proc.pid, vmcore, vmlinux, args.outputs, args.mb, args.settle)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    ok = r["growth_mb"] <= TARGET_MB
    zombies = [c for c in r["children_after"] if c[1] == "Z"]
    print(f"daemon RSS idle baseline       {r['baseline_mb']:8.1f} MB")
    print(f"after {r['outputs']} crash outputs       {r['after_crash_mb']:8.1f} MB  "
          f"({r['crash_output_bytes'] / 1e6:.1f} MB, {r['crash_total_lines']} lines each; {r['crash_phase_s']:.1f} s)")
    print(f"after {r['outputs']} drgn outputs        {r['after_drgn_mb']:8.1f} MB  "
          f"({r['drgn_output_bytes'] / 1e6:.1f} MB, {r['drgn_total_lines']} lines each; {r['drgn_phase_s']:.1f} s)")
    print(f"peak                           {r['peak_mb']:8.1f} MB")
    print(f"{r['settle_s']:g} s later (idle)             {r['settled_mb']:8.1f} MB  growth {r['growth_mb']:+.1f} MB "
          f"(target <= {TARGET_MB:g}: {'met' if ok else 'MISSED'})")
    print(f"last pages readable            crash {r['crash_tail_ok']}, drgn {r['drgn_tail_ok']}")
    print(f"daemon fds                     {r['fds_before']} before, {r['fds_after']} after the session closed")
    print(f"children after close           {r['children_after']} (zombies: {len(zombies)})")
    return 0 if ok and not zombies else 1


if __name__ == "__main__":
    sys.exit(main())
