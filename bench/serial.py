"""Serial benchmark: what does diagd add to a serial round trip, and does it miss bytes at speed?

Run from the repository root (about 45 s; --stream-seconds shortens it):

    .venv/bin/python bench/serial.py [--calls N] [--stream-seconds S] [--json]

It starts the simulated modem (tests/support/sim_modem.py, a real pty) and an isolated daemon
(the same as bench/foundation.py: temporary runtime/state dirs, stopped and removed at the end).

1. Round trip `AT\\r` -> `\\r\\nOK\\r\\n`, median of N after warm-up, four ways in one run:
   - `raw pyserial`: the bench process opens the pty itself: write, then read until OK. The floor.
   - `in the actor`: send_data's own elapsed_ms (write -> stop pattern seen), and
   - `in the daemon`: the registry's p50 (validation, handler, actor, audit), both from the calls of:
   - `raw socket`: send_data (wait_policy=keyword, stop_pattern "OK\\r\\n") as JSON-RPC lines on the
     daemon's MCP socket: the daemon alone (MCP server, validation, actor, raw log, audit).
   - `sdk+shim`: the same through the MCP SDK client and `diagd mcp`, as an MCP host calls it.
   Overhead = median minus the raw pyserial median. Target (issue 4): <= 1 ms for the daemon.
2. A stream at 92,160 bytes/s (921,600 baud, 8N1 equivalent) from the modem for --stream-seconds
   into an open port nobody reads (it all goes to the URC buffer, which overflows and counts its
   drops); then the session's raw log is compared byte for byte with what the modem sent.
   Target: 0 bytes missing. The daemon's CPU use during the stream is shown too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
# This file is named serial.py: keep its directory from shadowing pyserial's `serial`.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != BENCH]

import serial  # noqa: E402 - pyserial, after the path fix above


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Under its own name, before foundation.py (whose `from _daemon import ...` then finds it).
bench_daemon = _load("_daemon", BENCH / "_daemon.py")
foundation = _load("diagd_bench_foundation", BENCH / "foundation.py")
sim_modem = _load("diagd_bench_sim_modem", REPO / "tests" / "support" / "sim_modem.py")

WARMUP = 20
OVERHEAD_TARGET_MS = 1.0
STREAM_RATE = 92_160  # bytes/s: 921,600 baud with 10 bits per byte
AT_ARGS = {"payload": "AT", "stop_pattern": "OK\r\n", "timeout_ms": 2000}


def start_sim(link: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "sim_modem.py"), "--link", str(link)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"sim_modem exited with {proc.wait()}")
    return proc, json.loads(line)["path"]


def stop_sim(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def raw_pyserial(path: str, calls: int) -> list[float]:
    samples = []
    with serial.Serial(path, 115200, timeout=2, exclusive=True) as port:
        for i in range(WARMUP + calls):
            start = time.perf_counter_ns()
            port.write(b"AT\r")
            reply = b""
            while not reply.endswith(b"OK\r\n"):
                chunk = port.read(max(1, port.in_waiting))
                if not chunk:
                    raise RuntimeError(f"no OK from the modem (got {reply!r})")
                reply += chunk
            if i >= WARMUP:
                samples.append(foundation.elapsed_ms(start))
    return samples


class Session:
    """A raw JSON-RPC session on the daemon's MCP socket."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(foundation.REPLY_TIMEOUT_S + 60)
        self.sock.connect(str(path))
        self.channel = foundation.LineChannel(self.sock.sendall, self.sock.makefile("rb"))
        self.channel.handshake()
        self.ids = iter(range(1, 10**9))

    def call(self, tool: str, **args: Any) -> dict[str, Any]:
        reply = self.channel.call(next(self.ids), tool, args)
        result: dict[str, Any] = reply["result"]["structuredContent"]
        return result

    def close(self) -> None:
        self.sock.close()


def via_socket(session: Session, port: str, calls: int) -> tuple[list[float], list[float]]:
    samples, inside = [], []
    for i in range(WARMUP + calls):
        start = time.perf_counter_ns()
        result = session.call("send_data", port=port, **AT_ARGS)
        took = foundation.elapsed_ms(start)
        if not result["found_keyword"]:
            raise RuntimeError(f"no OK through the daemon: {result}")
        if i >= WARMUP:
            samples.append(took)
            inside.append(float(result["elapsed_ms"]))
    return samples, inside


