"""`diagd doctor`: check every external tool, privilege and directory; say how to fix each."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import stat
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from diagd.daemon import paths

APT_HINT = "sudo apt-get install -y {pkg}   (or rerun scripts/setup.sh)"


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False  # a failed required check means the daemon itself cannot run


def _version(cmd: list[str]) -> str | None:
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
    return Check(name, True, f"{path}: {_version(version_cmd) or 'version unknown'}")


def check_python_module(module: str, required: bool = True) -> Check:
    try:
        mod = importlib.import_module(module)
    except Exception as exc:
        return Check(f"python:{module}", False, f"cannot import: {exc}",
                     "pip install -e . in the diagd virtualenv (scripts/setup.sh does it)", required)
    version = getattr(mod, "__version__", None) or getattr(mod, "VERSION", "")
    if not version:
        try:
            version = importlib.metadata.version({"serial": "pyserial"}.get(module, module))
        except importlib.metadata.PackageNotFoundError:
            version = ""
    return Check(f"python:{module}", True, f"{version}".strip() or "importable", required=required)


def cap_effective() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


CAP_PERFMON, CAP_BPF = 38, 39


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


def tracefs_dir() -> Path | None:
    for candidate in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (candidate / "available_events").exists():
            return candidate
    return None


def check_tracefs() -> Check:
    found = tracefs_dir()
    if found is not None:
        return Check("tracefs", True, f"mounted at {found}")
    return Check("tracefs", False, "not mounted: every bpftrace tracepoint would be 'not found'",
                 "sudo mount -t tracefs nodev /sys/kernel/tracing")


def check_crash_version() -> Check:
    """crash < 8.0.4 predates the pid.numbers[] change that Debian 12's 6.1.y kernels backported."""
    import re

    version = _version(["crash", "--version"]) if shutil.which("crash") else None
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


def check_sandbox() -> list[Check]:
    """Landlock ABI and seccomp: what confinement crash, drgn and bpftrace get (see actors/_confine.py)."""
    from diagd.actors import _confine

    info = _confine.describe()
    abi, kernel = int(str(info["landlock_abi"])), int(str(info["kernel_landlock_abi"]))
    if abi > 0:
        extras = [name for floor, name in ((4, "TCP bind/connect"), (6, "abstract unix sockets and signals"))
                  if abi >= floor]
        landlock = Check("landlock", True, f"ABI {abi}: files, execution" + "".join(f", {e}" for e in extras)
                         + " confined for crash, drgn and bpftrace")
    else:
        why = (f"forced off by {_confine.FORCE_ENV} (the kernel offers ABI {kernel})" if info["forced_off"]
               else "ABI 0: this kernel has no Landlock (5.13+, booted with lsm=...,landlock)")
        landlock = Check("landlock", False, f"{why}: gdb passthrough, drgn code and bpftrace cat()/#include are "
                         "refused unless [crash]/[bpftrace] allow_unconfined = true",
                         "use a kernel with Landlock enabled")
    seccomp = Check("seccomp", bool(info["seccomp"]),
                    "socket() limited per tool, io_uring refused" if info["seccomp"]
                    else "not available (needs x86-64 with seccomp): sockets are not filtered")
    return [landlock, seccomp]


def check_runtime_dir() -> Check:
    rd = paths.runtime_dir()
    if not rd.exists():
        return Check("runtime dir", True, f"{rd} (created with mode 0700 when the daemon starts)", required=True)
    st = rd.stat()
    problems = []
    if st.st_uid != os.getuid():
        problems.append(f"owned by uid {st.st_uid}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        problems.append(f"mode {stat.S_IMODE(st.st_mode):o}")
    for sock in rd.glob("*.sock"):
        mode = stat.S_IMODE(sock.stat().st_mode)
        if mode != 0o600:
            problems.append(f"{sock.name} mode {mode:o}")
    if problems:
        return Check("runtime dir", False, f"{rd}: " + ", ".join(problems),
                     f"chmod 700 {rd}; or stop diagd and remove {rd}", required=True)
    return Check("runtime dir", True, f"{rd} (0700, sockets 0600)", required=True)


def check_config() -> Check:
    from diagd.daemon import config
    from diagd.protocol.errors import DiagdError

    try:
        cfg = config.load()
    except DiagdError as exc:
        return Check("config", False, exc.message, "fix the TOML file (see README: Configuration)", True)
    return Check("config", True, cfg.source, required=True)


def check_daemon() -> Check:
    from diagd.daemon.shim import connect

    sock = connect(paths.control_socket())
    if sock is None:
        return Check("daemon", False, "not running", "diagd start   (or: systemctl --user start diagd)")
    sock.close()
    return Check("daemon", True, f"listening on {paths.control_socket()}")


def all_checks() -> list[Check]:
    return [
        *(check_python_module(m) for m in ("trio", "mcp", "msgpack", "structlog", "jsonschema")),
        check_python_module("serial", required=False),
        check_python_module("pexpect", required=False),
        check_python_module("drgn", required=False),
        check_tool("tshark", ["tshark", "-v"], "tshark"),
        check_tool("sharkd", ["sharkd", "-v"], "wireshark-common"),
        check_tool("capinfos", ["capinfos", "-v"], "wireshark-common"),
        check_tool("bpftrace", ["bpftrace", "--version"], "bpftrace"),
        check_bpf_privileges(),
        check_tracefs(),
        check_tool("crash", ["crash", "--version"], "crash"),
        check_crash_version(),
        *check_sandbox(),
        check_runtime_dir(),
        check_config(),
        check_daemon(),
    ]


def run(*, as_json: bool = False) -> int:
    checks = all_checks()
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("FAIL" if c.required else "warn")
            print(f"[{mark}] {c.name:<22} {c.detail}")
            if not c.ok and c.fix:
                print(f"       fix: {c.fix}")
    return 1 if any(c.required and not c.ok for c in checks) else 0
