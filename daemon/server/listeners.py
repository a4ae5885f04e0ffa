"""The daemon's Unix sockets: listeners bound here in the checked runtime dir or inherited from systemd, and
what the accept loop learns of a new connection (its peer's credentials, its first line)."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import structlog
import trio

from diagd.daemon import paths
from diagd.daemon.server import activation

log = structlog.get_logger("diagd.server")


async def bind_unix(rundir: paths.PrivateDir, name: str) -> trio.SocketListener:
    """Bind a 0600 socket inside the checked runtime dir, through its fd (umask set before bind,
    so it is never briefly world-connectable). It is bound and listening under a temporary name and
    then renamed into place: a client that sees `name` can connect (bind and listen are two system
    calls, and a client polling for the file on another core could otherwise connect in between and
    be refused)."""
    rundir.remove(name)  # stale: the lock proves no live daemon owns it
    staging = f".{name}.{os.getpid()}"
    rundir.remove(staging)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(rundir.socket_address(staging))
        sock.listen(128)
        os.rename(staging, name, src_dir_fd=rundir.fd, dst_dir_fd=rundir.fd)
    except BaseException:
        sock.close()
        rundir.remove(staging)
        raise
    finally:
        os.umask(old)
    await trio.lowlevel.checkpoint()
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


def adopt(inherited: activation.Inherited, expected: Path) -> tuple[trio.SocketListener, Path]:
    """Serve a listening socket systemd bound; say so when clients will not look for it there."""
    where = Path(inherited.path)
    if where != expected:
        log.warning("socket from systemd is not where clients look for it", kind=inherited.kind, bound=str(where),
                    expected=str(expected))
    return trio.SocketListener(trio.socket.from_stdlib_socket(inherited.sock)), where


async def listen(rundir: paths.PrivateDir, name: str, inherited: activation.Inherited | None
                 ) -> tuple[trio.SocketListener, Path]:
    """The listener for socket `name` and where it is: systemd's when it passed one, else bound here."""
    expected = rundir.path / name
    if inherited is not None:
        return adopt(inherited, expected)
    return await bind_unix(rundir, name), expected


PEEK_BYTES = 65536


async def first_line(stream: trio.SocketStream, deadline: float) -> bool:
    """True once the first MCP line is complete (or EOF, or PEEK_BYTES without a newline: then the
    line limit applies); False at the deadline. Peeks, so the MCP front end still reads it all."""
    sock = stream.socket
    with trio.move_on_at(deadline):
        while True:
            data = await sock.recv(PEEK_BYTES, socket.MSG_PEEK)
            if not data or b"\n" in data or len(data) >= PEEK_BYTES:
                return True
            await trio.sleep(0.02)  # more of a partial line: the kernel has no "wait for more" for a peek
    return False


def peer_credentials(sock: trio.socket.SocketType) -> tuple[int, int, int]:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid
