"""File primitives for reading and replacing MCP hosts' configuration files, safe from planted links and FIFOs.

`diagd client add|remove|list` (daemon/cli/clients.py) read and write host files only through `read`
and `replace`:

- A file is opened with O_NOFOLLOW|O_NONBLOCK and checked with fstat: a FIFO, a device, a socket or a
  directory is refused with a readable error and never read (so nothing hangs on a FIFO or reads
  /dev/zero until memory runs out), and so is a file over MAX_BYTES.
- A file that is a symbolic link (a dotfiles manager's) is followed once: its target, resolved once,
  must be a regular file itself (a link to a link, to a device or to nothing is refused). The target
  is what is read and replaced, so the link stays a link. With `inside` (project scope: the working
  directory) the file's directory and a link's target must lie inside it, as the links on the way
  resolve: a checkout can hold links planted by whoever wrote it (`.mcp.json -> ~/.claude.json`).
- A backup of the bytes read is a new file, created with O_CREAT|O_EXCL|O_NOFOLLOW under a fresh name
  beside the file replaced, `<name>.diagd-backup-<local time, to the microsecond>-<random>`: never
  written through a path that exists.
- The new text goes to a temporary file in the same directory (O_EXCL, the old file's permission bits
  and, for root, its owner), is fsynced and renamed over the file, after checking that the file is
  still the one read (else nothing is written: run again); then the directory is fsynced.

This guards against links and special files planted in the way, not against a process racing the
command with write access to the directory (which could edit the file itself anyway).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from diagd.protocol.errors import DiagdError, ErrorCode

MAX_BYTES = 16 * 1024 * 1024
NEW_FILE_MODE = 0o600  # a host file may hold env variables: owner only
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


@dataclass(frozen=True)
class Snapshot:
    """A host file as read: what `replace` writes over, once it has checked the file is still this one."""

    path: Path  # the host's file, as named
    directory: Path  # the real directory of the file read and replaced (a link's target's)
    name: str  # that file's name in it
    link: str | None  # what `path` points to, when it is a symbolic link
    data: bytes | None  # the bytes read; None: there is no file
    text: str  # ... decoded ("" when there is no file)
    identity: tuple[int, ...] | None  # the file's (dev, inode, size, mtime) when read
    mode: int  # its permission bits (NEW_FILE_MODE for a new file)
    owner: tuple[int, int] | None  # its (uid, gid)

    @property
    def target(self) -> Path:
        """The file read and replaced: `path`, or the file its link points to."""
        return self.directory / self.name


def read(path: Path, *, inside: Path | None = None) -> Snapshot:
    """The host file at `path` (its text "" and data None when there is none); DiagdError for one diagd
    does not read: not a regular file, a link it does not follow, over MAX_BYTES, not UTF-8."""
    path = Path(os.path.abspath(path))
    try:
        return _read(path, inside)
    except OSError as exc:  # DiagdError for the rest
        raise _unreadable(path, exc) from None


def _read(path: Path, inside: Path | None) -> Snapshot:
    directory = _real_directory(path.parent, inside, f"{path} is in {{real}}")
    name, link = path.name, None
    found = _lstat(directory / name)
    if found is not None and stat.S_ISLNK(found.st_mode):
        link = os.readlink(directory / name)
        pointed = directory / link  # an absolute link replaces the directory
        directory = _real_directory(pointed.parent, inside, f"{path} is a link to {pointed}, in {{real}}")
        name = pointed.name
        found = _lstat(directory / name)
        if found is None:
            raise _refused(path, f"{path} is a link to {pointed}, which does not exist; create the file or "
                           "remove the link")
        if stat.S_ISLNK(found.st_mode):
            raise _refused(path, f"{path} is a link to {pointed}, itself a symbolic link: diagd follows one link, "
                           "to a regular file; point the link at the file itself")
        if not stat.S_ISREG(found.st_mode):
            raise _refused(path, f"{path} is a link to {pointed}, {_kind(found.st_mode)}, not a regular file")
    elif found is not None and not stat.S_ISREG(found.st_mode):
        raise _refused(path, f"{path} is {_kind(found.st_mode)}, not a regular file")
    got = _read_regular(directory / name, path)
    if got is None:
        return Snapshot(path, directory, name, link, None, "", None, NEW_FILE_MODE, None)
    data, st = got
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _refused(path, f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return Snapshot(path, directory, name, link, data, text, _identity(st), stat.S_IMODE(st.st_mode) & 0o777,
                    (st.st_uid, st.st_gid))


def replace(snap: Snapshot, text: str) -> Path | None:
    """Write `text` over the file `snap` read, atomically; returns the backup of its old bytes (None:
    there was no file). Nothing is written if the file is no longer the one read."""
    try:
        return _replace(snap, text.encode("utf-8"))
    except OSError as exc:
        code = ErrorCode.PERMISSION_DENIED if isinstance(exc, PermissionError) else ErrorCode.INVALID_ARGUMENT
        raise DiagdError(code, f"cannot write {snap.target}: {exc.strerror or exc}", path=str(snap.path)) from None


def _replace(snap: Snapshot, data: bytes) -> Path | None:
    if snap.data is None:
        snap.directory.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(snap.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        temp = _create(dir_fd, lambda: f".{snap.name}.diagd-{secrets.token_hex(4)}.tmp", data, snap)
        try:
            _check_unchanged(snap, dir_fd)
            backup = None
            if snap.data is not None:
                now = time.time_ns()
                stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now // 10**9)) + f".{now // 1000 % 10**6:06d}"
                backup = _create(dir_fd, lambda: f"{snap.name}.diagd-backup-{stamp}-{secrets.token_hex(3)}",
                                 snap.data, snap)
            os.rename(temp, snap.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(temp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return snap.directory / backup if backup else None


def _create(dir_fd: int, fresh_name: Callable[[], str], data: bytes, snap: Snapshot) -> str:
    """A new file (never an existing path, nor through a link) under a fresh name, holding `data`, fsynced."""
    for _ in range(8):
        name = fresh_name()
        try:
            fd = os.open(name, _CREATE, snap.mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, snap.mode)  # not narrowed by the umask
            if snap.owner is not None and os.geteuid() == 0:
                os.fchown(fd, *snap.owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(name, dir_fd=dir_fd)
            raise
        os.close(fd)
        return name
    raise FileExistsError(errno.EEXIST, "no fresh file name", name)


def _check_unchanged(snap: Snapshot, dir_fd: int) -> None:
    try:
        now: tuple[int, ...] | None = _identity(os.lstat(snap.name, dir_fd=dir_fd))
    except FileNotFoundError:
        now = None
    if now != snap.identity:
        raise DiagdError(ErrorCode.BUSY, f"{snap.target} changed while diagd was editing it (the host may have "
                         "rewritten it); nothing was written: run the command again", path=str(snap.path))


def _read_regular(file: Path, shown: Path) -> tuple[bytes, os.stat_result] | None:
    try:
        fd = os.open(file, _READ)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(shown, f"{shown} became a symbolic link while diagd was reading it") from None
        raise _unreadable(shown, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refused(shown, f"{shown} is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > MAX_BYTES:
            raise _too_large(shown, st.st_size)
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BYTES:
                raise _too_large(shown, size)
        return b"".join(chunks), st
    except OSError as exc:
        raise _unreadable(shown, exc) from None
    finally:
        os.close(fd)


def _real_directory(directory: Path, inside: Path | None, where: str) -> Path:
    """`directory` with every link on the way resolved; refused when that leaves `inside`."""
    real = Path(os.path.realpath(directory))
    if inside is not None:
        root = Path(os.path.realpath(inside))
        if not real.is_relative_to(root):
            message = where.format(real=real)
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{message}, outside the project directory {root}: "
                             "diagd does not follow links out of a project (a checkout can plant them)",
                             path=str(directory))
    return real


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refused(path: Path, message: str) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"{message}; diagd leaves it as it is", path=str(path))


def _too_large(path: Path, size: int) -> DiagdError:
    return _refused(path, f"{path} is {size} bytes or more, over the {MAX_BYTES // (1 << 20)} MiB diagd reads of a "
                    "host's configuration file")


def _unreadable(path: Path, exc: OSError) -> DiagdError:
    code = ErrorCode.PERMISSION_DENIED if isinstance(exc, PermissionError) else ErrorCode.INVALID_ARGUMENT
    return DiagdError(code, f"cannot read {path}: {exc.strerror or exc}", path=str(path))
