"""Probes of the machine that back ends and `diagd doctor` share: tools and their versions,
privileges, tracefs, the sandbox (Landlock ABI, seccomp), a process's memory.

Each check returns a `Check` saying what was found and how to fix it; back ends turn a failed one
into a coded error, `diagd doctor` prints them all. Stdlib only at import: the drgn worker (which
reads its own RSS here) and the CLI import it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APT_HINT = "diagd setup   (installs what the back ends need; or: sudo apt-get install -y {pkg})"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False  # a failed required check means the daemon itself cannot run


@dataclass(frozen=True)
class Tool:
    """A command a back end runs, how to ask its version, and the Debian package that provides it."""

    command: str
    version_args: tuple[str, ...]
    package: str


@dataclass(frozen=True)
class Needs:
    """What a back end needs of the machine, declared as `SYSTEM_NEEDS` in its package's __init__:
    `diagd setup` installs the packages, `diagd doctor` runs the checks."""

    tools: tuple[Tool, ...] = ()
    modules: tuple[str, ...] = ()  # Python modules (installed with diagd; checked, never installed)
    checks: tuple[Callable[[], Check], ...] = ()  # further probes (privileges, tracefs, versions)
    note: str = ""  # what no package can do (group membership, a mount)

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.package for t in self.tools))

    def run_checks(self) -> list[Check]:
        return [*(check_python_module(m, required=False) for m in self.modules),
                *(check_tool(t.command, [t.command, *t.version_args], t.package) for t in self.tools),
                *(check() for check in self.checks)]


def tool_version(cmd: list[str]) -> str | None:
    """The first line `cmd` prints (its version); None when it cannot run."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0].strip() if text else ""


def check_tool(name: str, version_cmd: list[str], pkg: str) -> Check:
    path = shutil.which(name)
    if path is None:
        return Check(name, False, "not found on PATH", APT_HINT.format(pkg=pkg))
    return Check(name, True, f"{path}: {tool_version(version_cmd) or 'version unknown'}")


def check_python_module(module: str, required: bool = True) -> Check:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return Check(f"python:{module}", False, f"cannot import: {exc}",
                     "reinstall diagd with its dependencies (pipx install --force ., or pip install -e . in its venv)",
                     required)
    version = getattr(mod, "__version__", None) or getattr(mod, "VERSION", "")
    if not version:
        try:
            version = importlib.metadata.version({"serial": "pyserial"}.get(module, module))
        except importlib.metadata.PackageNotFoundError:
            version = ""
    return Check(f"python:{module}", True, f"{version}".strip() or "importable", required=required)


# -- privileges and tracefs (bpftrace) ---------------------------------------------------------------

CAP_PERFMON, CAP_BPF = 38, 39


def cap_effective() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def check_bpf_privileges() -> Check:
    if os.geteuid() == 0:
        return Check("bpftrace privileges", True, "running as root")
    caps = cap_effective()
    # The kernel would accept CAP_BPF+CAP_PERFMON, but bpftrace 0.17 itself refuses any non-root
    # user (checked with setpriv and ambient capabilities), so only root or a helper works.
    have = "CAP_BPF+CAP_PERFMON are effective, but bpftrace 0.17 still refuses non-root users" if (
        caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON)) else "not root"
    return Check("bpftrace privileges", False, have,
                 "run diagd as root, or set [bpftrace] privileged_helper = \"sudo -n\" with a NOPASSWD "
                 "sudoers rule for bpftrace (diagd never waits on a password prompt)")


def _tracefs_mounts() -> list[Path]:
    """Where tracefs is mounted, from /proc/self/mounts (readable by anyone, unlike tracefs itself)."""
    try:
        with open("/proc/self/mounts") as f:
            return [Path(fields[1]) for line in f if len(fields := line.split()) > 2 and fields[2] == "tracefs"]
    except OSError:
        return []


def tracefs_dir() -> Path | None:
    """The mounted tracefs bpftrace will use. Debian mounts it 0700 root: a user who may not look inside
    still learns where it is (from the mount table), never an error."""
    mounted = _tracefs_mounts()
    for candidate in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        try:
            if (candidate / "available_events").exists():
                return candidate
        except PermissionError:
            pass
        if candidate in mounted:
            return candidate
    return None


def check_tracefs() -> Check:
    found = tracefs_dir()
    if found is not None:
        readable = os.access(found, os.R_OK | os.X_OK)
        return Check("tracefs", True, f"mounted at {found}" + ("" if readable else
                     " (readable by root only: bpftrace runs as root, or through [bpftrace] privileged_helper)"))
    return Check("tracefs", False, "not mounted: every bpftrace tracepoint would be 'not found'",
                 "sudo mount -t tracefs nodev /sys/kernel/tracing")


