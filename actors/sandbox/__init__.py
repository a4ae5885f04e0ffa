"""Kernel-enforced confinement for the children that run what an agent typed (crash, drgn, bpftrace).

`wrap(argv, policy)` turns a tool's command line into a launcher command line: the launcher
(`launcher.py`, a standalone script: stdlib only, with the kernel calls in `kernel.py`) applies the
policy to itself and then execs the tool, so the tool
and everything it starts live inside it. What each tool may touch is declared below, in one place:
every entry says why the tool needs it (measured with strace on crash 8.0.2, drgn 0.3.0 and
bpftrace 0.17 against the vmcore fixture and tracefs).

Where Landlock is missing (ABI 0), or forced off with DIAGD_LANDLOCK=off (tests, diagnostics), the
escape-capable features are refused by `require_confinement` unless the config allows them
unconfined; the other steps (no_new_privs, capabilities, seccomp and its exec denial, the environment
allow-list, the death link) still apply.

A run can also be handed to a launcher started ahead of need (`standby`: bpftrace's runs), which then
takes the same steps for it; only the interpreter's start and imports were done beforehand.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from diagd.actors.sandbox import kernel, namespaces
from diagd.protocol.errors import DiagdError, ErrorCode

# Run by path (never imported): see the top of launcher.py for how it finds kernel.py.
LAUNCHER = str(Path(__file__).with_name("launcher.py").resolve())
FORCE_ENV = "DIAGD_LANDLOCK"  # "off" (or "0"): behave as if the kernel had no Landlock

# -- what every tool reads -------------------------------------------------------------------------
# Shared libraries, locale data, gconv, headers, man pages and /usr/lib/os-release live under /usr
# (on merged-/usr Debian /lib and /lib64 are symlinks into it; both names are listed for other
# systems). /etc is not readable as a whole (/etc/shadow, ssh keys): only the files the loader and
# libc look at.
SYSTEM_READ = (
    "/usr", "/lib", "/lib64",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d",  # the dynamic loader
    "/etc/localtime",  # libc's localtime (crash `log -T`, bpftrace strftime, Python time)
    "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",  # getpwuid: bpftrace `username`, Python getpass
    "/etc/os-release", "/etc/debian_version",  # bpftrace reads them at start (kernel headers lookup)
)
# Character devices opened by path: crash opens /dev/null O_RDWR|O_CREAT|O_TRUNC for its scratch
# output, and /dev/tty (its controlling terminal: the pty diagd drives) for readline; without it
# crash never prompts. The pty or pipes a tool talks through are inherited open and need no rule.
DEVICES = ("/dev/null", "/dev/tty")
# The environment a confined tool gets: these names only (`X*`: a prefix), never the daemon's whole
# environment (secrets, PYTHON*, LD_*, CRASH_EXTENSIONS, CRASHPAGER...). HOME names a directory that does
# not exist: crash stats $HOME/.crashrc and gdb reads $HOME/.gdbinit (a gdb script, outside gdb's
# auto-load safe-path rules), readline $HOME/.inputrc; none of them may come from a place an agent
# could write.
BASE_ENV = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ")
NO_HOME = (("HOME", "/nonexistent"),)


@dataclass(frozen=True)
class Policy:
    """What one confined child may reach. Paths that do not exist are skipped by the launcher."""

    read: tuple[str, ...] = ()  # read files and list directories beneath these
    write: tuple[str, ...] = ()  # also create, change, rename and remove beneath these (never execute)
    exec: tuple[str, ...] = ()  # may be executed (the tool itself; its ELF interpreter is added by wrap)
    devices: tuple[str, ...] = DEVICES
    net: bool = False  # TCP bind/connect (Landlock ABI >= 4)
    socket_families: tuple[int, ...] | None = ()  # seccomp: families socket() may create; None = no filter
    keep_caps: tuple[str, ...] = ()  # capabilities a root tool keeps (names as in capabilities(7), lower case)
    private_tmp: str | None = None  # root: this directory becomes the tool's /tmp
    die_with: int | None = field(default_factory=os.getpid)  # the tool is killed when this process exits
    deadline_s: float | None = None  # past this run time the tool gets SIGINT, then SIGKILL 10 s later
    landlock: bool = True  # False: skip Landlock (it is unavailable or forced off)
    exec_once: bool = False  # seccomp: the launcher's execve of the tool is the last one (any kernel)
    env_keep: tuple[str, ...] = BASE_ENV  # the variables passed on (`LC_*`: a prefix)
    env_set: tuple[tuple[str, str], ...] = NO_HOME  # set after the allow-list
    # Namespaces of its own (bubblewrap, see `namespaces`): only `read`, `exec` and the scratch tmpfs
    # exist for the tool; `write` must then lie in the scratch. A root daemon's tool runs as `run_as` in a
    # user namespace of its own, `idmap` (inputs root may own) shown to it read-only as its own files.
    namespaces: bool = False
    scratch: str = "/tmp"
    scratch_bytes: int = 256 * 1024 * 1024
    run_as: tuple[int, int] | None = None
    idmap: tuple[str, ...] = ()
    # On a terminal, the tool takes a process group of its own and makes it the terminal's foreground: a
    # ^C diagd types reaches the tool alone, never bubblewrap's processes (which would end the sandbox).
    foreground: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


# -- availability ----------------------------------------------------------------------------------

def forced_off() -> bool:
    return os.environ.get(FORCE_ENV, "").strip().lower() in ("off", "0", "no", "false")


def landlock_abi() -> int:
    """The Landlock ABI confinement will use: 0 when the kernel has none or FORCE_ENV turns it off."""
    if forced_off():
        return 0
    return kernel.landlock_abi()


def seccomp_available() -> bool:
    return kernel.seccomp_available()


def describe() -> dict[str, object]:
    """For `diagd doctor` and status: what confinement this daemon can apply."""
    kernel_abi = kernel.landlock_abi()
    return {"landlock_abi": landlock_abi(), "kernel_landlock_abi": kernel_abi, "forced_off": forced_off(),
            "seccomp": seccomp_available(), "root": os.geteuid() == 0}


def unavailable_reason() -> str:
    if forced_off():
        return f"Landlock is turned off by {FORCE_ENV}={os.environ.get(FORCE_ENV)}"
    return "this kernel offers no Landlock (ABI 0: too old, or not enabled at boot with lsm=...,landlock)"


def require_confinement(feature: str, *, allowed_unconfined: bool, setting: str) -> None:
    """Refuse an escape-capable feature when no Landlock sandbox would contain it."""
    if allowed_unconfined or landlock_abi() > 0:
        return
    user = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    raise DiagdError(ErrorCode.PERMISSION_DENIED,
                     f"{feature} is refused: {unavailable_reason()}, so it would run unconfined as {user} "
                     "(able to read any file and start programs)",
                     landlock_abi=0, setting=setting,
                     hint=f"use a kernel with Landlock (5.13+, lsm=landlock), or set {setting} = true to accept "
                          "running it unconfined")


# -- wrapping a command line -----------------------------------------------------------------------

def resolve_executable(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(name)
    return os.path.realpath(found)


def elf_interpreter(path: str) -> str | None:
    """PT_INTERP of a 64-bit little-endian ELF file (the dynamic loader execve also executes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum):
                p_type, = struct.unpack_from("<I", table, i * phentsize)
                if p_type == 3:  # PT_INTERP
                    offset, = struct.unpack_from("<Q", table, i * phentsize + 8)
                    size, = struct.unpack_from("<Q", table, i * phentsize + 32)
                    f.seek(offset)
                    return os.path.realpath(f.read(size).rstrip(b"\0").decode())
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


