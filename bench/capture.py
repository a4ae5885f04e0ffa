"""Live-capture benchmark: packets captured through diagd vs dumpcap alone, at rising replay rates.

Run from the repository root, as root (network namespaces, veth, dumpcap in the sandbox):

    .venv/bin/python bench/capture.py [--rates 10000,50000,100000,200000] [--seconds 3] [--json]

It creates a veth pair whose sending end lives in a network namespace of its own, and an isolated
daemon (bench/_daemon.py) allowed to capture on the other end. For each rate, alternately:

- dumpcap alone: `dumpcap -n -w FILE -i IF -p -s 262144 -B 16` (diagd's own options, no child mode), started,
  its file awaited, then the replay, a second of quiet, SIGINT; packets = capinfos of the file,
  drops from its "Packets received/dropped" line.
- diagd: start_capture on the daemon's MCP socket (returns once dumpcap has its first file open), the
  replay, a second of quiet, stop_capture; packets and kernel drops from its answer.

The replay is `tcpreplay --pps=RATE --loop=0 --limit=RATE*SECONDS` of a real corpus capture of small
frames (adrian_n4_upf_timeout_sbi.pcap: 1966 frames, 171 bytes on average); the rate tcpreplay really
reached is shown (a loaded 2-core VM does not reach every rate asked). Also: the time to a capture
being ready (start to its first file open), and the daemon's RSS before and after all rates (it must
stay flat: dumpcap writes the files, the daemon only reads its messages).
Target: diagd captures >= 0.99 of dumpcap's packets at every rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from _daemon import isolated_daemon

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.pcaps import PCAPS  # noqa: E402  (the test corpus' cache, as the tests read it)

SOURCE = "adrian_n4_upf_timeout_sbi.pcap"
TARGET_RATIO = 0.99


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


RawMCP = _load("diagd_bench_bpftrace", BENCH / "bpftrace.py").RawMCP  # the blocking JSON-RPC client


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def veth_pair() -> Iterator[tuple[str, str, str]]:
    """(capture end, namespace, sending end); removed on the way out."""
    tag = secrets.token_hex(3)
    cap, ns, send = f"dbc{tag}", f"diagd-bench-{tag}", f"dbs{tag}"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", cap, "mtu", "9000", "type", "veth", "peer", "name", send, "mtu", "9000", "netns", ns)
        subprocess.run(["sysctl", "-qw", f"net.ipv6.conf.{cap}.disable_ipv6=1"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{send}.disable_ipv6=1"], check=True)
        _ip("link", "set", cap, "up")
        _ip("-n", ns, "link", "set", send, "up")
        yield cap, ns, send
    finally:
        subprocess.run(["ip", "link", "del", cap], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def replay(ns: str, send: str, rate: int, packets: int) -> float:
    """Send `packets` frames at `rate` packets/s; the rate tcpreplay reports it reached."""
    done = subprocess.run(["ip", "netns", "exec", ns, "tcpreplay", f"--pps={rate}", "--loop=0", f"--limit={packets}",
                           "-i", send, str(PCAPS / SOURCE)], capture_output=True, text=True, check=True)
    found = re.search(r"Rated: [\d.]+ Bps, [\d.]+ Mbps, ([\d.]+) pps", done.stdout)
    return float(found.group(1)) if found else float("nan")


def count(path: Path) -> int:
    done = subprocess.run(["capinfos", "-M", "-c", "-T", "-r", str(path)], capture_output=True, text=True)
    return int(done.stdout.split("\t")[-1]) if done.stdout.strip() else 0


def dumpcap_alone(interface: str, ns: str, send: str, rate: int, packets: int, tmp: Path) -> dict[str, Any]:
    out = tmp / f"alone-{rate}.pcapng"
    started = time.perf_counter()
    proc = subprocess.Popen(["dumpcap", "-n", "-w", str(out), "-i", interface, "-p", "-s", "262144", "-B", "16"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (out.exists() and out.stat().st_size > 0):
        if proc.poll() is not None:
            raise RuntimeError(f"dumpcap exited: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.005)
    ready_ms = (time.perf_counter() - started) * 1000
    reached = replay(ns, send, rate, packets)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    dropped = re.search(r"Packets received/dropped on interface '[^']+': (\d+)/(\d+)", err)
    return {"packets": count(out), "dropped": int(dropped.group(2)) if dropped else None, "ready_ms": ready_ms,
            "reached_pps": reached}


def through_diagd(client: Any, interface: str, ns: str, send: str, rate: int, packets: int) -> dict[str, Any]:
    started = time.perf_counter()
    cap = client.tool("start_capture", {"interfaces": [interface], "promiscuous": False, "duration_s": 600})
    ready_ms = (time.perf_counter() - started) * 1000
    reached = replay(ns, send, rate, packets)
    time.sleep(1)
    done = client.tool("stop_capture", {"capture_id": cap["capture_id"]})
    return {"packets": done["packets"], "dropped": done["drops"]["kernel"], "ready_ms": ready_ms,
            "reached_pps": reached}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10000,50000,100000,200000")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/capture.py needs root (namespaces, veth, dumpcap in diagd's sandbox)", file=sys.stderr)
        return 2
    for tool in ("ip", "tcpreplay", "dumpcap", "capinfos"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed", file=sys.stderr)
            return 2
    rates = [int(r) for r in opts.rates.split(",")]
    rows = []
    with veth_pair() as (interface, ns, send), tempfile.TemporaryDirectory() as scratch:
        config = f'[capture]\nallowed_interfaces = ["{interface}"]\nmax_bytes = 4294967296\n'
        with isolated_daemon("cap", config=config) as daemon:
            client = RawMCP(daemon.mcp_socket)
            rss_before = rss_mb(daemon.proc.pid)
            for rate in rates:
                packets = int(rate * opts.seconds)
                alone = dumpcap_alone(interface, ns, send, rate, packets, Path(scratch))
                diagd = through_diagd(client, interface, ns, send, rate, packets)
                rows.append({"rate_pps": rate, "sent": packets, "dumpcap": alone, "diagd": diagd,
                             "ratio": round(diagd["packets"] / alone["packets"], 4) if alone["packets"] else None})
            rss_after = rss_mb(daemon.proc.pid)
    result = {"source": SOURCE, "seconds_per_rate": opts.seconds, "rows": rows, "target_ratio": TARGET_RATIO,
              "daemon_rss_mb": {"before": rss_before, "after": rss_after}}
    if opts.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{'rate asked':>10} {'sent':>8} | {'dumpcap: got / drop / pps':>28} | {'diagd: got / drop / pps':>28} | "
          f"{'ratio':>6} | ready ms dumpcap / diagd")
    for row in rows:
        a, d = row["dumpcap"], row["diagd"]
        print(f"{row['rate_pps']:>10} {row['sent']:>8} | {a['packets']:>9} / {a['dropped']!s:>6} / "
              f"{a['reached_pps']:>8.0f} | {d['packets']:>9} / {d['dropped']!s:>6} / {d['reached_pps']:>8.0f} | "
              f"{row['ratio']!s:>6} | {a['ready_ms']:.0f} / {d['ready_ms']:.0f}")
    print(f"daemon RSS before / after: {rss_before:.1f} / {rss_after:.1f} MB; target ratio >= {TARGET_RATIO}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