def via_sdk(env: dict[str, str], port: str, calls: int) -> list[float]:
    import trio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=foundation.DIAGD, args=["mcp", "--no-autostart"],
                                   env={k: v for k, v in env.items() if k.startswith("DIAGD_")})

    async def run() -> list[float]:
        samples = []
        async with Client(params, mode="legacy") as client:
            # The bench's socket session opened the port; take it over explicitly (that session's
            # end may not have reached the daemon yet).
            await client.call_tool("configure_connection", {"port": port, "force": True})
            for i in range(WARMUP + calls):
                start = time.perf_counter_ns()
                result = await client.call_tool("send_data", {"port": port, **AT_ARGS})
                took = foundation.elapsed_ms(start)
                if result.is_error or not result.structured_content["found_keyword"]:
                    raise RuntimeError(f"send_data failed: {result}")
                if i >= WARMUP:
                    samples.append(took)
        return samples

    return trio.run(run)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stream(session: Session, port: str, seconds: int) -> dict[str, Any]:
    session.call("configure_connection", port=port, action="close", force=True)  # a fresh log for the stream
    opened = session.call("configure_connection", port=port, line_ending="cr")
    daemon_pid = session.call("diagd_status")["daemon"]["pid"]
    total = seconds * STREAM_RATE
    expected = b"\r\nOK\r\n" + sim_modem.stream_bytes(total)
    cpu0, wall0 = cpu_seconds(daemon_pid), time.monotonic()
    session.call("send_data", port=port, payload=f"AT+SIMSTREAM={seconds},{STREAM_RATE}", wait_policy="none")
    deadline = time.monotonic() + seconds + 20
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = session.call("connection_status", port=port)["ports"][0]
        if status["bytes_in"] >= len(expected):
            break
        time.sleep(0.25)
    wall, cpu = time.monotonic() - wall0, cpu_seconds(daemon_pid) - cpu0
    time.sleep(0.2)  # anything extra would show up as a mismatch below
    records = [json.loads(line) for line in Path(opened["log_file"]).read_text().splitlines()]
    logged = b"".join(bytes.fromhex(r["hex"]) for r in records if r["dir"] == "rx")
    common = next((i for i, (a, b) in enumerate(zip(logged, expected, strict=False)) if a != b),
                  min(len(logged), len(expected)))
    return {"seconds": seconds, "rate_bytes_s": STREAM_RATE, "expected_bytes": len(expected),
            "logged_bytes": len(logged), "identical": logged == expected,
            "missing_bytes": len(expected) - common, "rx_records": sum(r["dir"] == "rx" for r in records),
            "urc_dropped_packets": status.get("urc_dropped_total"), "wall_s": round(wall, 2),
            "daemon_cpu_percent": round(100 * cpu / wall, 1)}


def summary(samples: list[float]) -> dict[str, float]:
    s = foundation.summarize(samples)
    return {"p50_ms": round(s.p50_ms, 4), "p95_ms": round(s.p95_ms, 4), "mean_ms": round(s.mean_ms, 4),
            "min_ms": round(s.min_ms, 4), "n": s.n}


def run_benchmark(calls: int, stream_seconds: int) -> dict[str, Any]:
    with bench_daemon.isolated_daemon("serial", extra_env=foundation.DAEMON_ENV) as bench:
        link = bench.tmp / "modem"
        sim, path = start_sim(link)
        try:
            raw = raw_pyserial(path, calls)
            session = Session(bench.mcp_socket)
            session.call("configure_connection", port=str(link), line_ending="cr")
            sock, inside = via_socket(session, str(link), calls)
            registry = session.call("diagd_status")["tools"]["send_data"]  # daemon-side (warm-up included)
            session.close()
            sdk = via_sdk(bench.env, str(link), calls)
            session = Session(bench.mcp_socket)
            streamed = stream(session, str(link), stream_seconds) if stream_seconds else None
            session.close()
        finally:
            stop_sim(sim)
    raw_p50 = statistics.median(raw)
    latency = {"raw pyserial": summary(raw), "in the actor (elapsed_ms)": summary(inside),
               "raw socket": summary(sock), "sdk+shim": summary(sdk)}
    latency["in the daemon (registry)"] = {"p50_ms": registry["p50_ms"], "p95_ms": registry["p95_ms"],
                                           "n": registry["count"]}
    latency = {k: latency[k] for k in ("raw pyserial", "in the actor (elapsed_ms)", "in the daemon (registry)",
                                       "raw socket", "sdk+shim")}
    overhead = {name: round(v["p50_ms"] - raw_p50, 4) for name, v in latency.items() if name != "raw pyserial"}
    return {"config": {"calls": calls, "warmup": WARMUP, "exchange": "AT\\r -> \\r\\nOK\\r\\n",
                       "python": sys.version.split()[0]},
            "latency": latency, "overhead_p50_ms": overhead,
            "ratio_to_raw": {name: round(v["p50_ms"] / raw_p50, 2) for name, v in latency.items()},
            "overhead_target_ms": OVERHEAD_TARGET_MS, "stream": streamed}


def render(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [f"diagd serial benchmark: {cfg['calls']} round trips {cfg['exchange']} per path after "
             f"{cfg['warmup']} warm-up, on a pty to the simulated modem", "",
             f"{'path':<28} {'p50':>9} {'p95':>9} {'overhead p50':>13} {'x raw':>7}"]
    for name, s in report["latency"].items():
        over = report["overhead_p50_ms"].get(name)
        lines.append(f"{name:<28} {s['p50_ms']:>6.3f} ms {s['p95_ms']:>6.3f} ms "
                     f"{'-' if over is None else f'{over:+.3f} ms':>13} {report['ratio_to_raw'][name]:>7.2f}")
    target = report["overhead_target_ms"]
    daemon = report["overhead_p50_ms"]["raw socket"]
    lines.append(f"daemon overhead (raw socket - raw pyserial): {daemon:.3f} ms, target <= {target} ms: "
                 f"{'met' if daemon <= target else 'MISSED'}")
    if s := report["stream"]:
        lines += ["", f"stream: {s['seconds']} s at {s['rate_bytes_s']} B/s -> {s['logged_bytes']} of "
                  f"{s['expected_bytes']} bytes in the raw log ({s['rx_records']} rx records), identical: "
                  f"{s['identical']}, missing: {s['missing_bytes']} (target 0: "
                  f"{'met' if s['missing_bytes'] == 0 and s['identical'] else 'MISSED'}); URC packets dropped "
                  f"(reported): {s['urc_dropped_packets']}; daemon CPU {s['daemon_cpu_percent']} %"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=300, help="timed round trips per path (default 300)")
    parser.add_argument("--stream-seconds", type=int, default=30, help="length of the stream (default 30; 0 skips)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.stream_seconds < 0:
        parser.error("--calls must be >= 1 and --stream-seconds >= 0")
    report = run_benchmark(args.calls, args.stream_seconds)
    print(json.dumps(report, indent=2) if args.json else render(report))
    missed = report["stream"] is not None and not report["stream"]["identical"]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
