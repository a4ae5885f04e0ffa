"""The sandbox launcher: apply a confinement policy to this process, then execve the tool.

Run as `python -I -S _confine_exec.py '<policy json>' -- tool args...` (see `_confine.wrap`). It must
stay importable without site-packages (stdlib + ctypes only): the launcher starts with `-I -S`, and
the drgn worker imports `deny_exec` from here after it is up.

Order of the steps (each is best-effort up to what the kernel offers; `report` says what applied):
1. private /tmp (root only: a mount namespace where /tmp is the session's own tmp directory);
2. capabilities: everything not kept leaves the bounding set, so the tool gets none after execve;
3. PR_SET_NO_NEW_PRIVS: no setuid/file capabilities ever again (also what Landlock and seccomp need);
4. the death link: a tiny watchdog child kills the tool when the daemon process exits, or when the
   tool has run past its deadline (bpftrace: a run ends by itself even if the daemon is stuck or gone);
5. Landlock: filesystem (read / write / execute allow-lists), TCP bind+connect (ABI >= 4), abstract unix
   sockets and signals outside the sandbox (ABI >= 6);
6. seccomp: socket() only for the families the tool needs, no io_uring (it could open sockets
   without socket()), no x32 or 32-bit syscalls;
7. execve. Rulesets and filters are inherited by everything the tool starts and cannot be lifted.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import stat
import struct
import sys
from typing import Any

# -- Landlock (include/uapi/linux/landlock.h) -------------------------------------------------------
SYS_LANDLOCK_CREATE_RULESET = 444  # the same number on every architecture
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

# The filesystem rights each ABI knows: handling all of them means "denied unless a rule allows".
_FS_ABI1 = (1 << 13) - 1
FS_RIGHTS_BY_ABI = {1: _FS_ABI1, 2: _FS_ABI1 | FS_REFER, 3: _FS_ABI1 | FS_REFER | FS_TRUNCATE,
                    4: _FS_ABI1 | FS_REFER | FS_TRUNCATE}
FS_RIGHTS_LATEST = _FS_ABI1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV
# Only these rights may be granted on a single file (the kernel answers EINVAL otherwise).
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV

READ = FS_READ_FILE | FS_READ_DIR
EXEC = FS_EXECUTE | FS_READ_FILE
DEVICE = FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV  # /dev/null and the like
# A writable directory: create, change, rename and remove inside it; never execute what was written
# there, and never make device nodes (a root tool could otherwise mknod /dev/mem's twin).
WRITE = FS_RIGHTS_LATEST & ~(FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_BLOCK)

# -- seccomp (x86-64 only; elsewhere the filter is skipped and reported) ----------------------------
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
NR_SOCKET = 41
NR_IO_URING = (425, 426, 427)  # setup, enter, register
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CAP_NAMES = ("chown", "dac_override", "dac_read_search", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
             "linux_immutable", "net_bind_service", "net_broadcast", "net_admin", "net_raw", "ipc_lock", "ipc_owner",
             "sys_module", "sys_rawio", "sys_chroot", "sys_ptrace", "sys_pacct", "sys_admin", "sys_boot",
             "sys_nice", "sys_resource", "sys_time", "sys_tty_config", "mknod", "lease", "audit_write",
             "audit_control", "setfcap", "mac_override", "mac_admin", "syslog", "wake_alarm", "block_suspend",
             "audit_read", "perfmon", "bpf", "checkpoint_restore")
CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class ConfineError(Exception):
    """A step that the policy requires could not be applied: the tool must not start."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(err)} (errno {err})")
    return result


