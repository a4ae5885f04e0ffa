"""MCP over HTTP: what a trivial tool call costs over Streamable HTTP next to the Unix socket path,
and what the HTTP stack adds to the daemon's memory.

Run from the repository root:

    .venv/bin/python bench/http_mcp.py [--calls 300] [--json]

It starts two isolated daemons (bench/_daemon.py), one without and one with `[http] listen` on a
free loopback port and a token made with `diagd token add`, and measures side by side:

1. Latency of `diagd_calls` {"limit": 1} timed by the client around each request (client start-up
   and warm-up calls excluded): the MCP SDK client over Streamable HTTP (`streamable_http_client`
   with the bearer token; every call is a POST answered on an SSE stream) vs the same SDK client
   through `diagd mcp` over stdio (the path of bench/foundation.py).
2. The daemon's RSS (VmRSS of `diagd serve`, no children) idle with no client, without and with
   the HTTP listener, and after the HTTP session.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _daemon import isolated_daemon
from _proc import free_port, rss_mb

DIAGD = str(Path(sys.executable).parent / "diagd")
TOOL, TOOL_ARGS = "diagd_calls", {"limit": 1}
WARMUP_CALLS = 20




def wait_for_http(url: str, timeout_s: float = 30) -> None:
    import httpx2

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx2.post(url, timeout=5).status_code == 401:
                return
        except httpx2.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no HTTP listener at {url} after {timeout_s} s")
        time.sleep(0.05)


def time_calls(connect: Any, calls: int) -> list[float]:
    import trio
    from mcp import Client

    async def run() -> list[float]:
        samples: list[float] = []
        async with connect() as transport, Client(transport, mode="legacy") as client:
            for _ in range(WARMUP_CALLS):
                await client.call_tool(TOOL, TOOL_ARGS)
            for _ in range(calls):
                start = time.perf_counter_ns()
                result = await client.call_tool(TOOL, TOOL_ARGS)
                samples.append((time.perf_counter_ns() - start) / 1e6)
                if result.is_error:
                    raise RuntimeError(f"tool error: {result}")
        return samples

    return trio.run(run)


def over_http(url: str, token: str) -> Any:
    from contextlib import asynccontextmanager

    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    @asynccontextmanager
    async def connect() -> Any:
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            yield streamable_http_client(url, http_client=http)

    return connect


def over_shim(env: dict[str, str]) -> Any:
    from contextlib import asynccontextmanager

    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"],
                                   env={k: v for k, v in env.items() if k.startswith("DIAGD_")})

    @asynccontextmanager
    async def connect() -> Any:
        yield params

    return connect


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(statistics.median(ordered), 3), "p95_ms": round(ordered[int(len(ordered) * 0.95)], 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with isolated_daemon("nohttp") as plain:
        time.sleep(1.0)  # let start-up allocations settle, as bench/memory.py does
        figures["rss_idle_without_http_mb"] = round(rss_mb(plain.proc.pid), 1)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with isolated_daemon("http", config=f'[http]\nlisten = "127.0.0.1:{port}"\n') as daemon:
        wait_for_http(url)
        time.sleep(1.0)
        figures["rss_idle_with_http_mb"] = round(rss_mb(daemon.proc.pid), 1)
        token = subprocess.run([DIAGD, "token", "add", "bench"], env=daemon.env, capture_output=True, text=True,
                               check=True).stdout.strip()
        figures["http"] = summary(time_calls(over_http(url, token), args.calls))
        figures["rss_after_http_session_mb"] = round(rss_mb(daemon.proc.pid), 1)
        figures["shim"] = summary(time_calls(over_shim(daemon.env), args.calls))
    if args.json:
        print(json.dumps(figures))
        return 0
    rows = [
        ("tool call p50 / p95, SDK client over HTTP", f"{figures['http']['p50_ms']} / {figures['http']['p95_ms']} ms"),
        ("tool call p50 / p95, SDK client + shim + socket",
         f"{figures['shim']['p50_ms']} / {figures['shim']['p95_ms']} ms"),
        ("daemon RSS idle, without / with [http]",
         f"{figures['rss_idle_without_http_mb']} / {figures['rss_idle_with_http_mb']} MB"),
        ("daemon RSS after the HTTP session", f"{figures['rss_after_http_session_mb']} MB"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
