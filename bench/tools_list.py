"""Bytes of `tools/list` (and of the server instructions) per tool group, as a client receives them.

Hosts send the model each listed tool's name, description and inputSchema with every request, so
those model-facing bytes are a cost paid on every turn; the rest of the list (each tool's full
outputSchema, which hosts validate results with, its title and annotations) stays with the host.
This starts an isolated `diagd serve` with the default back ends and, for each selection (every
group, then each back end alone with diagd's own tools), runs `diagd mcp [--tools GROUP]` as an MCP
client would: initialize, then tools/list, over the real shim and socket. It prints the
model-facing bytes (`tool_listing.model_facing_bytes`: the result with each tool cut to those three
keys, compact JSON, as on the wire), a rough token estimate of them (bytes / 4), the whole result's
bytes and the instructions' bytes; the budgets hold the model-facing bytes: 30 KiB for the full
list and 14 KiB for pcap (diagd's own tools included).

    .venv/bin/python bench/tools_list.py [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from _daemon import DIAGD, BenchDaemon, isolated_daemon

from diagd.daemon.server.tool_listing import json_bytes, model_facing_bytes

SELECTIONS: tuple[str | None, ...] = (None, "pcap", "serial", "bpftrace", "crash", "diagd")
BUDGETS = {"all": 30 * 1024, "pcap": 14 * 1024}
INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "bench-tools-list", "version": "0"}}}


def _exchange(proc: subprocess.Popen[str], *messages: dict[str, Any]) -> dict[str, Any]:
    """Send the messages, return the next line's JSON (the answer to the last request)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
    proc.stdin.flush()
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    return answer


def measure(env: dict[str, str], tools: str | None) -> dict[str, Any]:
    """tools/list through `diagd mcp [--tools tools]`: its model-facing bytes, the whole result's, the
    instructions', the tool names."""
    args = [DIAGD, "mcp", *(["--tools", tools] if tools else [])]
    with subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            init = _exchange(proc, INITIALIZE)
            listed = _exchange(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                               {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
    result = listed["result"]
    size = model_facing_bytes(result["tools"])
    return {"selection": tools or "all", "bytes": size, "tokens_est": round(size / 4),
            "tools_list_bytes": json_bytes(result),
            "instructions_bytes": len(init["result"].get("instructions", "").encode()),
            "tools": [t["name"] for t in result["tools"]]}


def run(daemon: BenchDaemon) -> list[dict[str, Any]]:
    return [measure(daemon.env, tools) for tools in SELECTIONS]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    with isolated_daemon("tools") as daemon:
        rows = run(daemon)
    over = [r["selection"] for r in rows if r["bytes"] > BUDGETS.get(r["selection"], sys.maxsize)]
    if opts.json:
        print(json.dumps({"rows": rows, "budgets": BUDGETS, "over_budget": over}, indent=2))
    else:
        print(f"{'selection':<10} {'tools':>5} {'to model':>8} {'~tokens':>8} {'tools/list':>10} "
              f"{'instructions':>12}  budget (to model)")
        for r in rows:
            budget = BUDGETS.get(r["selection"])
            verdict = "" if budget is None else f"<= {budget} {'ok' if r['bytes'] <= budget else 'OVER'}"
            print(f"{r['selection']:<10} {len(r['tools']):>5} {r['bytes']:>8} {r['tokens_est']:>8} "
                  f"{r['tools_list_bytes']:>10} {r['instructions_bytes']:>12}  {verdict}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