def _prctl(option: int, arg2: int = 0, arg3: int = 0, what: str = "prctl") -> int:
    return _check(_libc.prctl(option, arg2, arg3, 0, 0), what)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled at boot."""
    result = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(result), 0)


def seccomp_available() -> bool:
    """Whether this build of the launcher can install its seccomp filter here (x86-64 with seccomp)."""
    if os.uname().machine != "x86_64":
        return False
    try:
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except OSError:
        return False


# -- Landlock ---------------------------------------------------------------------------------------

def _ruleset(abi: int, net: bool) -> tuple[int, int]:
    """A new ruleset fd handling every right this ABI knows; returns (fd, handled fs rights)."""
    fs = FS_RIGHTS_BY_ABI.get(abi, FS_RIGHTS_LATEST)
    net_rights = 0 if net or abi < 4 else NET_BIND_TCP | NET_CONNECT_TCP
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr grew a field at ABI 4 and ABI 6: pass the size this kernel knows.
    attr = struct.pack("=QQQ", fs, net_rights, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buf = ctypes.create_string_buffer(attr[:size], size)
    fd = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)),
                "landlock_create_ruleset")
    return fd, fs


def _add_path(ruleset: int, path: str, rights: int, handled: int) -> bool:
    """Allow `rights` beneath `path` (a file gets only file rights). A missing path is skipped."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        rights &= handled
        if not rights:
            return False
        # struct landlock_path_beneath_attr is packed: u64 allowed_access, s32 parent_fd.
        buf = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
        _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                             buf, ctypes.c_uint32(0)), f"landlock_add_rule {path}")
        return True
    finally:
        os.close(fd)


def apply_landlock(policy: dict[str, Any], abi: int) -> dict[str, Any]:
    ruleset, handled = _ruleset(abi, bool(policy.get("net")))
    try:
        rules: list[tuple[str, int]] = [(p, READ) for p in policy.get("read", ())]
        rules += [(p, EXEC) for p in policy.get("exec", ())]
        rules += [(p, DEVICE) for p in policy.get("devices", ())]
        rules += [(p, WRITE | READ) for p in policy.get("write", ())]
        applied = [path for path, rights in rules if _add_path(ruleset, path, rights, handled)]
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {"abi": abi, "rules": len(applied), "net_denied": not policy.get("net") and abi >= 4,
            "scoped": abi >= 6}


