"""The processes and file descriptors of a process, read from /proc: what the tests check after a child
ends (no zombie, no leaked pipe, no process left behind)."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str  # "Z" for a zombie
    comm: str


def read_proc(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1: raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return Proc(pid, int(rest[1]), rest[0], comm)


def children(pid: int) -> list[Proc]:
    """Every child of `pid`, whichever of its threads started it."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := read_proc(int(entry))) is not None and proc.ppid == pid:
            found.append(proc)
    return found


def zombies(pid: int) -> list[Proc]:
    return [p for p in children(pid) if p.state == "Z"]


def alive(pid: int) -> bool:
    proc = read_proc(pid)
    return proc is not None and proc.state != "Z"


def fd_names(pid: int) -> set[str]:
    return set(os.listdir(f"/proc/{pid}/fd"))


def fd_count(pid: int) -> int:
    return len(fd_names(pid))


def fd_targets(pid: int) -> list[str]:
    """`fd->target` of every open fd, sorted (what a leak looks like: `pipe:[...]`, `/dev/pts/N`)."""
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            pass
    return sorted(targets)