def launcher_prefix() -> list[str]:
    """How a launcher starts outside namespaces (`wrap`'s command line before its policy, and a standby's:
    `standby`): isolated (-I: no environment variables, no user site) and without site (-S)."""
    return [sys.executable, "-I", "-S", LAUNCHER]


def wrap(argv: Sequence[str], policy: Policy) -> list[str]:
    """The launcher command that runs argv under policy (argv[0] is looked up on PATH here)."""
    executable = resolve_executable(argv[0])
    execs = [executable, *policy.exec]
    interp = elf_interpreter(executable)
    if interp:
        execs.append(interp)
    full = replace(policy, exec=tuple(dict.fromkeys(execs)))
    # The fields one level deep (asdict's deep copy, and a JSON round trip, took most of a run's wrap):
    # every value is a scalar or a tuple of scalars or pairs, which JSON writes as asdict's copy.
    doc: dict[str, object] = {f.name: getattr(full, f.name) for f in fields(full)}
    doc["executable"] = executable
    launcher = [*launcher_prefix(), json.dumps(doc, separators=(",", ":")), "--", *argv]
    if not full.namespaces:
        return launcher
    # The launcher itself runs inside: the interpreter and its standard library, and its own directory.
    # The base interpreter by its real path: a venv's python is a link into it, and needs only the stdlib.
    python = os.path.realpath(sys.executable)
    own = (sys.base_prefix, python, str(Path(LAUNCHER).parent))
    jail = namespaces.bwrap_argv(read=(*full.read, *full.exec, *own), scratch=full.scratch,
                                 scratch_bytes=full.scratch_bytes)
    supervisor = json.dumps({"supervise": True, "die_with": os.getpid()}, separators=(",", ":"))
    return [python, "-I", "-S", LAUNCHER, supervisor, "--", *jail, python, *launcher[1:]]


