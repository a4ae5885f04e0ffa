"""Namespaces of their own for crash and the drgn worker: bubblewrap builds the world they see.

A command filter reads text and can be outspelt (`gdb she`, `alias zz gdb`, `\\gdb`); a namespace is
what the kernel enforces whatever the tool is made to do. `wrap_argv` puts bubblewrap (Debian's
`bubblewrap`, the well-kept tool for this) in front of the sandbox launcher, so the launcher (Landlock,
seccomp, capabilities, the uid switch) and then the tool run:
- in their own mount namespace whose root is an empty tmpfs holding only what the policy lists, each
  bound read-only at its own path (the dump, vmlinux, the directories beside them, the system's
  libraries, Python for drgn), a fresh /proc of their own PID namespace and a minimal /dev;
- with one writable place, the scratch directory: a tmpfs of `scratch_bytes` (crash's tmpfile()s, what
  drgn code writes). It lives and dies with the tool and bounds its disk use; the host's files,
  diagd's session directory included, are not even visible;
- in their own PID (no other process visible or signalable), network (no interface but a down
  loopback), IPC and UTS namespaces, killed with their parent (`--die-with-parent`);
- as an unprivileged uid: a non-root daemon's own (bubblewrap's user namespace), a root daemon's
  sandbox user (`nobody`) entered by the launcher in a user namespace of its own, after giving that uid
  read-only idmapped views of the inputs it must read (`sandbox.identity`).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterable, Sequence

BWRAP = "bwrap"
SANDBOX_USER = "nobody"  # the uid a root daemon's crash and drgn run as (no files, no login, no groups)
HOSTNAME = "diagd-sandbox"


def bwrap_path() -> str | None:
    found = shutil.which(BWRAP)
    return os.path.realpath(found) if found else None


class Namespaces:
    """Whether bubblewrap can build a sandbox here, probed on first use and kept: owned by the back end
    that confines its tools (`CrashBackend.namespaces`), so each daemon, and each test, probes its own."""

    def __init__(self) -> None:
        self._found: tuple[bool, str] | None = None

    def available(self) -> tuple[bool, str]:
        if self._found is None:
            self._found = probe()
        return self._found


def probe() -> tuple[bool, str]:
    """Whether bubblewrap can build a sandbox here (installed, and the kernel lets it make namespaces);
    the reason when not (runs bwrap once: ~5 ms)."""
    bwrap = bwrap_path()
    if bwrap is None:
        return False, "bubblewrap (bwrap) is not installed: `diagd setup crash` installs it"
    argv = [bwrap, *_unshare(), "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not run: {exc}"
    if done.returncode != 0:
        return False, f"bwrap cannot make namespaces here: {done.stderr.decode(errors='replace').strip()[:300]}"
    return True, ""


def sandbox_ids() -> tuple[int, int]:
    """The uid and gid a root daemon's confined tools run as."""
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534  # the kernel's overflow id: owns nothing


def _unshare() -> list[str]:
    """The namespaces: all but the user one for root (the launcher makes that after dropping root;
    bubblewrap would map root inside to root outside), bubblewrap's own user namespace otherwise."""
    spaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    return spaces if os.geteuid() == 0 else ["--unshare-user", *spaces]


def _beneath(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _binds(paths: Iterable[str], under: str = "/") -> list[str]:
    """Read-only binds of the paths that exist, parents first (a bind beneath another lands on it);
    a symlink (merged-/usr's /lib) is recreated as the same link, never bound to its target's place.
    The directories leading to them are made 0755 first (bubblewrap makes them 0700 root's, which the
    sandbox uid could not pass); never the ones beneath a bind, nor `under` and what holds it."""
    wanted = [os.path.normpath(p) for p in paths]
    bound = sorted({p for p in wanted if os.path.lexists(p)
                    and p not in ("/proc", "/dev") and not p.startswith(("/proc/", "/dev/"))},  # made fresh
                   key=lambda p: (p.count("/"), p))
    dirs: set[str] = set()
    for path in bound:
        parent = os.path.dirname(path)
        while parent != "/" and not _beneath(under, parent):
            if not any(_beneath(parent, b) for b in bound):
                dirs.add(parent)
            parent = os.path.dirname(parent)
    out: list[str] = []
    for parent in sorted(dirs, key=lambda p: (p.count("/"), p)):
        out += ["--perms", "0755", "--dir", parent]
    for path in bound:
        if os.path.islink(path) and path.count("/") == 1:
            out += ["--symlink", os.readlink(path), path]
        else:
            out += ["--ro-bind", path, path]
    return out


def bwrap_argv(*, read: Sequence[str], scratch: str, scratch_bytes: int) -> list[str]:
    """bubblewrap's command line (up to and including `--`) for a tool that reads `read` and writes
    only `scratch`, a tmpfs of `scratch_bytes`, which is also its working directory."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError(BWRAP)
    outside = [p for p in read if not _beneath(os.path.normpath(p), scratch)]
    inside = [p for p in read if _beneath(os.path.normpath(p), scratch)]  # bound over the scratch tmpfs
    return [bwrap, *_unshare(), "--die-with-parent", "--hostname", HOSTNAME,
            "--proc", "/proc", "--dev", "/dev", *_binds(outside),
            "--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", scratch, *_binds(inside, scratch),
            "--chdir", scratch, "--"]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return []


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def tool_pid(supervisor: int) -> int | None:
    """The host pid of the tool under the launcher's supervisor (`supervisor`, see `launcher.supervise`):
    bubblewrap's own processes (the outer one, the PID namespace's init) lead to it, each the only child
    of the one before; None while it is not there yet."""
    kids = _children(supervisor)
    pid = kids[0] if len(kids) == 1 else None
    for _ in range(3):
        if pid is None or _comm(pid) != "bwrap":
            return pid
        kids = _children(pid)
        pid = kids[0] if len(kids) == 1 else None
    return None
