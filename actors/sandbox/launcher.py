"""The sandbox launcher: apply a confinement policy to this process, then execve the tool.

Run as `python -I -S launcher.py '<policy json>' -- tool args...` (see `sandbox.wrap`). It must run
without site-packages (stdlib + ctypes, and its sibling `kernel.py` for the Landlock and seccomp calls):
the launcher starts with `-I -S`.

Order of the steps (each is best-effort up to what the kernel offers; `report` says what applied):
0. identity (root, inside bubblewrap's namespaces only, see `sandbox.namespaces`): idmapped read-only
   views of the inputs the sandbox uid could not read, then that uid for good, in a user namespace of
   its own (`identity.py`); a step that fails stops the launch;
1. private /tmp (root only: a mount namespace where /tmp is the session's own tmp directory);
2. capabilities: everything not kept leaves the bounding set, so the tool gets none after execve;
3. PR_SET_NO_NEW_PRIVS: no setuid/file capabilities ever again (also what Landlock and seccomp need);
4. the death link: a tiny watchdog child kills the tool when the daemon process exits, or when the
   tool has run past its deadline (bpftrace: a run ends by itself even if the daemon is stuck or gone);
5. Landlock: filesystem (read / write / execute allow-lists), TCP bind+connect (ABI >= 4), abstract unix
   sockets and signals outside the sandbox (ABI >= 6);
6. seccomp: socket() only for the families the tool needs, no io_uring (it could open sockets
   without socket()), no x32 or 32-bit syscalls; with `exec_once`, a second filter that lets exactly
   one execve through, the launcher's own (its file name read from a page at a fixed address, see
   `kernel.exec_filter`): the tool and everything it starts can run no program, Landlock or not;
7. execve, with an environment of the policy's allow-list only (`env_keep`, plus `env_set`).
   Rulesets and filters are inherited by everything the tool starts and cannot be lifted.

`launcher.py --standby` is the same launcher started ahead of need (see `sandbox.standby`): it stops
after its imports, reads one run from stdin (the arguments above and the environment the daemon would
have given it), and takes steps 0-7 for that run exactly as a cold launch does (`launch`); nothing is
applied before the run arrives.
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
from typing import TYPE_CHECKING, Any

# Run by path with `-I -S`, this script has neither diagd nor its own directory on sys.path: it finds
# its sibling `kernel.py` by appending that directory (after the standard library, so no name there
# can shadow a stdlib module). Type checkers and an import as part of diagd take the package route.
if TYPE_CHECKING or __package__:
    from diagd.actors.sandbox import identity
    from diagd.actors.sandbox.kernel import (
        CAP_NAMES,
        CLONE_NEWNS,
        EXEC_ONCE_ADDR,
        MS_BIND,
        MS_PRIVATE,
        MS_REC,
        PR_CAP_AMBIENT,
        PR_CAP_AMBIENT_CLEAR_ALL,
        PR_CAPBSET_DROP,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        ConfineError,
        apply_landlock,
        apply_seccomp,
        check,
        exec_filter,
        exec_once_buffer,
        execve_from,
        install_filter,
        landlock_abi,
        libc,
        prctl,
        seccomp_available,
    )
else:
    sys.path.append(os.path.dirname(os.path.realpath(__file__)))
    import identity  # type: ignore[no-redef]
    from kernel import (
        CAP_NAMES,
        CLONE_NEWNS,
        EXEC_ONCE_ADDR,
        MS_BIND,
        MS_PRIVATE,
        MS_REC,
        PR_CAP_AMBIENT,
        PR_CAP_AMBIENT_CLEAR_ALL,
        PR_CAPBSET_DROP,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        ConfineError,
        apply_landlock,
        apply_seccomp,
        check,
        exec_filter,
        exec_once_buffer,
        execve_from,
        install_filter,
        landlock_abi,
        libc,
        prctl,
        seccomp_available,
    )

# -- capabilities, private /tmp, the death link ------------------------------------------------------

def drop_capabilities(keep: list[str], last: int | None = None) -> list[str]:
    """Drop every capability not in `keep` from the bounding set and clear the inheritable and ambient
    sets: after execve a root tool holds only `keep`. Without CAP_SETPCAP (not root) there is nothing to
    drop: such a process gains no capabilities on execve under no_new_privs anyway. `last`: the kernel's
    highest capability number, read already (a standby reads it while it waits)."""
    if last is None:
        last = cap_last()
    wanted = {CAP_NAMES.index(name) for name in keep if name in CAP_NAMES}
    kept = []
    for cap in range(last + 1):
        if cap in wanted:
            kept.append(CAP_NAMES[cap] if cap < len(CAP_NAMES) else str(cap))
        elif libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() == errno.EPERM:
            return []  # no CAP_SETPCAP: an unprivileged daemon
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # capset: version 3 header, then two {effective, permitted, inheritable} words; keep e/p, clear i.
    header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)
    data = ctypes.create_string_buffer(24)
    check(libc.syscall(125, header, data), "capget")  # SYS_capget
    words = list(struct.unpack("=6I", data.raw))
    words[2] = words[5] = 0
    new = ctypes.create_string_buffer(struct.pack("=6I", *words), 24)
    check(libc.syscall(126, header, new), "capset")  # SYS_capset
    return kept


def cap_last() -> int:
    """The running kernel's highest capability number (/proc/sys/kernel/cap_last_cap: a read takes
    ~0.1 ms, so a standby reads it while it waits and hands it to `drop_capabilities`)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return len(CAP_NAMES) - 1


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
    if os.geteuid() != 0 or libc.unshare(CLONE_NEWNS) < 0:
        return False
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
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
        check(libc.mount(f"/proc/self/fd/{src}".encode(), b"/tmp", None, MS_BIND, None), f"bind {source} on /tmp")
        for path, fd in kept:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.makedirs(path, 0o700, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), 0o700, exist_ok=True)
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600))
            check(libc.mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(path), None, MS_BIND, None),
                   f"bind {path} back into the private /tmp")
    finally:
        for _path, fd in kept:
            os.close(fd)
        os.close(src)
    return True