def require_namespaces(feature: str, here: namespaces.Namespaces, *, allowed_unconfined: bool, setting: str) -> bool:
    """True when `feature` can run in namespaces of its own (`here`, the back end's probe); False when it
    cannot but the config accepts that; else refused with the reason."""
    ok, why = here.available()
    if ok:
        return True
    if allowed_unconfined:
        return False
    raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                     f"{feature} is refused: it runs only in namespaces of its own, and {why}",
                     setting=setting,
                     hint=f"install bubblewrap (`diagd setup crash`), or set {setting} = true to run it with "
                          "Landlock and seccomp alone")


def jailed(policy: Policy, *, inputs: Sequence[str], scratch_bytes: int) -> Policy:
    """`policy` moved into namespaces of its own (see `namespaces`): it writes only its scratch tmpfs, and
    a root daemon's tool runs as the sandbox user, `inputs` shown to it as readable."""
    # die_with: a daemon pid means nothing in the tool's PID namespace; bubblewrap ends the sandbox
    # with the daemon instead (`--die-with-parent`, and its outer process dies with the daemon's).
    return Policy(**{**asdict(policy), "namespaces": True, "write": (policy.scratch,), "private_tmp": None,
                     "die_with": None, "foreground": True,
                     "scratch_bytes": scratch_bytes,
                     "run_as": namespaces.sandbox_ids() if os.geteuid() == 0 else None,
                     "idmap": tuple(inputs) if os.geteuid() == 0 else ()})


def readable_beside(allowed_dirs: Sequence[str], private_dirs: Sequence[str]) -> tuple[str, ...]:
    """`allowed_dirs` less diagd's own directories (state, runtime) inside them.

    Landlock only grants: nothing beneath a granted directory can be taken back. So a granted
    directory that holds a private one (a home directory holds the state dir) is replaced by its
    entries, except the one leading to the private dir, which is expanded the same way. Symlinks
    among the entries are left out (a rule follows them, and would grant their target); entries made
    after the child starts are not granted."""
    privates = [Path(p).resolve() for p in private_dirs]
    out: list[str] = []

    def grant(path: Path) -> None:
        if any(path == p or p in path.parents for p in privates):
            return  # a private dir, or inside one
        if not any(path in p.parents for p in privates):
            out.append(str(path))
            return
        try:
            entries = [Path(e.path) for e in os.scandir(path) if not e.is_symlink()]
        except OSError:
            return
        for entry in sorted(entries):
            grant(entry)

    for raw in allowed_dirs:
        grant(Path(raw).expanduser().resolve())
    return tuple(dict.fromkeys(out))


def _parents(paths: Iterable[str | Path]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(str(Path(p).parent) for p in paths))


# -- the three policies ----------------------------------------------------------------------------

def crash_policy(*, vmcore: Path, vmlinux: Path, workdir: Path, allowed_dirs: Sequence[str] = (),
                 extra_read: Sequence[str] = (), private_dirs: Sequence[str] = ()) -> Policy:
    """crash: the dump, its vmlinux and the directories they sit in (modules and .debug files next to
    them, `mod -S <dir>`), the daemon's allowed_dirs (where the agent may name files anyway), and the
    session directory to write. It needs to execute nothing: what it tries is refused and it carries on
    (`iconv -l` for gdb's charset list, `sh -c nm -DSBn crash` to check its own symbols). So the launcher's
    execve is its last (`exec_once`): with or without Landlock, neither crash nor its gdb runs a program.
    Never diagd's own `private_dirs` (state, runtime), wherever they sit (`readable_beside`)."""
    tmp = workdir / "tmp"
    around = readable_beside([*_parents([vmcore, vmlinux]), *allowed_dirs, *extra_read], private_dirs)
    return Policy(
        read=(*SYSTEM_READ, str(vmcore), str(vmlinux), *around),
        # The private /tmp is a mount of its own: Landlock sees its root as a separate inode to allow.
        write=(str(workdir), str(tmp)),
        private_tmp=str(tmp) if os.geteuid() == 0 else None,  # tmpfile() is hard-wired to /tmp
        landlock=landlock_abi() > 0,
        exec_once=seccomp_available(),
        env_keep=(*BASE_ENV, "TERM"),
    )


