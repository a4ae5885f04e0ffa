"""Listening sockets inherited from systemd (socket activation), the sd_listen_fds(3) way.

systemd (or `systemd-socket-activate`) binds the sockets, waits for the first client, then starts
`diagd serve` with the listening fds from 3 on and LISTEN_PID / LISTEN_FDS / LISTEN_FDNAMES set.
The fds are taken only when LISTEN_PID is our pid (the variables may have leaked from a parent),
and the variables are removed either way, so no child a back end starts ever believes them.

Each fd is told apart by its name ("mcp" / "control", as `systemd-socket-activate --fdname` or a
socket unit per fd gives them) or else by the file it is bound to (`mcp.sock` / `control.sock`):
systemd's FileDescriptorName= names every fd of one socket unit alike, so diagd.socket's two
sockets can only be told apart by their addresses. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass

from diagd.protocol.errors import DiagdError, ErrorCode

SD_LISTEN_FDS_START = 3
ENV_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


@dataclass(frozen=True)
class Inherited:
    """One listening socket systemd handed us: which of ours it is and where it is bound."""

    kind: str
    sock: socket.socket
    path: str


def take_listen_fds(file_names: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, Inherited]:
    """The inherited listening sockets by kind ({} when not socket-activated).

    `file_names` maps each kind to its socket's file name ({"mcp": "mcp.sock", ...}). Anything
    that is not an AF_UNIX stream socket in the listening state, or cannot be matched to one kind,
    is INVALID_ARGUMENT naming the fd: serving on a socket systemd did not mean for us would leave
    clients hanging on the real one.
    """
    env = os.environ if environ is None else environ
    pid, count, names = (env.pop(name, None) for name in ENV_VARS)
    if pid is None or count is None:
        return {}
    try:
        if int(pid) != os.getpid():
            return {}  # meant for another process (an ancestor's leftovers)
        n = int(count)
    except ValueError:
        raise _refuse(f"LISTEN_PID={pid!r} / LISTEN_FDS={count!r} are not numbers") from None
    labels = (names or "").split(":") if names else []
    taken: dict[str, Inherited] = {}
    try:
        for i in range(n):
            fd = SD_LISTEN_FDS_START + i
            inherited = _take(fd, labels[i] if i < len(labels) else "", file_names)
            if inherited.kind in taken:
                inherited.sock.close()
                raise _refuse(f"fd {fd} is a second {inherited.kind} socket", fd=fd)
            taken[inherited.kind] = inherited
    except BaseException:
        for inherited in taken.values():
            inherited.sock.close()
        raise
    return taken


def _take(fd: int, label: str, file_names: dict[str, str]) -> Inherited:
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise _refuse(f"fd {fd} is not open ({exc.strerror})", fd=fd) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise _refuse(f"fd {fd} is not a socket", fd=fd)
    os.set_inheritable(fd, False)  # CLOEXEC: the back ends' children must not hold our listener
    sock = socket.socket(fileno=fd)
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise _refuse(f"fd {fd} is an {sock.family.name} {sock.type.name} socket, not an AF_UNIX stream "
                          "socket (ListenStream= with a path)", fd=fd)
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise _refuse(f"fd {fd} is a socket that is not listening", fd=fd)
        address = sock.getsockname()
        path = address if isinstance(address, str) else ""
        kind = label if label in file_names else _kind_by_file(path, file_names)
        if kind is None:
            expected = ", ".join(f"{k} ({f})" for k, f in file_names.items())
            raise _refuse(f"fd {fd} (name {label or 'none'!r}, bound to {path or 'no path'}) is none of diagd's "
                          f"sockets: {expected}", fd=fd)
    except BaseException:
        sock.close()
        raise
    return Inherited(kind, sock, path)


def _kind_by_file(path: str, file_names: dict[str, str]) -> str | None:
    base = os.path.basename(path)
    return next((kind for kind, name in file_names.items() if name == base), None)


def _refuse(problem: str, **details: object) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, f"socket activation: {problem}", **details)