# -- serial ports -----------------------------------------------------------------------------------


def check_serial_access() -> Check:
    """Debian gives serial devices to the `dialout` group: a user outside it sees every port refused."""
    if os.geteuid() == 0:
        return Check("serial access", True, "running as root")
    try:
        import grp

        dialout = grp.getgrnam("dialout").gr_gid
    except (ImportError, KeyError):
        return Check("serial access", True, "no dialout group here: port permissions decide")
    if dialout in os.getgroups():
        return Check("serial access", True, "in group dialout")
    return Check("serial access", False, "not in group dialout: /dev/ttyS*, ttyUSB*, ttyACM* are refused",
                 "sudo usermod -aG dialout $USER, then log in again")


# -- crash ------------------------------------------------------------------------------------------


def check_crash_version() -> Check:
    """crash < 8.0.4 predates the pid.numbers[] change that Debian 12's 6.1.y kernels backported."""
    version = tool_version(["crash", "--version"]) if shutil.which("crash") else None
    if not version:
        return Check("crash version", False, "crash not found", APT_HINT.format(pkg="crash"))
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", version)
    if m and tuple(int(x) for x in m.groups()) < (8, 0, 4):
        return Check("crash version", False,
                     f"{version}: on Linux 6.1.y dumps it warns 'active task ... not found in PID hash' and "
                     "ps/foreach/sys TASKS list only the tasks running on a CPU (bt, log, kmem, struct, sym still "
                     "work; drgn sees every task). crash >= 8.0.4 fixes it.",
                     "build crash 8.0.6 from Debian trixie's orig tarball (plain `make`, ~9 min) or use drgn for tasks")
    return Check("crash version", True, version)


# -- the sandbox ------------------------------------------------------------------------------------


def check_sandbox() -> list[Check]:
    """Landlock ABI and seccomp: what confinement crash, drgn and bpftrace get (see actors/sandbox.py)."""
    from diagd.actors import sandbox

    info = sandbox.describe()
    abi, kernel = int(str(info["landlock_abi"])), int(str(info["kernel_landlock_abi"]))
    if abi > 0:
        extras = [name for floor, name in ((4, "TCP bind/connect"), (6, "abstract unix sockets and signals"))
                  if abi >= floor]
        landlock = Check("landlock", True, f"ABI {abi}: files, execution" + "".join(f", {e}" for e in extras)
                         + " confined for crash, drgn and bpftrace")
    else:
        why = (f"forced off by {sandbox.FORCE_ENV} (the kernel offers ABI {kernel})" if info["forced_off"]
               else "ABI 0: this kernel has no Landlock (5.13+, booted with lsm=...,landlock)")
        landlock = Check("landlock", False, f"{why}: gdb passthrough, drgn code and bpftrace cat()/#include are "
                         "refused unless [crash]/[bpftrace] allow_unconfined = true",
                         "use a kernel with Landlock enabled")
    seccomp = Check("seccomp", bool(info["seccomp"]),
                    "socket() limited per tool, io_uring refused" if info["seccomp"]
                    else "not available (needs x86-64 with seccomp): sockets are not filtered")
    ok, why = sandbox.namespaces.probe()
    user = (f"as uid {sandbox.namespaces.sandbox_ids()[0]} ({sandbox.namespaces.SANDBOX_USER})"
            if os.geteuid() == 0 else "as you")
    spaces = Check("namespaces", ok,
                   f"crash and drgn run in namespaces of their own (bubblewrap), {user}" if ok
                   else f"{why}: crash sessions are refused unless [crash] allow_unconfined = true",
                   "" if ok else APT_HINT.format(pkg="bubblewrap"))
    return [landlock, seccomp, spaces]


# -- processes --------------------------------------------------------------------------------------


def workers(*processes: tuple[int | None, str]) -> list[dict[str, Any]]:
    """An actor's `statistics()["workers"]`: one {pid, rss_bytes, role} per process it owns now
    ((pid, role) pairs; a None pid, no process, is left out). `diagd status` lists every actor's
    workers and adds their RSS up."""
    return [{"pid": pid, "rss_bytes": rss_bytes(pid), "role": role} for pid, role in processes if pid is not None]


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of process `pid` (default: this one) from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def read_position(pid: int, path: str | Path) -> int | None:
    """How far process `pid` has read `path`: the offset of its open file (the largest, if it has the
    file open more than once), from /proc/<pid>/fdinfo; None when it does not have it open (or is gone)."""
    real = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    found = None
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != real:
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                pos = next(int(line.split()[1]) for line in f if line.startswith("pos:"))
        except (OSError, ValueError, StopIteration):
            continue
        found = pos if found is None else max(found, pos)
    return found
