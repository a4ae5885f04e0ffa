"""What the benches read of a running daemon and the machine: /proc probes, a free port, the vmcore fixture."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from tests.fixtures.vmcore import CACHE, SCRIPT, cached  # noqa: E402


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
