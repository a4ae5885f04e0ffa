"""`--ssh` costs: a command on a "remote host" (a private sshd on localhost) against the local one.

    .venv/bin/python bench/ssh.py [--repeats 7] [--calls 50] [--json]

Starts an isolated daemon and a private sshd (tests/support/sshd.py: throw-away keys, a free port;
needs /usr/sbin/sshd and root for /run/sshd), then measures, median of --repeats:
- `diagd status` locally, over a first ssh connection (the shared master closed before each run:
  TCP, key exchange, authentication, the version probe, the command) and over a reused one;
- `ssh HOST true` over the reused connection: the remote login shell's own cost, which every
  remote command pays and diagd cannot remove (a shell whose rc file is slow shows here);
- an MCP SDK client launching `diagd mcp` (locally / `--ssh`, first / reused): start to the first
  `diagd_status` result, and the p50 of --calls further calls in that session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support.sshd

from bench._daemon import DIAGD, isolated_daemon
from tests.support.sshd import start_sshd


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True, timeout=120)
    return (time.perf_counter() - start) * 1000


def mcp_session(args: list[str], env: dict[str, str], calls: int) -> tuple[float, float]:
    """(ms from launching `diagd mcp ARGS` to the first call's result, p50 ms of the next calls)."""
    import trio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def run() -> tuple[float, float]:
        start = time.perf_counter()
        params = StdioServerParameters(command=DIAGD, args=["mcp", *args], env=env)
        async with Client(params, mode="legacy") as client:
            await client.call_tool("diagd_status", {})
            first = (time.perf_counter() - start) * 1000
            samples = []
            for _ in range(calls):
                t = time.perf_counter()
                await client.call_tool("diagd_calls", {"limit": 1})
                samples.append((time.perf_counter() - t) * 1000)
        return first, statistics.median(samples)

    return trio.run(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)

    with isolated_daemon("ssh") as daemon, tempfile.TemporaryDirectory(prefix="diagd-bench-sshd-") as tmp:
        remote_env = {**daemon.env, "PATH": f"{Path(DIAGD).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        sshd = start_sshd(Path(tmp) / "sshd", remote_env)
        local_runtime = Path(tmp) / "rt"
        local = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGD_", "SSH_"))}
        local.update(DIAGD_RUNTIME_DIR=str(local_runtime), DIAGD_SSH_CONFIG=str(sshd.client_config))
        ssh = ["ssh", "-F", str(sshd.client_config), "-o", f"ControlPath={local_runtime}/ssh-%C",
               "-p", str(sshd.port), "-l", sshd.user]

        def close_master() -> None:
            subprocess.run([*ssh, "-O", "exit", "127.0.0.1"], capture_output=True, check=False)

        def first(measure: Any) -> Any:
            close_master()
            return measure()

        try:
            remote = ["--ssh", sshd.target]
            rows: dict[str, float] = {}
            rows["diagd status, local"] = statistics.median(
                timed([DIAGD, "status"], daemon.env) for _ in range(opts.repeats))
            rows["diagd status --ssh, first connection"] = statistics.median(
                first(lambda: timed([DIAGD, "status", *remote], local)) for _ in range(opts.repeats))
            rows["diagd status --ssh, reused connection"] = statistics.median(
                timed([DIAGD, "status", *remote], local) for _ in range(opts.repeats))
            rows["ssh HOST true, reused connection (remote shell)"] = statistics.median(
                timed([*ssh, "127.0.0.1", "true"], local) for _ in range(opts.repeats))
            sessions = {
                "local": [mcp_session([], daemon.env, opts.calls) for _ in range(opts.repeats)],
                "--ssh, first connection": [first(lambda: mcp_session(remote, local, opts.calls))
                                            for _ in range(opts.repeats)],
                "--ssh, reused connection": [mcp_session(remote, local, opts.calls) for _ in range(opts.repeats)],
            }
            for name, runs in sessions.items():
                rows[f"MCP launch to first result, {name}"] = statistics.median(r[0] for r in runs)
                rows[f"MCP call p50 in the session, {name}"] = statistics.median(r[1] for r in runs)
        finally:
            close_master()
            sshd.stop()
    if opts.json:
        print(json.dumps({k: round(v, 2) for k, v in rows.items()}, indent=2))
    else:
        width = max(map(len, rows))
        for name, value in rows.items():
            print(f"{name:<{width}}  {value:8.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