def deny_exec() -> bool:
    """Add a Landlock layer that forbids execve altogether (the drgn worker, once it is running).

    Layers only ever narrow: this one handles EXECUTE alone and allows it nowhere.
    """
    abi = landlock_abi()
    if abi < 1:
        return False
    buf = ctypes.create_string_buffer(struct.pack("=Q", FS_EXECUTE), 8)
    fd = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(8), ctypes.c_uint32(0)),
                "landlock_create_ruleset")
    try:
        _prctl(PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(fd)
    return True


# -- seccomp ----------------------------------------------------------------------------------------

def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06


def seccomp_program(families: list[int]) -> bytes:
    """cBPF: allow everything except socket() of other families, io_uring and foreign syscall ABIs."""
    deny_enosys = _bpf(_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)
    deny_family = _bpf(_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT)
    allow = _bpf(_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    fams = sorted(set(families))
    prog = [_bpf(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            _bpf(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            deny_enosys,  # i386 via int 0x80: socketcall() hides the family from us
            _bpf(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
            _bpf(_JGE_K, 0, 1, X32_SYSCALL_BIT),
            deny_enosys]
    for nr in NR_IO_URING:
        prog += [_bpf(_JEQ_K, 0, 1, nr), deny_enosys]
    # socket(): compare the low word of args[0] (the family is an int) with each allowed family.
    prog += [_bpf(_JEQ_K, 0, 2 + len(fams), NR_SOCKET), _bpf(_LD_W_ABS, 0, 0, 16)]
    for i, fam in enumerate(fams):
        prog.append(_bpf(_JEQ_K, len(fams) - i, 0, fam))
    prog += [deny_family, allow]
    return b"".join(prog)


def apply_seccomp(families: list[int]) -> dict[str, Any]:
    code = seccomp_program(families)
    filt = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(code) // 8, ctypes.cast(filt, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp filter")
    return {"socket_families": sorted(set(families))}


# -- capabilities, private /tmp, the death link ------------------------------------------------------

def drop_capabilities(keep: list[str]) -> list[str]:
    """Drop every capability not in `keep` from the bounding set and clear the inheritable and ambient
    sets: after execve a root tool holds only `keep`. Without CAP_SETPCAP (not root) there is nothing to
    drop: such a process gains no capabilities on execve under no_new_privs anyway."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = len(CAP_NAMES) - 1
    wanted = {CAP_NAMES.index(name) for name in keep if name in CAP_NAMES}
    kept = []
    for cap in range(last + 1):
        if cap in wanted:
            kept.append(CAP_NAMES[cap] if cap < len(CAP_NAMES) else str(cap))
        elif _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == errno.EPERM:
            return []  # no CAP_SETPCAP: an unprivileged daemon
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # capset: version 3 header, then two {effective, permitted, inheritable} words; keep e/p, clear i.
    header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)
    data = ctypes.create_string_buffer(24)
    _check(_libc.syscall(125, header, data), "capget")  # SYS_capget
    words = list(struct.unpack("=6I", data.raw))
    words[2] = words[5] = 0
    new = ctypes.create_string_buffer(struct.pack("=6I", *words), 24)
    _check(_libc.syscall(126, header, new), "capset")  # SYS_capset
    return kept


def _under_tmp(path: str) -> bool:
    real = os.path.realpath(path)
    return real == "/tmp" or real.startswith("/tmp/")


def _outermost(paths: list[str]) -> list[str]:
    reals = sorted({os.path.realpath(p) for p in paths})
    return [p for p in reals if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in reals)]


def private_tmp(source: str, keep: list[str]) -> bool:
    """Give this process its own /tmp: `source` bind-mounted on /tmp in a new mount namespace.

    crash's tmpfile() is hard-wired to /tmp, and the sandbox must not write the shared /tmp (other
    root processes keep scripts and sockets there). Files the tool must still reach under the real
    /tmp (`keep`: the dump, the session directory... in tests they live there) are bind-mounted back
    at the same paths inside the private one. Needs root (CAP_SYS_ADMIN); returns False without it.
    """
    if os.geteuid() != 0 or _libc.unshare(CLONE_NEWNS) < 0:
        return False
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    # Opened in the new namespace (a bind source must be a mount of the caller's namespace), before
    # /tmp is covered.
    os.makedirs(source, 0o700, exist_ok=True)
    src = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    kept = []
    for path in _outermost([p for p in keep if _under_tmp(p)]):
        try:
            kept.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        except OSError:
            continue
    try:
        _check(_libc.mount(f"/proc/self/fd/{src}".encode(), b"/tmp", None, MS_BIND, None), f"bind {source} on /tmp")
        for path, fd in kept:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.makedirs(path, 0o700, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            _check(_libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(path), None, MS_BIND, None),
                   f"bind {path} back into the private /tmp")
    finally:
        for _path, fd in kept:
            os.close(fd)
        os.close(src)
    return True


_WATCHDOG_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
                     signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE)


def death_link(daemon_pid: int | None, deadline_s: float | None = None, grace_s: float = 10.0) -> bool:
    """Fork a watchdog that ends this process (the tool, after execve) when the daemon exits, and, with
    a deadline, when the tool has run that long: SIGINT first (bpftrace prints its maps and exits),
    SIGKILL `grace_s` later. The tool's program text is never changed for this.

    PR_SET_PDEATHSIG on the tool itself is not usable: it fires when the *thread* that forked the
    tool exits, and Trio forks children from cached worker threads that exit after 10 s idle. The
    watchdog instead holds a pidfd of the daemon *process*; its own PDEATHSIG (its parent is the
    single-threaded tool) ends it with the tool, so no watchdog outlives its tool.
    """
    pidfd = None
    if daemon_pid:
        try:
            pidfd = os.pidfd_open(daemon_pid)
        except OSError:
            pidfd = None
        if pidfd is not None and os.getppid() != daemon_pid:  # the daemon died before we took hold of it
            print("diagd sandbox: the daemon is gone", file=sys.stderr)
            os._exit(125)
    if pidfd is None and deadline_s is None:
        return False
    tool = os.getpid()
    child = os.fork()
    if child:
        if pidfd is not None:
            os.close(pidfd)
        return True
    try:
        _watch(tool, pidfd, deadline_s, grace_s)
    finally:
        os._exit(0)
    return True  # unreachable


def _watch(tool: int, pidfd: int | None, deadline_s: float | None, grace_s: float) -> None:
    """The watchdog (a child of the tool): wait for the tool to end, the daemon to exit or the deadline."""
    import select
    import time

    for sig in _WATCHDOG_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # PDEATHSIG alone is not enough: the tool's Landlock domain (ABI >= 6 scopes signals) forbids
    # the kernel's parent-death signal from the sandboxed tool to this unsandboxed watchdog, so it
    # also watches the tool through a pidfd and leaves when the tool has ended.
    tool_fd = os.pidfd_open(tool)
    if os.getppid() != tool:
        os._exit(0)
    keep = sorted(fd for fd in (pidfd, tool_fd) if fd is not None)
    low = 0
    for fd in keep:  # the tool's pipes or pty must see EOF when the tool ends, not later
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    poller = select.poll()
    poller.register(tool_fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    end = None if deadline_s is None else time.monotonic() + deadline_s
    daemon_gone = False
    while not daemon_gone:
        timeout_ms = None
        if end is not None:
            left = end - time.monotonic()
            if left <= 0:
                break
            timeout_ms = int(left * 1000) + 1
        ready = {fd for fd, _ in poller.poll(timeout_ms)}
        if tool_fd in ready:
            os._exit(0)  # the tool ended by itself: nothing to do
        daemon_gone = bool(ready)
    if not daemon_gone:  # the deadline passed: end it the graceful way first
        os.kill(tool, signal.SIGINT)
        graceful = select.poll()
        graceful.register(tool_fd, select.POLLIN)
        if graceful.poll(int(grace_s * 1000)):
            os._exit(0)  # it ended the graceful way
    os.kill(tool, signal.SIGKILL)


# -- the launcher ------------------------------------------------------------------------------------

def apply(policy: dict[str, Any]) -> dict[str, Any]:
    """Apply every step the policy asks for; returns what was applied (the tool sees it as DIAGD_SANDBOX)."""
    report: dict[str, Any] = {"landlock": 0, "seccomp": False}
    tmp = policy.get("private_tmp")
    keep = [p for key in ("read", "write", "exec", "devices") for p in policy.get(key, ())]
    if tmp and private_tmp(tmp, keep):
        report["private_tmp"] = tmp
    if policy.get("drop_caps", True):
        report["caps"] = drop_capabilities(list(policy.get("keep_caps", ())))
    _prctl(PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
    if policy.get("die_with") or policy.get("deadline_s"):
        deadline = policy.get("deadline_s")
        report["death_link"] = death_link(policy.get("die_with"), None if deadline is None else float(deadline))
    families = policy.get("socket_families")
    use_seccomp = families is not None and seccomp_available()  # reads /proc: before Landlock hides it
    abi = 0 if policy.get("landlock") is False else landlock_abi()
    if abi:
        report["landlock"] = apply_landlock(policy, abi)["abi"]
    if use_seccomp and families is not None:
        apply_seccomp(list(families))
        report["seccomp"] = True
    return report


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: _confine_exec.py POLICY_JSON -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    policy = json.loads(argv[1])
    tool = argv[3:]
    try:
        report = apply(policy)
    except ConfineError as exc:
        print(f"diagd sandbox: {exc}", file=sys.stderr)
        return 126
    env = dict(os.environ)
    env["DIAGD_SANDBOX"] = json.dumps(report, separators=(",", ":"))
    try:
        os.execve(policy.get("executable") or tool[0], tool, env)
    except OSError as exc:
        print(f"diagd sandbox: cannot execute {tool[0]}: {exc.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
