"""Who a confined tool runs as: an unprivileged uid in a user namespace of its own, and read-only views of
root-owned inputs that this uid can read (idmapped mounts). Stdlib and ctypes only, like `kernel.py`:
the launcher imports it by path.

Used by the launcher when the daemon is root and the tool runs inside bubblewrap's mount namespace (see
`sandbox.namespaces`): there the launcher is still root, so it can
1. make each input the tool must read (a dump is typically 0600 root: makedumpfile creates it so)
   readable by the sandbox uid without changing the file: an idmapped, read-only bind mount on the same
   path in the tool's private mount namespace, where the file's owner root appears as the sandbox uid
   (`mount_setattr(MOUNT_ATTR_IDMAP)`, Linux 5.12+, on ext4, xfs, btrfs, tmpfs...). The host sees nothing;
2. switch to the sandbox uid and gid for good (no groups), then enter a user namespace of its own that
   maps only that uid: whatever the tool does afterwards, the kernel counts it as that uid, never root,
   and its capabilities (none after execve) are those of a namespace that owns nothing of the host.
"""


import ctypes
import os
import signal
import struct

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE = 4
# <linux/mount.h>
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000


class IdentityError(Exception):
    """The tool cannot be given its unprivileged identity: it must not start."""


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise IdentityError(f"{what}: {os.strerror(err)} (errno {err})")
    return result


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mapping_namespace(uid: int, gid: int) -> int:
    """A user namespace (its fd) in which id 0 is the host's `uid`/`gid`: what an idmapped mount needs to
    show root's files as that uid's. Made by a child that unshares and waits; root writes its maps."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only unshares and waits to be measured
        try:
            os.close(ready_r)
            os.close(hold_w)
            if libc.unshare(CLONE_NEWUSER) < 0:
                os._exit(1)
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # until the parent has its fd
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise IdentityError("unshare(CLONE_NEWUSER) failed in the mapping child")
        _write(f"/proc/{child}/uid_map", f"0 {uid} 1\n")
        _write(f"/proc/{child}/setgroups", "deny")
        _write(f"/proc/{child}/gid_map", f"0 {gid} 1\n")
        return os.open(f"/proc/{child}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise IdentityError(f"cannot make the id-mapping namespace: {exc}") from None
    finally:
        os.close(ready_r)
        os.close(hold_w)
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(child, 0)


def idmapped_view(path: str, userns_fd: int) -> None:
    """Cover `path` (a file or directory, already in this mount namespace) with a read-only, nosuid/nodev
    bind of itself whose owner ids are mapped through `userns_fd`. Not noexec: a directory shown this way
    may hold the tool itself (what runs is seccomp's and Landlock's to decide)."""
    tree = _check(libc.syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), os.fsencode(path),
                               ctypes.c_uint(OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)), f"open_tree {path}")
    try:
        # struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd; }
        attr = ctypes.create_string_buffer(struct.pack(
            "=QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0, 0, userns_fd), 32)
        _check(libc.syscall(SYS_MOUNT_SETATTR, ctypes.c_int(tree), b"", ctypes.c_uint(AT_EMPTY_PATH), attr,
                            ctypes.c_size_t(32)), f"mount_setattr(MOUNT_ATTR_IDMAP) {path}")
        _check(libc.syscall(SYS_MOVE_MOUNT, ctypes.c_int(tree), b"", ctypes.c_int(AT_FDCWD), os.fsencode(path),
                            ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)), f"move_mount {path}")
    finally:
        os.close(tree)


def readable_by(path: str, uid: int, gid: int) -> bool:
    """Whether `uid` (with only `gid`) may read `path` by its mode bits (ACLs aside)."""
    try:
        st = os.stat(path)
    except OSError:
        return True  # missing: nothing to map (the tool reports it)
    if st.st_uid == uid:
        return bool(st.st_mode & 0o400)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o040)
    return bool(st.st_mode & 0o004)


def become(uid: int, gid: int, *, own_namespace: bool = True) -> None:
    """Drop root for `uid`/`gid` (no supplementary groups), then enter a user namespace mapping only them."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise IdentityError(f"still not uid {uid} / gid {gid} after setresuid")
    if not own_namespace:
        return
    # A changed uid makes the process non-dumpable, which makes /proc/self/* root's: its own maps could
    # not be written. execve resets this flag anyway.
    _check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    _check(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    try:
        _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    except OSError as exc:
        raise IdentityError(f"cannot map the sandbox user namespace: {exc}") from None
