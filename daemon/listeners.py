"""The daemon's listening Unix sockets: bound here in the checked runtime dir, or inherited from systemd."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import structlog
import trio

from diagd.daemon import activation, paths

log = structlog.get_logger("diagd.server")


async def bind_unix(rundir: paths.PrivateDir, name: str) -> trio.SocketListener:
    """Bind a 0600 socket inside the checked runtime dir, through its fd (umask set before bind,
    so it is never briefly world-connectable)."""
    rundir.remove(name)  # stale: the lock proves no live daemon owns it
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:  # bind and listen with no checkpoint between: a client that sees the file can connect
        sock.bind(rundir.socket_address(name))
        sock.listen(128)
    except BaseException:
        sock.close()
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