_WATCHDOG_IGNORES = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP,
                     signal.SIGTTIN, signal.SIGTTOU, signal.SIGPIPE)


def death_link(daemon_pid: int | None, deadline_s: float | None = None, grace_s: float = 10.0,
               watchdog: Any = None) -> bool:
    """Fork a watchdog that ends this process (the tool, after execve) when the daemon exits, and, with
    a deadline, when the tool has run that long: SIGINT first (bpftrace prints its maps and exits),
    SIGKILL `grace_s` later. The tool's program text is never changed for this.

    PR_SET_PDEATHSIG on the tool itself is not usable: it fires when the *thread* that forked the
    tool exits, and Trio forks children from cached worker threads that exit after 10 s idle. The
    watchdog instead holds a pidfd of the daemon *process*; its own PDEATHSIG (its parent is the
    single-threaded tool) ends it with the tool, so no watchdog outlives its tool.

    `watchdog`: a standby's watchdog forked ahead (`prefork_watchdog`), handed the daemon's pidfd and the
    deadline here instead of a fork now (a fork of this process takes ~0.4 ms); if it is gone, a fork.
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
    if watchdog is not None and _hand_over(watchdog, pidfd, deadline_s, grace_s):
        if pidfd is not None:
            os.close(pidfd)
        return True
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


def prefork_watchdog() -> Any:
    """A standby's death-link watchdog, forked while it waits: a child of this process (the tool to be)
    that keeps nothing of it but a socket, and waits there for the run's daemon pidfd and deadline
    (`death_link`), then watches as a watchdog forked at the run does (`_watch`). Without them (EOF: no
    death link for this run, or no run) it leaves. It never executes anything, so that it is forked
    before the run's capabilities and no_new_privs changes nothing it could use; a run with steps that
    would change it (identity, a private /tmp: `forks_own_watchdog`) does not use it."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tool = os.getpid()
    child = os.fork()
    if child:
        theirs.close()
        return ours
    try:
        tool_fd = _watchdog_setup(tool, keep=(theirs.fileno(),))
        message, fds, _flags, _address = socket.recv_fds(theirs, 4096, 1)
        theirs.close()
        if message:
            params = json.loads(message)
            _watch(tool, fds[0] if fds else None, params["deadline_s"], float(params["grace_s"]), tool_fd)
    finally:
        os._exit(0)
    return None  # unreachable


