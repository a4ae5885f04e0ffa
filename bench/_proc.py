"""What the benches read of a running daemon and the machine: /proc probes, a free port, the vmcore fixture."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.fixtures.vmcore import CACHE, SCRIPT, cached  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def fd_count(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def children(pid: int) -> list[tuple[int, str, str]]:
    """(pid, state, comm) of every child of `pid` (all its threads' children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                stat = Path(f"/proc/{kid}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            found.append((int(kid), stat[stat.rindex(")") + 2], comm))
    return found


def cpu_s(pid: int) -> float:
    """CPU seconds used by `pid` and its living children (their own children not counted)."""
    def used(one: int) -> float:
        try:
            fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
    return used(pid) + sum(used(kid) for kid, _, _ in children(pid))


def wait_until_quiet(pid: int, *, window_s: float = 0.3, busy_s: float = 0.01, limit_s: float = 15.0) -> float:
    """Wait until the daemon and its children use under `busy_s` of CPU in a `window_s` (its background
    starts, standbys and loads over), at most `limit_s`; how long it waited."""
    start = time.monotonic()
    before = cpu_s(pid)
    while time.monotonic() - start < limit_s:
        time.sleep(window_s)
        now = cpu_s(pid)
        if now - before < busy_s:
            break
        before = now
    return time.monotonic() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vmcore_fixture() -> tuple[Path, Path]:
    """(vmcore, vmlinux) of the project's fixture, built by its script into the cache when missing."""
    found = cached()
    if found is None:
        subprocess.run(["bash", str(SCRIPT), str(CACHE)], check=True)
        found = cached()
        assert found is not None
    return found.vmcore, found.vmlinux
