"""The kernel calls the sandbox makes: Landlock, seccomp and the prctl/capability constants (stdlib and
ctypes only).

Imported two ways: by the daemon as `diagd.actors.sandbox.kernel` (`landlock_abi`, `seccomp_available`;
the drgn worker's `deny_exec`), and by the launcher script (`launcher.py`, run by path with `-I -S`,
where nothing of diagd is importable) as the top-level module `kernel` from its own directory. So it
imports nothing but the standard library.
"""


import ctypes
import errno
import os
import stat
import struct
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
NR_EXECVE = 59
NR_EXECVEAT = 322
# The launcher's one allowed execve passes its file name from a page mapped at this fixed address (far
# below where Linux places the program, its heap, libraries and stacks, so nothing the tool maps later
# lands there by chance); every other execve, and every execveat, is refused. See `exec_filter`.
EXEC_ONCE_ADDR = 0x1000_0000_0000
PROT_READ = 1
PROT_WRITE = 2
MAP_PRIVATE = 0x02
MAP_ANONYMOUS = 0x20
MAP_FIXED_NOREPLACE = 0x100000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
PR_GET_SECCOMP = 21
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

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class ConfineError(Exception):
    """A step that the policy requires could not be applied: the tool must not start."""


def check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise ConfineError(f"{what}: {os.strerror(err)} (errno {err})")
    return result


def prctl(option: int, arg2: int = 0, arg3: int = 0, what: str = "prctl") -> int:
    return check(libc.prctl(option, arg2, arg3, 0, 0), what)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled at boot."""
    result = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(int(result), 0)


def seccomp_available() -> bool:
    """Whether this build of the launcher can install its seccomp filter here (x86-64 with seccomp)."""
    if os.uname().machine != "x86_64":
        return False
    return int(libc.prctl(PR_GET_SECCOMP, 0, 0, 0, 0)) >= 0  # EINVAL: a kernel without seccomp


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
    fd = check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)),
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
        check(libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
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
        check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {"abi": abi, "rules": len(applied), "net_denied": not policy.get("net") and abi >= 4,
            "scoped": abi >= 6}


def deny_exec(*, landlock: bool = True) -> dict[str, bool]:
    """Forbid execve from now on (the drgn worker, once it is running), on every kernel: a seccomp
    filter refusing execve and execveat (x86-64), and, with `landlock`, a Landlock layer that handles
    EXECUTE alone and allows it nowhere (layers only ever narrow). Returns what applied."""
    prctl(PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
    done = {"seccomp": False, "landlock": False}
    if seccomp_available():
        install_filter(exec_filter(None))
        done["seccomp"] = True
    if landlock and landlock_abi() >= 1:
        _landlock_deny_exec()
        done["landlock"] = True
    return done


def _landlock_deny_exec() -> None:
    buf = ctypes.create_string_buffer(struct.pack("=Q", FS_EXECUTE), 8)
    fd = check(libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(8), ctypes.c_uint32(0)),
                "landlock_create_ruleset")
    try:
        check(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(fd)


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


def exec_filter(allowed_filename: int | None) -> bytes:
    """cBPF that refuses execve and execveat with EPERM (also under foreign syscall ABIs, where it
    refuses everything). `allowed_filename` (the launcher's): the one execve whose filename pointer is
    exactly this address passes. The filter holds no state, so the address is the state: the launcher
    maps it, the tool's new image does not have it, and no command of crash or gdb can place a path
    there (that would take native code, which an agent cannot load: `extend` is off by default)."""
    deny_enosys = _bpf(_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)
    deny = _bpf(_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)
    allow = _bpf(_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    prog = [_bpf(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            _bpf(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            deny_enosys,
            _bpf(_LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
            _bpf(_JGE_K, 0, 1, X32_SYSCALL_BIT),
            deny_enosys,
            _bpf(_JEQ_K, 0, 1, NR_EXECVEAT),
            deny]
    if allowed_filename is None:
        prog += [_bpf(_JEQ_K, 0, 1, NR_EXECVE), deny, allow]
    else:  # execve: args[0] (offset 16: low word, 20: high word) must be the launcher's buffer
        prog += [_bpf(_JEQ_K, 0, 5, NR_EXECVE),
                 _bpf(_LD_W_ABS, 0, 0, 16),
                 _bpf(_JEQ_K, 0, 2, allowed_filename & 0xFFFF_FFFF),
                 _bpf(_LD_W_ABS, 0, 0, 20),
                 _bpf(_JEQ_K, 1, 0, allowed_filename >> 32),
                 deny,
                 allow]
    return b"".join(prog)


def install_filter(code: bytes) -> None:
    """Install a seccomp filter on this thread (no_new_privs must be set, or CAP_SYS_ADMIN held)."""
    filt = ctypes.create_string_buffer(code, len(code))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(code) // 8, ctypes.cast(filt, ctypes.c_void_p))
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prog), 0, 0), "seccomp filter")


def apply_seccomp(families: list[int]) -> dict[str, Any]:
    install_filter(seccomp_program(families))
    return {"socket_families": sorted(set(families))}


def exec_once_buffer(path: bytes) -> int:
    """Map the page at EXEC_ONCE_ADDR, put `path` there (NUL-terminated, then read-only) and return
    the address: the filename pointer `exec_filter(EXEC_ONCE_ADDR)` lets through."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    size = (len(path) + 1 + 4095) // 4096 * 4096
    addr = libc.mmap(EXEC_ONCE_ADDR, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0)
    if addr != EXEC_ONCE_ADDR:
        err = ctypes.get_errno()
        raise ConfineError(f"mmap of the exec buffer at {EXEC_ONCE_ADDR:#x}: {os.strerror(err)} (errno {err})")
    ctypes.memmove(addr, path + b"\0", len(path) + 1)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    check(libc.mprotect(addr, size, PROT_READ), "mprotect of the exec buffer")
    return EXEC_ONCE_ADDR


def execve_from(addr: int, argv: list[str], env: dict[str, str]) -> int:
    """execve with the file name read from `addr` (see `exec_once_buffer`); returns errno on failure."""
    args = (ctypes.c_char_p * (len(argv) + 1))(*[os.fsencode(a) for a in argv], None)
    envp = (ctypes.c_char_p * (len(env) + 1))(*[os.fsencode(f"{k}={v}") for k, v in env.items()], None)
    libc.execve.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    libc.execve(ctypes.c_void_p(addr), args, envp)
    return ctypes.get_errno()