def forks_own_watchdog(policy: dict[str, Any]) -> bool:
    """Whether a run's death link must be forked at the run (not handed to a standby's watchdog): its
    steps before the death link change the process beyond capabilities and no_new_privs."""
    return bool(policy.get("namespaces") or policy.get("run_as") or policy.get("private_tmp")
                or policy.get("foreground"))


def _hand_over(watchdog: Any, pidfd: int | None, deadline_s: float | None, grace_s: float) -> bool:
    import socket

    message = json.dumps({"deadline_s": deadline_s, "grace_s": grace_s}).encode()
    try:
        socket.send_fds(watchdog, [message], [pidfd] if pidfd is not None else [])
    except OSError:
        return False  # it is gone (killed): the caller forks one
    finally:
        watchdog.close()
    return True


def _watchdog_setup(tool: int, keep: tuple[int, ...] = ()) -> int:
    """The watchdog's first steps (a child of the tool): immune to the signals around it, killed with its
    parent, a pidfd of the tool (returned), and no other descriptor but `keep`: the tool's pipes or pty
    must see EOF when the tool ends, not later."""
    for sig in _WATCHDOG_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # PDEATHSIG alone is not enough: the tool's Landlock domain (ABI >= 6 scopes signals) forbids
    # the kernel's parent-death signal from the sandboxed tool to this unsandboxed watchdog, so it
    # also watches the tool through a pidfd and leaves when the tool has ended.
    tool_fd = os.pidfd_open(tool)
    if os.getppid() != tool:
        os._exit(0)
    low = 0
    for fd in sorted((*keep, tool_fd)):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    return tool_fd


def _watch(tool: int, pidfd: int | None, deadline_s: float | None, grace_s: float,
           tool_fd: int | None = None) -> None:
    """The watchdog (a child of the tool): wait for the tool to end, the daemon to exit or the deadline.
    `tool_fd`: set up already (a watchdog forked ahead)."""
    import select
    import time

    if tool_fd is None:
        tool_fd = _watchdog_setup(tool, keep=() if pidfd is None else (pidfd,))
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

def take_identity(policy: dict[str, Any]) -> dict[str, Any]:
    """Step 0: the inputs the sandbox uid cannot read shown to it through idmapped views, then that uid
    in a user namespace of its own. Only inside the namespaces bubblewrap made (the views must stay in
    the tool's mount namespace); only as root (otherwise bubblewrap's user namespace already is the
    daemon user's)."""
    if not policy.get("namespaces") or not policy.get("run_as") or os.geteuid() != 0:
        return {}
    uid, gid = (int(v) for v in policy["run_as"])
    mapped: list[str] = []
    userns = None
    try:
        for path in sorted(policy.get("idmap") or (), key=lambda p: (p.count("/"), p)):
            if identity.readable_by(path, uid, gid):
                continue
            if userns is None:
                userns = identity.mapping_namespace(uid, gid)
            identity.idmapped_view(path, userns)
            mapped.append(path)
    finally:
        if userns is not None:
            os.close(userns)
    identity.become(uid, gid)
    return {"uid": uid, "gid": gid, "user_namespace": True, "idmapped": mapped}


