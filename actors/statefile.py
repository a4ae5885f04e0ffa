"""diagd's own files under its state directory: opened without following a link, links refused with a
coded error.

The audit log, the back ends' stores (bpftrace runs, crash sessions, serial logs) and their
directories are diagd's alone; a symlink among them was planted (by something running as the same
user, or by a confined tool writing into its own session directory) to make the daemon write or read
elsewhere. Files are opened with O_NOFOLLOW and must be regular files; directories are created 0700
and must be real directories, never links. A refusal is PERMISSION_DENIED naming the path and the
link's target: the daemon's start fails with that one line, a call with that coded error.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from diagd.protocol.errors import DiagdError, ErrorCode


def refused(path: Path, problem: str) -> DiagdError:
    return DiagdError(ErrorCode.PERMISSION_DENIED, f"refusing state file {path}: {problem}; remove it",
                      path=str(path), problem=problem)


def _problem(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"it is a symlink (to {os.readlink(path)})"
        except OSError:
            return "it is a symlink"
    return None


def open_file(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open(path) never through a link at its last component, a regular file only. A missing file
    raises FileNotFoundError as os.open does (without O_CREAT); links and other kinds: `refused`."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise refused(path, _problem(path) or "it is a symlink") from None
        if exc.errno == errno.ENOENT and not flags & os.O_CREAT:
            raise
        raise refused(path, f"cannot open it: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise refused(path, "it is not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_text(path: Path, *, encoding: str = "utf-8", errors: str = "strict") -> str:
    with open(open_file(path, os.O_RDONLY), encoding=encoding, errors=errors) as f:
        return f.read()


def append_text(path: Path, text: str, *, encoding: str = "utf-8", errors: str = "strict") -> None:
    with open(open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", encoding=encoding, errors=errors) as f:
        f.write(text)


def ensure_dir(path: Path) -> Path:
    """Create `path` (0700, parents too) or find it; a real directory, never a link."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        pass  # a link to a directory, or a file: said below
    except OSError as exc:
        raise refused(path, f"cannot create it: {exc.strerror}") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise refused(path, _problem(path) or "it is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise refused(path, "it is not a directory")
    return path
