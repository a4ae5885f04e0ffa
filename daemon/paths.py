"""Where diagd keeps its sockets, state and config (stdlib only: the CLI imports it).

The runtime and state directories are opened the way ssh-agent and systemd treat theirs: the
last component must be a real directory (never a symlink), owned by us and writable by nobody
else, and every ancestor must be owned by root or us and not writable by others unless sticky
(like /tmp). Anything else is refused with PERMISSION_DENIED naming the path and the problem;
a directory someone else could have prepared is never chmod-ed into shape. Files inside are then
created relative to the directory's fd with O_NOFOLLOW, so a path swapped after the check cannot
redirect them.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from diagd.protocol.errors import DiagdError, ErrorCode

# Where systemd-logind makes each user's runtime directory ($XDG_RUNTIME_DIR in a login session).
RUN_USER = Path("/run/user")
# What the daemon records in its runtime dir for clients started with a stripped environment.
DAEMON_RECORD = "daemon.json"


def runtime_dir() -> Path:
    """Owner-only socket directory: $XDG_RUNTIME_DIR/diagd; else /run/user/$UID/diagd when that is the
    user's own (as systemd makes it); else /tmp/diagd-$UID.

    The middle step is what makes one daemon per user: MCP hosts (Claude Desktop, Inspector, the
    TypeScript SDK's stdio launcher) start `diagd mcp` with only HOME, PATH and a few more, no
    XDG_RUNTIME_DIR, yet must reach the daemon the user's shell, systemd or socket activation started.
    """
    if override := os.environ.get("DIAGD_RUNTIME_DIR"):
        return Path(override)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "diagd"
    if (session := user_runtime_base()) is not None:
        return session / "diagd"
    return Path(f"/tmp/diagd-{os.getuid()}")


def user_runtime_base() -> Path | None:
    """/run/user/$UID when it is a real directory of ours, mode 0700 (systemd-logind's), else None."""
    candidate = RUN_USER / str(os.getuid())
    try:
        st = os.lstat(candidate)
    except OSError:
        return None
    mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    return candidate if mine else None


def mcp_socket() -> Path:
    return runtime_dir() / "mcp.sock"


def control_socket() -> Path:
    return runtime_dir() / "control.sock"


def state_dir() -> Path:
    if override := os.environ.get("DIAGD_STATE_DIR"):
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "diagd"


def config_file() -> Path:
    if override := os.environ.get("DIAGD_CONFIG"):
        return Path(override)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "diagd" / "config.toml"


def record_daemon_paths(rundir: PrivateDir, config: Path, state: Path) -> None:
    """Write, in the runtime dir, the config file and state dir this daemon uses (0600, no symlink).

    A client whose environment lost DIAGD_CONFIG / XDG_CONFIG_HOME (an MCP host passes only HOME and
    PATH) finds the runtime dir all the same, and an autostart from it reuses these
    (`recorded_daemon_env`) instead of starting a daemon on another config.
    """
    fd = rundir.open(DAEMON_RECORD + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        json.dump({"config": str(config.absolute()), "state_dir": str(state.absolute())}, f)
    os.rename(DAEMON_RECORD + ".tmp", DAEMON_RECORD, src_dir_fd=rundir.fd, dst_dir_fd=rundir.fd)


def recorded_daemon_env() -> dict[str, str]:
    """DIAGD_CONFIG / DIAGD_STATE_DIR as the last daemon in our runtime dir recorded them, for the
    variables this environment does not set; {} when there is no (safe) record."""
    rd = runtime_dir()
    if private_dir_problem(rd) is not None or not (rd / DAEMON_RECORD).exists():
        return {}
    try:
        rundir = open_private_dir(rd, what="runtime directory")
    except DiagdError:
        return {}
    try:
        with os.fdopen(rundir.open(DAEMON_RECORD, os.O_RDONLY)) as f:
            record = json.load(f)
    except (DiagdError, OSError, ValueError):
        return {}
    finally:
        rundir.close()
    found = {"DIAGD_CONFIG": record.get("config"), "DIAGD_STATE_DIR": record.get("state_dir")}
    return {k: v for k, v in found.items() if isinstance(v, str) and v and k not in os.environ}


# The variables that name diagd's directories: a relative value means the directory the command ran in,
# so a daemon (which runs in `/`) is given them absolute (`pinned`).
PATH_VARIABLES = ("DIAGD_RUNTIME_DIR", "DIAGD_STATE_DIR", "DIAGD_CONFIG", "XDG_RUNTIME_DIR", "XDG_STATE_HOME",
                  "XDG_CONFIG_HOME", "HOME")


def pin(env: MutableMapping[str, str]) -> None:
    """Make the directory variables of `env` absolute (relative to this process's cwd), in place."""
    for name in PATH_VARIABLES:
        if env.get(name) and not os.path.isabs(env[name]):
            env[name] = os.path.abspath(env[name])


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass
class PrivateDir:
    """An open, checked owner-only directory; create and remove entries relative to its fd."""

    path: Path
    fd: int

    def open(self, name: str, flags: int, mode: int = 0o600) -> int:
        """Open `name` inside, never through a symlink; a regular file of ours or PERMISSION_DENIED."""
        where = self.path / name
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=self.fd)
        except OSError as exc:
            raise _refuse(where, "file", _why_unopenable(self.fd, name, exc)) from None
        st = os.fstat(fd)
        problem = (None if stat.S_ISREG(st.st_mode) else "it is not a regular file") or _ownership(st)
        if problem:
            os.close(fd)
            raise _refuse(where, "file", problem)
        return fd

    def socket_address(self, name: str) -> str:
        """An AF_UNIX address for `name` that goes through our fd, not the path (systemd's trick)."""
        proc = f"/proc/self/fd/{self.fd}"
        return f"{proc}/{name}" if os.path.isdir(proc) else str(self.path / name)

    def remove(self, name: str) -> None:
        """Remove a stale entry (unlink never follows a symlink)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _refuse(self.path / name, "file", f"cannot remove it: {exc.strerror}") from None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_private_dir(path: Path, *, what: str = "directory") -> PrivateDir:
    """Create (mode 0700) or open `path` and check it; PERMISSION_DENIED says what is wrong.

    `what` names the directory in the message ("runtime directory", "state directory").
    """
    path = Path(os.path.abspath(path))
    parent = path.parent
    try:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(path, what, f"cannot create its parent {parent}: {exc.strerror}") from None
    real_parent = Path(os.path.realpath(parent))  # a symlinked ancestor is fine if root or we own it
    if problem := _unsafe_ancestor(real_parent):
        raise _refuse(path, what, problem)
    parent_fd = os.open(real_parent, _DIR_FLAGS)
    try:
        created = _mkdir_at(parent_fd, path.name, path, what)
        try:
            fd = os.open(path.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError as exc:
            raise _refuse(path, what, _why_unopenable(parent_fd, path.name, exc)) from None
    finally:
        os.close(parent_fd)
    st = os.fstat(fd)
    problem = _ownership(st) or _writable_by_others(st)
    if problem:
        os.close(fd)
        raise _refuse(path, what, problem)
    if created or stat.S_IMODE(st.st_mode) != 0o700:
        # Ours and writable by nobody else, so nothing can have been planted in it: tightening
        # read bits (or a umask that stripped ours) is safe. Through the fd, never the path.
        os.fchmod(fd, 0o700)
    return PrivateDir(path, fd)


def ensure_private_dir(path: Path, *, what: str = "directory") -> Path:
    """Create or check `path` (see `open_private_dir`) and return it."""
    open_private_dir(path, what=what).close()
    return path


def private_dir_problem(path: Path) -> str | None:
    """What is wrong with an existing `path` as a private dir (None: fine or absent); creates nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot inspect it: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return _symlink_problem(path)
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    real_parent = Path(os.path.realpath(Path(os.path.abspath(path)).parent))
    return _ownership(st) or _writable_by_others(st) or _unsafe_ancestor(real_parent)


def _mkdir_at(parent_fd: int, name: str, path: Path, what: str) -> bool:
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        return False
    except OSError as exc:
        raise _refuse(path, what, f"cannot create it: {exc.strerror}") from None
    return True


def _ownership(st: os.stat_result) -> str | None:
    uid = os.getuid()
    return None if st.st_uid == uid else f"it is owned by uid {st.st_uid}, not by uid {uid}"


def _writable_by_others(st: os.stat_result) -> str | None:
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o022:
        return None
    who = " and ".join(w for w, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)
    return f"it is writable by {who} (mode {mode:04o})"


def _unsafe_ancestor(real_parent: Path) -> str | None:
    """OpenSSH's rule: each ancestor owned by root or us, not writable by others unless sticky."""
    uid = os.getuid()
    for ancestor in (real_parent, *real_parent.parents):
        try:
            st = os.stat(ancestor)
        except OSError as exc:
            return f"its ancestor {ancestor} cannot be inspected: {exc.strerror}"
        if st.st_uid not in (0, uid):
            return f"its ancestor {ancestor} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"its ancestor {ancestor} is writable by others and not sticky (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _why_unopenable(dir_fd: int, name: str, exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(name, dir_fd=dir_fd)
            except OSError:
                target = "?"
            return f"it is a symlink (to {target})"
        if st is not None and not stat.S_ISDIR(st.st_mode) and exc.errno == errno.ENOTDIR:
            return "it is not a directory"
    return f"cannot open it: {exc.strerror}"


def _symlink_problem(path: Path) -> str:
    try:
        return f"it is a symlink (to {os.readlink(path)})"
    except OSError:
        return "it is a symlink"


def _refuse(path: Path, what: str, problem: str) -> DiagdError:
    hint = "remove it (or point DIAGD_RUNTIME_DIR / DIAGD_STATE_DIR elsewhere)"
    return DiagdError(ErrorCode.PERMISSION_DENIED, f"refusing {what} {path}: {problem}; {hint}",
                      path=str(path), problem=problem)