def apply(policy: dict[str, Any], watchdog: Any = None, last_cap: int | None = None) -> dict[str, Any]:
    """Apply every step the policy asks for; returns what was applied (the tool sees it as DIAGD_SANDBOX).
    `watchdog`, `last_cap`: what a standby prepared while it waited (`death_link`, `drop_capabilities`)."""
    report: dict[str, Any] = {"landlock": 0, "seccomp": False}
    try:
        who = take_identity(policy)
    except identity.IdentityError as exc:
        raise ConfineError(str(exc)) from None
    if who:
        report["identity"] = who
    if policy.get("foreground"):
        report["foreground"] = take_foreground()
    tmp = policy.get("private_tmp")
    keep = [p for key in ("read", "write", "exec", "devices") for p in policy.get(key, ())]
    if tmp and private_tmp(tmp, keep):
        report["private_tmp"] = tmp
    if policy.get("drop_caps", True):
        report["caps"] = drop_capabilities(list(policy.get("keep_caps", ())), last_cap)
    prctl(PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
    if policy.get("die_with") or policy.get("deadline_s"):
        deadline = policy.get("deadline_s")
        report["death_link"] = death_link(policy.get("die_with"), None if deadline is None else float(deadline),
                                          watchdog=watchdog)
    families = policy.get("socket_families")
    use_seccomp = families is not None and seccomp_available()
    abi = 0 if policy.get("landlock") is False else landlock_abi()
    if abi:
        report["landlock"] = apply_landlock(policy, abi)["abi"]
    if use_seccomp and families is not None:
        apply_seccomp(list(families))
        report["seccomp"] = True
    if policy.get("exec_once"):
        if not seccomp_available():
            raise ConfineError("the policy asks for seccomp's exec denial, and this kernel or architecture has "
                               "no seccomp filter")
        install_filter(exec_filter(EXEC_ONCE_ADDR))
        report["exec"] = "denied after this one"
    return report


def take_foreground() -> bool:
    """A process group of its own, made the foreground of the terminal on stdin (as a shell does for a
    job): the terminal's SIGINT then reaches the tool, not the processes around it. False: no terminal."""
    if not os.isatty(0):
        return False
    os.setpgid(0, 0)
    # A background group changing the foreground gets SIGTTOU: ignored for that call only (an ignored
    # signal would stay ignored across execve).
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(0, os.getpgrp())
    finally:
        signal.signal(signal.SIGTTOU, previous)
    return True


def tool_env(policy: dict[str, Any], environ: dict[str, str]) -> dict[str, str]:
    """The tool's environment: the variables `env_keep` names (`LC_*`: a prefix), then `env_set`."""
    keep = list(policy.get("env_keep", ()))
    names = {k for k in keep if not k.endswith("*")}
    prefixes = tuple(k[:-1] for k in keep if k.endswith("*"))
    env = {k: v for k, v in environ.items() if k in names or (prefixes and k.startswith(prefixes))}
    env.update(dict(policy.get("env_set") or ()))
    return env


# -- the supervisor in front of bubblewrap -----------------------------------------------------------

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def supervise(daemon_pid: int, argv: list[str]) -> int:
    """Run bubblewrap (`argv`) as a child and stand in for it: its exit status is ours, the signals we get
    are passed on, and when the daemon exits it is killed. bubblewrap's --die-with-parent is a parent-death
    signal, which the kernel sends when the *thread* that forked it exits: the daemon forks from worker
    threads that end after idling, so bubblewrap's parent must be this single-threaded process; it
    watches the daemon through a pidfd (a PID, not a thread). Killing bubblewrap ends every process of
    its PID namespace (its init dies with it)."""
    import select

    try:
        daemon = os.pidfd_open(daemon_pid)
    except OSError:
        print("diagd sandbox: the daemon is gone", file=sys.stderr)
        return 125
    if os.getppid() != daemon_pid:
        print("diagd sandbox: the daemon is gone", file=sys.stderr)
        return 125
    child = os.fork()
    if child == 0:
        os.close(daemon)
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    for sig in _FORWARDED:
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    bwrap = os.pidfd_open(child)
    poller = select.poll()
    poller.register(daemon, select.POLLIN)
    poller.register(bwrap, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
        except InterruptedError:
            continue
        if bwrap in ready:
            break
        if daemon in ready:
            os.kill(child, signal.SIGKILL)
            break
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        ended_by = os.WTERMSIG(status)
        signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)  # end the way bubblewrap ended, so the daemon reads the same status
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str]) -> int:
    if argv[1:] == [STANDBY]:
        return standby()
    if len(argv) < 4 or argv[2] != "--":
        print("usage: launcher.py POLICY_JSON -- PROGRAM [ARGS...]  |  launcher.py --standby", file=sys.stderr)
        return 2
    return launch(json.loads(argv[1]), argv[3:], dict(os.environ))


