"""bpftrace benchmark: time to the first output line, through diagd and from raw bpftrace.

Run from the repository root, as root (bpftrace 0.17 needs it):

    .venv/bin/python bench/bpftrace.py [--repeats N] [--json]

It starts its own isolated daemon (`diagd serve` with DIAGD_RUNTIME_DIR, DIAGD_STATE_DIR and
DIAGD_CONFIG in fresh temporary directories) and removes it afterwards, also on failure.

For each program, runs alternate (raw, diagd, raw, diagd, ...) so both see the same machine state:

- raw: wall time from spawning `bpftrace -e PROGRAM` (stdout a pipe, as the daemon has it) to
  its first output line after "Attaching N probes...".
- diagd: wall time from sending `exec_program` with `wait_s` on the daemon's MCP socket
  (newline-delimited JSON-RPC, a blocking client) to its reply holding the first output line
  (`first_page`: one call, as an agent makes it). That includes the MCP server, argument checks, the
  actor start, the spawn, and the wait's wake-up. (The SDK client + `diagd mcp` shim add ~1 ms per call on top;
  see bench/foundation.py.)

Output: per program the median and p90 of both and the ratio diagd / raw of the medians
(target <= 1.2).

diagd runs a confined run on its standby launcher (actors/sandbox/standby.py: a launcher started and
imported before the run); the daemon's first run is cold and starts it, hence the warm-up run per
program. --cold adds a second daemon with `[bpftrace] warm_launcher = false` to the same alternation
(raw, diagd, cold, raw, ...): every launcher started per run, as before the standby.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon

BPFTRACE = shutil.which("bpftrace") or "bpftrace"
TARGET_RATIO = 1.2
PROGRAMS = {
    "BEGIN printf": 'BEGIN { printf("hello\\n"); exit(); }',
    "interval 100 ms": 'interval:ms:100 { printf("tick\\n"); exit(); }',
    "tracepoint sched_switch": 'tracepoint:sched:sched_switch { printf("%s\\n", comm); exit(); }',
}


class RawMCP:
    """Blocking newline-delimited JSON-RPC on the daemon's MCP socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.buffer = b""
        self.ids = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench-bpftrace", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        self._send({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params})
        while True:
            while b"\n" not in self.buffer:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise RuntimeError("the daemon closed the connection")
                self.buffer += chunk
            line, _, self.buffer = self.buffer.partition(b"\n")
            reply: dict[str, Any] = json.loads(line)
            if reply.get("id") == self.ids:
                return reply

    def tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.request("tools/call", {"name": name, "arguments": arguments})["result"]
        payload: dict[str, Any] = json.loads(result["content"][0]["text"])
        if result.get("isError"):
            raise RuntimeError(f"{name}: {payload}")
        return payload


# --------------------------------------------------------------------------- the two measurements


def raw_first_line_ms(program: str) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen([BPFTRACE, "-e", program], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if not line.startswith(b"Attaching "):
                return (time.perf_counter() - start) * 1000
        raise RuntimeError(f"bpftrace printed nothing for {program!r}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.stdout.read()
        proc.wait(timeout=30)


def diagd_first_line_ms(client: RawMCP, program: str) -> float:
    start = time.perf_counter()
    started = client.tool("exec_program", {"program": program, "timeout": 10, "wait_s": 10})
    page = started["first_page"]
    while not page["lines_returned"]:
        if page["status"] != "running":
            raise RuntimeError(f"no output from {program!r}: {page}")
        page = client.tool("get_result", {"execution_id": started["execution_id"], "wait_s": 10, "limit": 1})
    elapsed = (time.perf_counter() - start) * 1000
    # Not timed: let it end, so the next run never meets the concurrency limit.
    client.tool("get_result", {"execution_id": started["execution_id"], "wait_s": 15, "until": "done", "limit": 1})
    return elapsed


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cold", action="store_true", help="also a daemon with warm_launcher = false")
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/bpftrace.py needs root (bpftrace 0.17 runs only as root)", file=sys.stderr)
        return 2
    rows = []
    with contextlib.ExitStack() as stack:
        client = RawMCP(stack.enter_context(isolated_daemon("bt")).mcp_socket)
        cold = None
        if opts.cold:
            cold = RawMCP(stack.enter_context(isolated_daemon("btc", config="[bpftrace]\nwarm_launcher = false\n"))
                          .mcp_socket)
        for name, program in PROGRAMS.items():
            raw_first_line_ms(program)  # warm-up: page cache, BTF, the daemon's first spawn
            diagd_first_line_ms(client, program)  # (the first confined run is cold: it starts the standby)
            if cold is not None:
                diagd_first_line_ms(cold, program)
            raw, diagd, cold_ms = [], [], []
            for _ in range(opts.repeats):
                raw.append(raw_first_line_ms(program))
                diagd.append(diagd_first_line_ms(client, program))
                if cold is not None:
                    cold_ms.append(diagd_first_line_ms(cold, program))
            row = {
                "program": name, "runs": opts.repeats,
                "raw_p50_ms": round(statistics.median(raw), 1), "diagd_p50_ms": round(statistics.median(diagd), 1),
                "raw_p90_ms": round(pct(raw, 0.9), 1), "diagd_p90_ms": round(pct(diagd, 0.9), 1),
                "ratio": round(statistics.median(diagd) / statistics.median(raw), 3),
            }
            if cold_ms:
                row["cold_p50_ms"] = round(statistics.median(cold_ms), 1)
                row["cold_ratio"] = round(statistics.median(cold_ms) / statistics.median(raw), 3)
            rows.append(row)
    if opts.json:
        print(json.dumps({"target_ratio": TARGET_RATIO, "results": rows}, indent=2))
    else:
        print(f"time to the first output line, {opts.repeats} alternating runs each (target ratio <= {TARGET_RATIO})")
        cold_head = f"{'cold p50':>10}{'cold':>7}" if opts.cold else ""
        print(f"{'program':<26}{'raw p50':>10}{'diagd p50':>11}{'raw p90':>10}{'diagd p90':>11}{'ratio':>8}{cold_head}")
        for r in rows:
            mark = "" if r["ratio"] <= TARGET_RATIO else "  (over target)"
            cold_cells = f"{r['cold_p50_ms']:>8.1f}ms{r['cold_ratio']:>7.2f}" if "cold_p50_ms" in r else ""
            print(f"{r['program']:<26}{r['raw_p50_ms']:>8.1f}ms{r['diagd_p50_ms']:>9.1f}ms"
                  f"{r['raw_p90_ms']:>8.1f}ms{r['diagd_p90_ms']:>9.1f}ms{r['ratio']:>8.2f}{cold_cells}{mark}")
    return 0 if all(r["ratio"] <= TARGET_RATIO for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
