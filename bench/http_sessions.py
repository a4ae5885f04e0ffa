"""HTTP MCP sessions under a leak: many `initialize` requests that never DELETE their session, and the
daemon's RSS before, at its peak and after idle expiry (issue: 5,800 of them took 122 -> 323 MB for good).

Run from the repository root:

    .venv/bin/python bench/http_sessions.py [--initializes 10000] [--tokens 8] [--workers 4]
                                            [--idle-s 20] [--json]

One isolated daemon (bench/_daemon.py) with `[http] listen` on a free loopback port, the default
caps (`max_sessions_per_token` 32, `max_sessions` 256) and `session_idle_s = --idle-s` (the default
is 1800 s; the bench shortens it only to see the expiry within the run). `--tokens` tokens share the
initializes round-robin, so together they reach the overall cap. Measured:

1. baseline: VmRSS of `diagd serve` after one session opened and closed and 3 s of quiet;
2. peak: the highest VmRSS sampled every 0.1 s while the initializes run (`--workers` at once);
3. after expiry: VmRSS once every session was idle for `--idle-s` and the heap trim that follows
   (the figure the issue asks for: within 20 MB of the baseline);
plus the answers by status (200, 503 at a cap, other) and the wall time of the initializes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _daemon import isolated_daemon
from _proc import free_port, rss_mb

DIAGD = str(Path(sys.executable).parent / "diagd")
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TARGET_MB = 20.0




class Sampler:
    """The highest VmRSS of `pid`, sampled every 0.1 s from a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            self._stop.wait(0.1)


def flood(url: str, tokens: list[str], count: int, workers: int) -> Counter[int]:
    import httpx2

    statuses: Counter[int] = Counter()
    lock = threading.Lock()

    def worker(index: int) -> None:
        with httpx2.Client(timeout=60) as client:
            for n in range(index, count, workers):
                headers = {**ACCEPT, "Authorization": f"Bearer {tokens[n % len(tokens)]}"}
                answer = client.post(url, json=INIT, headers=headers)
                with lock:
                    statuses[answer.status_code] += 1

    with ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(worker, i) for i in range(workers)]:
            future.result()
    return statuses


def settle(pid: int, seconds: float) -> float:
    """VmRSS after `seconds` of quiet (the lowest of the last second's samples)."""
    time.sleep(max(0.0, seconds - 1))
    samples = []
    for _ in range(10):
        samples.append(rss_mb(pid))
        time.sleep(0.1)
    return min(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--initializes", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import httpx2

    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    config = f'[http]\nlisten = "127.0.0.1:{port}"\nsession_idle_s = {args.idle_s}\n'
    with isolated_daemon("http-sessions", config=config) as daemon:
        tokens = [subprocess.run([DIAGD, "token", "add", f"bench{i}"], env=daemon.env, capture_output=True,
                                 text=True, check=True, timeout=30).stdout.strip() for i in range(args.tokens)]
        pid = daemon.proc.pid
        first = httpx2.post(url, json=INIT, headers={**ACCEPT, "Authorization": f"Bearer {tokens[0]}"}, timeout=30)
        httpx2.delete(url, headers={"Authorization": f"Bearer {tokens[0]}",
                                    "Mcp-Session-Id": first.headers["mcp-session-id"]}, timeout=30)
        baseline = settle(pid, 3)
        start = time.perf_counter()
        with Sampler(pid) as sampler:
            statuses = flood(url, tokens, args.initializes, args.workers)
            wall_s = time.perf_counter() - start
            right_after = rss_mb(pid)
        after = settle(pid, args.idle_s + 4)  # every session idle for idle_s, then the trim (2 s quiet)
    figures = {"initializes": args.initializes, "tokens": args.tokens, "workers": args.workers,
               "idle_s": args.idle_s, "wall_s": round(wall_s, 1), "per_s": round(args.initializes / wall_s),
               "statuses": dict(sorted(statuses.items())), "rss_mb": {
                   "baseline": round(baseline, 1), "peak": round(max(sampler.peak, right_after), 1),
                   "after_expiry": round(after, 1), "after_minus_baseline": round(after - baseline, 1)},
               "target_mb": TARGET_MB, "met": after - baseline <= TARGET_MB}
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        rss = figures["rss_mb"]
        print(f"{args.initializes} initializes without DELETE, {args.tokens} tokens, {args.workers} at once: "
              f"{wall_s:.1f} s ({figures['per_s']}/s), answers {figures['statuses']}")
        print(f"daemon RSS: baseline {rss['baseline']} MB, peak {rss['peak']} MB, "
              f"after expiry ({args.idle_s:g} s idle) {rss['after_expiry']} MB "
              f"(+{rss['after_minus_baseline']} MB; target <= {TARGET_MB:g} MB: "
              f"{'met' if figures['met'] else 'MISSED'})")
    return 0 if figures["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
