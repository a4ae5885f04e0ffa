"""Foundation benchmark: how fast is diagd when the tool itself does nothing?

Run from the repository root:

    .venv/bin/python bench/foundation.py [--calls N] [--json]

It starts its own isolated daemon (`diagd serve` with DIAGD_RUNTIME_DIR, DIAGD_STATE_DIR and
DIAGD_CONFIG pointing into fresh temporary directories), measures, then stops it with SIGTERM and
removes the directories, also on failure. Every child process gets the same environment.

What is measured, side by side in one run:

1. Latency of a trivial tool call (`diagd_calls` with {"limit": 1}), timed by the client around
   each request only (client start-up and a few warm-up calls excluded), three ways:
   - `sdk+shim`: the MCP SDK `Client` (legacy mode, under `trio.run`) driving `diagd mcp` over
     stdio, the way an MCP host does. This is the figure with a target (p50 <= 2 ms).
   - `raw+shim`: newline-delimited JSON-RPC written straight to the pipes of a `diagd mcp`
     process: the shim hop without the SDK client's own overhead.
   - `raw socket`: the same lines on a blocking connection to the daemon's MCP socket: the daemon
     alone (its MCP `Server`, argument validation, handler, audit log).
   The daemon's own per-tool p50/p95 (`diagd_status` -> tools, measured inside the registry)
   is shown as well, so the time can be split: handler / MCP server + socket / shim / SDK client.
2. Shim start-up: wall time from spawning `diagd mcp` (daemon already running) until the reply to
   an `initialize` request written to its stdin comes back on stdout; median of repeats, next to
   `python -c pass` with the same interpreter as the floor. Target <= 150 ms.
3. `diagd status` wall time (the CLI through the control socket), median of repeats.
   Target <= 150 ms.

Output: a table `metric | value | target | ratio` (ratio = value / target, <= 1 meets the
target), or with --json one JSON object with the same figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from _daemon import isolated_daemon

VENV_BIN = Path(sys.executable).parent
DIAGD = str(VENV_BIN / "diagd")
TOOL = "diagd_calls"
TOOL_ARGS: dict[str, Any] = {"limit": 1}
PROTOCOL_VERSION = "2025-06-18"
WARMUP_CALLS = 20
CALL_P50_TARGET_MS = 2.0
STARTUP_TARGET_MS = 150.0
DAEMON_ENV = {"DIAGD_LOG_LEVEL": "info"}  # the default: one log line per call, as deployed
REPLY_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------- results


@dataclass
class Metric:
    name: str
    value_ms: float
    target_ms: float | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.target_ms is None else self.value_ms / self.target_ms


@dataclass
class LatencySummary:
    n: int
    p50_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float


def percentile(ordered: list[float], pct: float) -> float:
    """Linear interpolation between closest ranks of an already sorted list."""
    pos = (len(ordered) - 1) * pct / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_ms: list[float]) -> LatencySummary:
    ordered = sorted(samples_ms)
    return LatencySummary(
        n=len(ordered), p50_ms=percentile(ordered, 50), p95_ms=percentile(ordered, 95),
        mean_ms=statistics.fmean(ordered), min_ms=ordered[0], max_ms=ordered[-1],
    )


def elapsed_ms(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


# --------------------------------------------------------------------------- raw JSON-RPC


def rpc_line(msg_id: int | None, method: str, params: dict[str, Any] | None = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if msg_id is not None:
        msg["id"] = msg_id
    if params is not None:
        msg["params"] = params
    return json.dumps(msg, separators=(",", ":")).encode() + b"\n"


def initialize_line(msg_id: int = 1) -> bytes:
    return rpc_line(msg_id, "initialize", {
        "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    })


def call_line(msg_id: int, name: str = TOOL, arguments: dict[str, Any] | None = None) -> bytes:
    return rpc_line(msg_id, "tools/call", {"name": name, "arguments": TOOL_ARGS if arguments is None else arguments})


class LineChannel:
    """Newline-delimited JSON-RPC over a pair of blocking byte streams (a socket or a pipe pair)."""

    def __init__(self, send: Callable[[bytes], Any], reader: IO[bytes]) -> None:
        self._send = send
        self._reader = reader

    def request(self, line: bytes, msg_id: int) -> dict[str, Any]:
        self._send(line)
        while True:  # skip notifications (logging, progress) until our reply
            raw = self._reader.readline()
            if not raw:
                raise RuntimeError("connection closed before the reply")
            reply: dict[str, Any] = json.loads(raw)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise RuntimeError(f"JSON-RPC error: {reply['error']}")
                return reply

    def handshake(self) -> None:
        self.request(initialize_line(0), 0)
        self._send(rpc_line(None, "notifications/initialized"))

    def call(self, msg_id: int, name: str = TOOL, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.request(call_line(msg_id, name, arguments), msg_id)
        if reply["result"].get("isError"):
            raise RuntimeError(f"tool error: {reply['result']}")
        return reply


def time_raw_calls(channel: LineChannel, calls: int) -> list[float]:
    channel.handshake()
    for i in range(WARMUP_CALLS):
        channel.call(1_000_000 + i)
    samples = []
    for i in range(calls):
        start = time.perf_counter_ns()
        channel.call(i + 1)
        samples.append(elapsed_ms(start))
    return samples


@contextmanager
def socket_channel(path: Path) -> Iterator[LineChannel]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(REPLY_TIMEOUT_S)
        sock.connect(str(path))
        with sock.makefile("rb") as reader:
            yield LineChannel(sock.sendall, reader)


def spawn_shim(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([DIAGD, "mcp", "--no-autostart"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)


def close_shim(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()  # EOF: the shim half-closes the socket, the daemon ends the session
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    proc.stdout.close()


@contextmanager
def shim_channel(env: dict[str, str]) -> Iterator[LineChannel]:
    proc = spawn_shim(env)
    assert proc.stdin is not None and proc.stdout is not None
    stdin = proc.stdin

    def send(data: bytes) -> None:
        stdin.write(data)
        stdin.flush()

    try:
        yield LineChannel(send, proc.stdout)
    finally:
        close_shim(proc)


def daemon_tool_stats(path: Path) -> dict[str, Any]:
    """The daemon's own per-tool statistics (handler time inside the registry)."""
    with socket_channel(path) as channel:
        channel.handshake()
        reply = channel.call(1, "diagd_status", {})
    stats: dict[str, Any] = reply["result"]["structuredContent"]["tools"].get(TOOL, {})
    return stats