def python_read_paths() -> tuple[str, ...]:
    """What the interpreter needs to start and import drgn, msgpack and diagd (an editable install
    maps diagd's packages to the source tree, so each package directory is listed)."""
    import importlib.util
    import sysconfig

    paths = [sys.base_prefix, sys.prefix, os.path.realpath(sys.executable)]
    paths += [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    for name in ("diagd", "diagd.actors", "diagd.protocol"):  # what the confined workers import
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            paths += [os.path.realpath(p) for p in spec.submodule_search_locations]
    paths.append(str(Path(sys.prefix) / "pyvenv.cfg"))
    return tuple(dict.fromkeys(paths))


def drgn_policy(*, vmcore: Path, vmlinux: Path, workdir: Path, allowed_dirs: Sequence[str] = (),
                private_dirs: Sequence[str] = ()) -> Policy:
    """The drgn worker: Python (the base prefix, the venv, diagd's packages), the dump and its debug
    files, and the session directory (outputs are written there). No sockets of any family, and no
    execve after the launcher's (`exec_once`); once it is running the worker also forbids execve itself
    (`sandbox.kernel.deny_exec`: seccomp, and a Landlock layer where there is Landlock). Never
    diagd's own `private_dirs`, as for crash."""
    return Policy(
        read=(*SYSTEM_READ, *python_read_paths(), str(vmcore), str(vmlinux),
              *readable_beside([*_parents([vmcore, vmlinux]), *allowed_dirs], private_dirs)),
        write=(str(workdir),),
        exec=(os.path.realpath(sys.executable),),
        landlock=landlock_abi() > 0,
        exec_once=seccomp_available(),
    )


# bpftrace is root and loads BPF by design (it can read kernel memory: that is its job); these are the
# capabilities it uses, and everything else (modules, raw I/O, reboot, mknod, setuid...) is dropped.
BPFTRACE_CAPS = ("sys_admin", "bpf", "perfmon", "sys_resource", "ipc_lock", "dac_override", "dac_read_search",
                 "sys_ptrace")


def _shell_and_clang() -> tuple[str, ...]:
    found = [shutil.which(name) for name in ("sh", "clang-14")]
    return tuple(os.path.realpath(p) for p in found if p)


def bpftrace_policy(*, unsafe: bool = False, deadline_s: float | None = None) -> Policy:
    """bpftrace: /sys (tracefs, BTF, cpu lists) and /proc (kallsyms, /proc/<pid>/maps for ustack and
    uprobes) to read, kernel headers under /usr and /lib/modules, nothing to write.

    It may execute /bin/sh and clang-14, and nothing else: bpftrace 0.17 runs `sh -c "clang-14 -Wp,-v
    -x c -fsyntax-only /dev/null"` to learn clang's include paths whenever a program needs its C parser
    (struct definitions, casts, tracepoint `args`), and when that exec is refused it dies with SIGSEGV
    (its popen wrapper calls pclose(NULL)). A safe-mode program has no way to run a command itself.
    With allow_unsafe, system() runs `sh -c <anything>`, so the system binary directories become
    executable: unsafe mode is not confined for execution."""
    execs = ("/bin", "/usr/bin", "/sbin", "/usr/sbin") if unsafe else _shell_and_clang()
    return Policy(
        read=(*SYSTEM_READ, "/sys", "/proc", "/lib/modules"),
        exec=execs,
        keep_caps=BPFTRACE_CAPS,
        deadline_s=deadline_s,
        landlock=landlock_abi() > 0,
        env_keep=(*BASE_ENV, "BPFTRACE_*", "__BPFTRACE_*"),  # its own settings, and diagd's attach marker
    )


def confine(what: str, policy: Policy, here: namespaces.Namespaces, *, allowed_unconfined: bool, setting: str,
            scratch_bytes: int) -> Policy:
    """`policy` in namespaces of its own, the inputs being what it reads beyond the system's files: the
    barrier that holds whatever a command check lets through. Without bubblewrap, refused unless the
    config accepts the tool with Landlock and seccomp alone (then `policy` as it is)."""
    if not require_namespaces(what, here, allowed_unconfined=allowed_unconfined, setting=setting):
        return policy
    inputs = [p for p in policy.read if p not in SYSTEM_READ]
    return jailed(policy, inputs=inputs, scratch_bytes=scratch_bytes)
