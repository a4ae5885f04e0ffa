"""Reconnect benchmark: what a daemon restart costs an open MCP session through `diagd mcp`.

Run from the repository root:

    .venv/bin/python bench/reconnect.py [--repeats 5] [--json]

It starts an isolated daemon (as every bench/*.py), opens one session through `diagd mcp
--no-autostart` with raw JSON-RPC lines on the shim's pipes, then restarts the daemon `--repeats`
times (SIGTERM, wait for the exit, `diagd serve` again). Right after each SIGTERM a `diagd_calls`
call is written to the shim, which holds it until the session is replayed on the new daemon (when
it still reached the old daemon, it is answered DAEMON_RESTARTED and sent again, as a client would).

Figures (medians over the repeats):
- restart -> next answer: from the SIGTERM to that call's answer on the shim's stdout, the whole
  outage a client sees (daemon shutdown + start-up + the shim's reconnect + the first call).
- daemon stop / daemon start: SIGTERM to exit; `diagd serve` to its MCP socket appearing.
- first answer after the socket, shim: from the socket appearing to the answer through the
  shim (its backoff poll, the replayed initialize, the call, and the daemon's first MCP import).
- first answer after the socket, raw: the same on a fresh daemon for a client connecting to the
  socket itself at once (initialize + the call): the daemon's share. The shim's own reconnect
  time is the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _daemon import DIAGD, isolated_daemon

INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "bench-reconnect", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
TIMEOUT_S = 60.0


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def call(ident: int) -> bytes:
    return line({"jsonrpc": "2.0", "id": ident, "method": "tools/call",
                 "params": {"name": "diagd_calls", "arguments": {"limit": 1}}})


class LineReader:
    def __init__(self, fd: int) -> None:
        self.fd, self.buffer = fd, b""

    def read(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\n" not in self.buffer:
            if not select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("no answer")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError("closed")
            self.buffer += chunk
        raw, _, self.buffer = self.buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(raw)
        return message


def start_serve(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([DIAGD, "serve"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)


def wait_for(path: Path) -> float:
    deadline = time.monotonic() + TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.001)
    return time.monotonic()


def stop(proc: subprocess.Popen[bytes]) -> float:
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(TIMEOUT_S)
    return time.monotonic() - began


def raw_first_answer(path: Path) -> float:
    """initialize + one call on the socket itself, timed from now."""
    began = time.monotonic()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    reader = LineReader(sock.fileno())
    sock.sendall(line(INITIALIZE))
    reader.read()
    sock.sendall(line(INITIALIZED) + call(1))
    reader.read()
    elapsed = time.monotonic() - began
    sock.close()
    return elapsed


@contextmanager
def shim(env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], LineReader]]:
    proc = subprocess.Popen([DIAGD, "mcp", "--no-autostart"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield proc, LineReader(proc.stdout.fileno())
    finally:
        proc.kill()
        proc.wait()


def measure(repeats: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {k: [] for k in ("restart_to_answer", "daemon_stop", "daemon_start",
                                                        "shim_after_socket", "raw_after_socket")}
    with isolated_daemon("reconnect") as daemon:
        procs = [daemon.proc]
        retries = 0
        try:
            with shim(daemon.env) as (client, reader):
                assert client.stdin is not None
                client.stdin.write(line(INITIALIZE))
                client.stdin.flush()
                reader.read()
                client.stdin.write(line(INITIALIZED) + call(1))
                client.stdin.flush()
                reader.read()
                for i in range(repeats):
                    # A raw client on a fresh daemon first: the daemon's own share of the first answer.
                    samples["daemon_stop"].append(stop(procs[-1]))
                    began = time.monotonic()
                    procs.append(start_serve(daemon.env, daemon.log))
                    samples["daemon_start"].append(wait_for(daemon.mcp_socket) - began)
                    samples["raw_after_socket"].append(raw_first_answer(daemon.mcp_socket))
                    # Then the restart under the shim's session.
                    began = time.monotonic()
                    procs[-1].send_signal(signal.SIGTERM)
                    client.stdin.write(call(100 + i))
                    client.stdin.flush()
                    procs[-1].wait(TIMEOUT_S)
                    procs.append(start_serve(daemon.env, daemon.log))
                    appeared = wait_for(daemon.mcp_socket)
                    answer = reader.read()
                    if answer.get("error", {}).get("data", {}).get("code") == "DAEMON_RESTARTED":
                        # It reached the old daemon before it closed: the client retries, as told.
                        retries += 1
                        client.stdin.write(call(100 + i))
                        client.stdin.flush()
                        answer = reader.read()
                    done = time.monotonic()
                    assert answer.get("id") == 100 + i and "result" in answer, answer
                    samples["restart_to_answer"].append(done - began)
                    samples["shim_after_socket"].append(done - appeared)
        finally:
            for proc in procs[1:]:
                if proc.poll() is None:
                    stop(proc)
    medians = {k: statistics.median(v) for k, v in samples.items()}
    medians["shim_own_reconnect"] = medians["shim_after_socket"] - medians["raw_after_socket"]
    return {"repeats": repeats, "retried": retries, "median_s": medians, "samples_s": samples}


ROWS = [
    ("restart -> next answer through the shim", "restart_to_answer"),
    ("  daemon stop (SIGTERM -> exit)", "daemon_stop"),
    ("  daemon start (serve -> MCP socket)", "daemon_start"),
    ("  first answer after the socket: shim", "shim_after_socket"),
    ("  first answer after the socket: raw client", "raw_after_socket"),
    ("shim's own reconnect (shim - raw)", "shim_own_reconnect"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.repeats)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{'metric':45} | median over {args.repeats}")
    print(f"{'-' * 45}-|-{'-' * 12}")
    for label, key in ROWS:
        print(f"{label:45} | {result['median_s'][key] * 1000:8.0f} ms")
    print(f"calls answered DAEMON_RESTARTED (sent before the old daemon closed) and retried: {result['retried']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