# --------------------------------------------------------------------------- SDK client


def time_sdk_calls(env: dict[str, str], calls: int) -> list[float]:
    import trio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    # The SDK passes only a few "safe" variables to the child unless told: give it ours.
    diagd_env = {k: v for k, v in env.items() if k.startswith("DIAGD_")}
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=diagd_env)

    async def run() -> list[float]:
        samples: list[float] = []
        async with Client(params, mode="legacy") as client:
            for _ in range(WARMUP_CALLS):
                await client.call_tool(TOOL, TOOL_ARGS)
            for _ in range(calls):
                start = time.perf_counter_ns()
                result = await client.call_tool(TOOL, TOOL_ARGS)
                samples.append(elapsed_ms(start))
                if result.is_error:
                    raise RuntimeError(f"tool error: {result}")
        return samples

    return trio.run(run)


# --------------------------------------------------------------------------- start-up times


def time_shim_startup(env: dict[str, str]) -> float:
    start = time.perf_counter_ns()
    proc = spawn_shim(env)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(initialize_line())
        proc.stdin.flush()
        reply = proc.stdout.readline()
        took = elapsed_ms(start)
    finally:
        close_shim(proc)
    if b'"result"' not in reply:
        raise RuntimeError(f"bad initialize reply from the shim: {reply[:200]!r}")
    return took