def launch(policy: dict[str, Any], tool: list[str], environ: dict[str, str], watchdog: Any = None,
           last_cap: int | None = None) -> int:
    """Apply `policy` to this process and execve `tool` with `environ` filtered by it (returns only on
    failure: 126 the confinement, 127 the execve). `watchdog`, `last_cap`: a standby's, prepared ahead
    (`death_link`, `drop_capabilities`)."""
    if policy.get("supervise"):
        return supervise(int(policy["die_with"]), tool)
    executable = os.fsencode(policy.get("executable") or tool[0])
    try:
        # Mapped before the filters go in, so the address is ours before anything else could take it.
        buffer = exec_once_buffer(executable) if policy.get("exec_once") else None
        report = apply(policy, watchdog, last_cap)
    except ConfineError as exc:
        print(f"diagd sandbox: {exc}", file=sys.stderr)
        return 126
    finally:
        if watchdog is not None:
            watchdog.close()  # handed over, or not needed: then it leaves (EOF)
    env = tool_env(policy, environ)
    env["DIAGD_SANDBOX"] = json.dumps(report, separators=(",", ":"))
    if buffer is not None:
        err = execve_from(buffer, tool, env)
        print(f"diagd sandbox: cannot execute {tool[0]}: {os.strerror(err)}", file=sys.stderr)
        return 127
    try:
        os.execve(executable, tool, env)
    except OSError as exc:
        print(f"diagd sandbox: cannot execute {tool[0]}: {exc.strerror}", file=sys.stderr)
    return 127


# -- the standby: a launcher started ahead of need -----------------------------------------------------

STANDBY = "--standby"
MAX_REQUEST_BYTES = 8 * 1024 * 1024  # a run's policy, argv (a program is at most 64 KiB) and environment


def standby() -> int:
    """Wait, started and imported, for one run, then launch it as a cold launcher would (`launch`): the
    interpreter's start and the imports (most of a cold launch) are done before the run is asked for,
    and the death link's watchdog is forked (`prefork_watchdog`: it holds nothing until the run).

    The run comes on stdin, which only the daemon holds (a pipe), as one JSON document ended by EOF:
    {"args": [POLICY_JSON, "--", PROGRAM, ARGS...], "env": {...}}: the command line after the launcher's
    path in `sandbox.wrap`'s argv, and the environment the daemon would have started it with. Nothing
    is applied before it: every step of `apply` is taken after the go, for that run alone, exactly as
    for a cold one. stdin then becomes /dev/null (a cold run's). EOF without a request (the daemon
    retired it, or died): it leaves with 0, having run nothing."""
    import gc
    import select  # noqa: F401  (the death link's watchdog imports these: imported now, not after the go)
    import time  # noqa: F401

    last_cap = cap_last()  # a constant of the kernel, read now rather than after the go
    watchdog = prefork_watchdog()
    # The fork left every page of this process copy-on-write: a collection writes most of them now, so
    # the run's steps do not take those faults (~190 between the go and the execve; ~95 after this).
    gc.collect()
    request = read_request(0)
    if request is None:
        return 0
    args, environ = request.get("args"), request.get("env")
    if not (isinstance(args, list) and len(args) >= 3 and args[1] == "--" and isinstance(environ, dict)
            and all(isinstance(a, str) for a in args)):
        print("diagd sandbox: a standby got a malformed request", file=sys.stderr)
        return 2
    policy = json.loads(args[0])
    if not isinstance(policy, dict) or policy.get("supervise"):
        print("diagd sandbox: a standby runs no supervisor", file=sys.stderr)
        return 2
    if forks_own_watchdog(policy):
        watchdog.close()
        watchdog = None
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    return launch(policy, args[2:], {str(k): str(v) for k, v in environ.items()}, watchdog, last_cap)


def read_request(fd: int) -> dict[str, Any] | None:
    """The JSON document on `fd` up to EOF (at most MAX_REQUEST_BYTES); None when it is empty."""
    chunks: list[bytes] = []
    size = 0
    while chunk := os.read(fd, 1 << 16):
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            print(f"diagd sandbox: a standby's request exceeds {MAX_REQUEST_BYTES} bytes", file=sys.stderr)
            raise SystemExit(2)
        chunks.append(chunk)
    if not chunks:
        return None
    request = json.loads(b"".join(chunks))
    if not isinstance(request, dict):
        print("diagd sandbox: a standby got a malformed request", file=sys.stderr)
        raise SystemExit(2)
    return request


if __name__ == "__main__":
    sys.exit(main(sys.argv))
