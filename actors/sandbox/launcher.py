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
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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


def apply(policy: dict[str, Any]) -> dict[str, Any]:
    """Apply every step the policy asks for; returns what was applied (the tool sees it as DIAGD_SANDBOX)."""
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
        report["caps"] = drop_capabilities(list(policy.get("keep_caps", ())))
    prctl(PR_SET_NO_NEW_PRIVS, 1, what="PR_SET_NO_NEW_PRIVS")
    if policy.get("die_with") or policy.get("deadline_s"):
        deadline = policy.get("deadline_s")
        report["death_link"] = death_link(policy.get("die_with"), None if deadline is None else float(deadline))
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
    if len(argv) < 4 or argv[2] != "--":
        print("usage: launcher.py POLICY_JSON -- PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    policy = json.loads(argv[1])
    tool = argv[3:]
    if policy.get("supervise"):
        return supervise(int(policy["die_with"]), tool)
    executable = os.fsencode(policy.get("executable") or tool[0])
    try:
        # Mapped before the filters go in, so the address is ours before anything else could take it.
        buffer = exec_once_buffer(executable) if policy.get("exec_once") else None
        report = apply(policy)
    except ConfineError as exc:
        print(f"diagd sandbox: {exc}", file=sys.stderr)
        return 126
    env = tool_env(policy, dict(os.environ))
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