def time_command(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter_ns()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    took = elapsed_ms(start)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
    return took


def median_of(repeats: int, measure: Callable[[], float]) -> float:
    measure()  # warm the page cache and __pycache__
    return statistics.median(measure() for _ in range(repeats))


# --------------------------------------------------------------------------- the run


def latency_metrics(label: str, s: LatencySummary, target_p50: float | None = None) -> list[Metric]:
    return [
        Metric(f"{label} p50", s.p50_ms, target_p50),
        Metric(f"{label} p95", s.p95_ms),
        Metric(f"{label} mean", s.mean_ms),
    ]


def run_benchmark(calls: int, repeats: int) -> dict[str, Any]:
    with isolated_daemon("foundation", extra_env=DAEMON_ENV) as bench:
        sdk = summarize(time_sdk_calls(bench.env, calls))
        with shim_channel(bench.env) as channel:
            raw_shim = summarize(time_raw_calls(channel, calls))
        with socket_channel(bench.mcp_socket) as channel:
            raw_sock = summarize(time_raw_calls(channel, calls))
        handler = daemon_tool_stats(bench.mcp_socket)
        shim_start = median_of(repeats, lambda: time_shim_startup(bench.env))
        python_floor = median_of(repeats, lambda: time_command([sys.executable, "-c", "pass"], bench.env))
        status = median_of(repeats, lambda: time_command([DIAGD, "status"], bench.env))

    metrics = [
        *latency_metrics("call sdk+shim", sdk, CALL_P50_TARGET_MS),
        *latency_metrics("call raw+shim", raw_shim),
        *latency_metrics("call raw socket", raw_sock),
        Metric("call handler p50 (daemon)", handler.get("p50_ms") or 0.0, note="inside the registry"),
        Metric("call handler p95 (daemon)", handler.get("p95_ms") or 0.0, note="inside the registry"),
        Metric("shim start-up (median)", shim_start, STARTUP_TARGET_MS, note="spawn -> initialize reply"),
        Metric("python -c pass (median)", python_floor, note="interpreter floor"),
        Metric("diagd status (median)", status, STARTUP_TARGET_MS),
    ]
    return {
        "config": {"calls": calls, "warmup_calls": WARMUP_CALLS, "repeats": repeats, "tool": TOOL,
                   "arguments": TOOL_ARGS, "python": sys.version.split()[0]},
        "latency": {"sdk+shim": asdict(sdk), "raw+shim": asdict(raw_shim), "raw socket": asdict(raw_sock),
                    "handler (daemon)": handler},
        "metrics": {m.name: {"value_ms": round(m.value_ms, 4), "target_ms": m.target_ms,
                             "ratio": None if m.ratio is None else round(m.ratio, 3), "note": m.note}
                    for m in metrics},
        "breakdown_p50_ms": breakdown(sdk, raw_shim, raw_sock, handler),
    }


def breakdown(sdk: LatencySummary, raw_shim: LatencySummary, raw_sock: LatencySummary,
              handler: dict[str, Any]) -> dict[str, float]:
    """Where the p50 of a call goes (differences of medians: indicative, not exact)."""
    handler_p50 = float(handler.get("p50_ms") or 0.0)
    return {
        "handler (registry: validation, handler, audit)": round(handler_p50, 3),
        "daemon MCP server + socket I/O": round(raw_sock.p50_ms - handler_p50, 3),
        "shim hop (two extra pipe/socket copies)": round(raw_shim.p50_ms - raw_sock.p50_ms, 3),
        "SDK client (stdio transport, session, validation)": round(sdk.p50_ms - raw_shim.p50_ms, 3),
        "total (sdk+shim p50)": round(sdk.p50_ms, 3),
    }


def fmt(value: float | None, unit: str = " ms") -> str:
    if value is None:
        return "-"
    return f"{value:.3f}{unit}" if value < 10 else f"{value:.1f}{unit}"


def render_table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    rows = [("metric", "value", "target", "ratio (value/target)")]
    for name, m in report["metrics"].items():
        ratio = "-" if m["ratio"] is None else f"{m['ratio']:.2f}" + ("" if m["ratio"] <= 1 else "  MISSED")
        rows.append((name, fmt(m["value_ms"]), fmt(m["target_ms"]), ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"diagd foundation benchmark: {cfg['calls']} calls of {cfg['tool']}({json.dumps(cfg['arguments'])}) "
             f"after {cfg['warmup_calls']} warm-up; start-up figures are medians of {cfg['repeats']}"]
    for i, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        lines.append(" | ".join(cells))
        if i == 0:
            lines.append("-+-".join("-" * w for w in widths))
    lines.append("")
    lines.append("where a call's p50 goes (differences of medians):")
    for part, ms in report["breakdown_p50_ms"].items():
        lines.append(f"  {part:<52} {ms:8.3f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=500, help="timed tool calls per client (default 500)")
    parser.add_argument("--repeats", type=int, default=20, help="repeats of each start-up figure (default 20)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        parser.error("--calls and --repeats must be >= 1")
    report = run_benchmark(args.calls, args.repeats)
    print(json.dumps(report, indent=2) if args.json else render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
