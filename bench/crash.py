"""crash/drgn back-end benchmark on the real vmcore fixture (tests/fixtures/make-vmcore.sh builds it).

Run from the repository root:

    .venv/bin/python bench/crash.py [--repeats 2] [--calls 50] [--json]

It starts its own isolated daemon (temporary runtime/state/config), talks to it through the MCP SDK
client + `diagd mcp` shim (the path an MCP host takes), and measures in one run:

1. A bare `crash -s vmlinux vmcore` start (pexpect, until the first prompt) against diagd's first
   `open_vmcore_session` of the same dump (identity check + crash + drgn worker + `set scroll off`,
   context and `sys`), alternating, after one warm-up so both read a warm page cache. Target: the
   open takes <= 1.05x the bare start (median of --repeats each).
2. How soon drgn answers (`run_drgn_command`) after the open started, while crash is still loading.
3. Reopening an open dump (is_new false): p50 through the client. Target <= 10 ms.
4. A cached crash command (`sys`) and a trivial drgn call: p50 through the client. Target <= 5 ms each.
5. Memory per session: RSS of crash + the drgn worker.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import trio
from _daemon import DIAGD, isolated_daemon
from _proc import vmcore_fixture
from mcp import Client
from mcp.client.stdio import StdioServerParameters


def bare_crash_start(vmcore: Path, vmlinux: Path) -> float:
    started = time.monotonic()
    child = pexpect.spawn("crash", ["-s", "--no_crashrc", str(vmlinux), str(vmcore)], echo=False, timeout=120,
                          env={**os.environ, "TERM": "dumb"})
    child.expect_exact(b"crash> ")
    elapsed = time.monotonic() - started
    child.sendline(b"quit")
    child.expect(pexpect.EOF)
    child.close()
    return elapsed


class Bench:
    def __init__(self, client: Client, vmcore: Path, vmlinux: Path) -> None:
        self.client = client
        self.vmcore, self.vmlinux = vmcore, vmlinux

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, args)
        payload: dict[str, Any] = json.loads(result.content[0].text)
        if result.is_error:
            raise RuntimeError(f"{tool}: {payload}")
        return payload

    async def timed_open(self) -> tuple[float, float | None, str]:
        """(open seconds, first drgn answer seconds after the open started, session id)."""
        started = time.monotonic()
        opened: dict[str, Any] = {}
        drgn_at: list[float] = []

        async def open_it() -> None:
            opened.update(await self.call("open_vmcore_session", vmcore_path=str(self.vmcore),
                                          vmlinux_path=str(self.vmlinux)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(open_it)
            while not opened and not drgn_at:
                sessions = (await self.call("list_vmcore_sessions"))["sessions"]
                opening = [s for s in sessions if s["state"] == "opening"]
                if opening:
                    await self.call("run_drgn_command", code="prog['init_task'].pid",
                                    session_id=opening[0]["session_id"])
                    if not opened:
                        drgn_at.append(time.monotonic() - started)
                    break
                await trio.sleep(0.02)
        return time.monotonic() - started, drgn_at[0] if drgn_at else None, opened["session_id"]

    async def p50(self, n: int, tool: str, **args: Any) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            await self.call(tool, **args)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


async def run(repeats: int, calls: int, env: dict[str, str], vmcore: Path, vmlinux: Path) -> dict[str, Any]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env)
    async with Client(params, mode="legacy") as client:
        bench = Bench(client, vmcore, vmlinux)
        await trio.to_thread.run_sync(bare_crash_start, vmcore, vmlinux)  # warm-up: page cache
        bare, opens, drgn_first = [], [], []
        session_id = ""
        for i in range(repeats):
            bare.append(await trio.to_thread.run_sync(bare_crash_start, vmcore, vmlinux))
            open_s, drgn_s, session_id = await bench.timed_open()
            opens.append(open_s)
            if drgn_s is not None:
                drgn_first.append(drgn_s)
            if i < repeats - 1:
                await bench.call("close_vmcore_session", session_id=session_id)
        reopen = await bench.p50(calls, "open_vmcore_session", vmcore_path=str(vmcore), vmlinux_path=str(vmlinux))
        await bench.call("run_crash_command", command="sys", session_id=session_id)
        cached = await bench.p50(calls, "run_crash_command", command="sys", session_id=session_id)
        drgn = await bench.p50(calls, "run_drgn_command", code="prog['init_task'].pid", session_id=session_id)
        ping = await bench.p50(calls, "list_vmcore_sessions")
        status = await bench.call("diagd_status")
        details = next(a["details"] for a in status["actors"] if a["kind"] == "crash")
        return {"bare_crash_start_s": statistics.median(bare), "first_open_s": statistics.median(opens),
                "drgn_first_answer_s": statistics.median(drgn_first) if drgn_first else None,
                "reopen_ms": reopen * 1000, "cached_crash_ms": cached * 1000, "drgn_call_ms": drgn * 1000,
                "trivial_call_ms": ping * 1000, "crash_rss_mb": details["crash_rss_bytes"] / 2**20,
                "drgn_rss_mb": details["drgn_rss_bytes"] / 2**20, "repeats": repeats, "calls": calls,
                "bare_runs_s": bare, "open_runs_s": opens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    vmcore, vmlinux = vmcore_fixture()
    config = f'[daemon]\nallowed_dirs = ["{vmcore.parent}"]\n'
    with isolated_daemon("crash", config=config) as daemon:
        r = trio.run(run, args.repeats, args.calls, daemon.env, vmcore, vmlinux)
    rows = [
        ("bare crash -s start", r["bare_crash_start_s"] * 1000, None, ""),
        ("first open_vmcore_session", r["first_open_s"] * 1000, r["bare_crash_start_s"] * 1000 * 1.05,
         f"{r['first_open_s'] / r['bare_crash_start_s']:.3f}x bare (target <= 1.05x)"),
        ("drgn answers after open start", (r["drgn_first_answer_s"] or float("nan")) * 1000, 1000.0,
         "while crash still loads"),
        ("reopen of an open dump (p50)", r["reopen_ms"], 10.0, ""),
        ("cached crash command (p50)", r["cached_crash_ms"], 5.0, "sys"),
        ("drgn call (p50)", r["drgn_call_ms"], 5.0, "prog['init_task'].pid"),
        ("trivial call (p50, floor)", r["trivial_call_ms"], None, "list_vmcore_sessions"),
        ("crash RSS per session", r["crash_rss_mb"], None, "MB"),
        ("drgn worker RSS per session", r["drgn_rss_mb"], None, "MB"),
    ]
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(f"{'metric':<32} {'value':>10} {'target':>10} {'ratio':>7}  note")
    for name, value, target, note in rows:
        unit_value = f"{value:10.1f}" if "MB" in note else f"{value:8.2f}ms"
        target_s = f"{target:8.2f}ms" if target else " " * 10
        ratio = f"{value / target:7.2f}" if target else " " * 7
        print(f"{name:<32} {unit_value:>10} {target_s:>10} {ratio}  {note}")
    print(f"runs: bare {[round(x, 2) for x in r['bare_runs_s']]} s, open {[round(x, 2) for x in r['open_runs_s']]} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
