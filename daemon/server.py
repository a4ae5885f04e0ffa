"""`diagd serve`: the daemon process: sockets, supervisor, back ends, signals, shutdown."""

from __future__ import annotations

import fcntl
import importlib
import itertools
import os
import signal
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog
import trio

import diagd
from diagd.actors import BACKENDS
from diagd.daemon import builtin_tools, control_server, mcp_front, paths
from diagd.daemon import config as config_mod
from diagd.daemon.audit import AuditLog, CallStats
from diagd.daemon.notify import sd_notify
from diagd.daemon.supervisor import Supervisor
from diagd.daemon.tools import CallRecord, ToolRegistry
from diagd.protocol.errors import DiagdError

log = structlog.get_logger("diagd.daemon")

ConnectionHandler = Callable[[trio.SocketStream, str], Awaitable[None]]


class AlreadyRunning(Exception):
    pass


class Daemon:
    """Daemon-wide state: lives for the whole process, outside any MCP session's lifespan."""

    def __init__(self, config: config_mod.Config, nursery: trio.Nursery, *, runtime_dir: Path,
                 state_dir: Path) -> None:
        self.config = config
        self.runtime_dir = runtime_dir
        self.state_dir = state_dir
        self._nursery = nursery
        self.registry = ToolRegistry(call_timeout_s=config.daemon.call_timeout_s)
        self.supervisor = Supervisor(nursery, idle_timeout_s=config.daemon.idle_timeout_s,
                                     inbox_size=config.daemon.inbox_size)
        self.stats = CallStats()
        self.audit = AuditLog(state_dir / "audit.jsonl", max_bytes=config.daemon.audit_max_bytes,
                              keep=config.daemon.audit_keep)
        self.registry.observers += [self.stats.observe, self.audit.write, _log_call]
        self.connections: dict[int, dict[str, Any]] = {}
        self._conn_ids = itertools.count(1)
        self.sockets: dict[str, str] = {}
        self.started_wall = time.time()
        self.started_clock = trio.current_time()
        self.shutdown_reason: str | None = None

    def load_backends(self) -> None:
        builtin_tools.register(self)
        for name in (*BACKENDS, *self.config.daemon.extra_backends):
            module = importlib.import_module(name)
            module.register(self)
            log.info("backend loaded", backend=name)

    def status(self) -> dict[str, Any]:
        return {
            "daemon": {
                "pid": os.getpid(),
                "version": diagd.__version__,
                "uptime_s": round(trio.current_time() - self.started_clock, 3),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_wall)),
                "sockets": self.sockets,
                "config": self.config.source,
                "state_dir": str(self.state_dir),
                "clients": list(self.connections.values()),
                "calls_total": self.stats.total,
            },
            "actors": [ref.statistics() for ref in self.supervisor.actors()],
            "tools": self.stats.summary(),
        }

    def reload(self) -> dict[str, Any]:
        new = config_mod.load(Path(self.config.source) if self.config.source != "<defaults>" else None)
        self.config = new
        self.registry.call_timeout_s = new.daemon.call_timeout_s
        self.supervisor.idle_timeout_s = new.daemon.idle_timeout_s
        self.audit.max_bytes, self.audit.keep = new.daemon.audit_max_bytes, new.daemon.audit_keep
        log.info("config reloaded", source=new.source)
        return {"reloaded": True, "config": new.source}

    def request_shutdown(self, reason: str) -> None:
        self.shutdown_reason = reason
        log.info("shutting down", reason=reason)
        self._nursery.cancel_scope.cancel(reason=reason)

    async def accept(self, listener: trio.SocketListener, kind: str, handle: ConnectionHandler, *,
                     task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
                     ) -> None:
        async def on_connection(stream: trio.SocketStream) -> None:
            try:
                pid, uid, _gid = peer_credentials(stream.socket)
                if uid != os.getuid():
                    log.warning("refused connection from another uid", kind=kind, peer_uid=uid, peer_pid=pid)
                    return
                if len(self.connections) >= self.config.daemon.max_connections:
                    log.warning("refused connection: too many clients", kind=kind, peer_pid=pid)
                    return
                conn_id = next(self._conn_ids)
                self.connections[conn_id] = {"id": conn_id, "kind": kind, "pid": pid,
                                             "connected_at": time.strftime("%H:%M:%S")}
                try:
                    await handle(stream, f"{kind}:{pid}")
                finally:
                    del self.connections[conn_id]
            except Exception:
                log.exception("connection handler failed", kind=kind)  # one client's fault, not the daemon's
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()

        await trio.serve_listeners(on_connection, [listener], task_status=task_status)


def _log_call(record: CallRecord) -> None:
    log.info("tool call", tool=record.tool, client=record.client, outcome=record.outcome, code=record.code,
             duration_ms=record.duration_ms, queue_ms=record.queue_ms, bytes=record.bytes)


def peer_credentials(sock: trio.socket.SocketType) -> tuple[int, int, int]:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


async def open_unix_listener(path: Path) -> trio.SocketListener:
    """Bind a 0600 socket (umask set before bind, so it is never briefly world-connectable)."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return trio.SocketListener(sock)


def acquire_lock(runtime_dir: Path) -> int:
    """Hold daemon.lock for the process lifetime: a second daemon (two shims autostarting) exits."""
    fd = os.open(runtime_dir / "daemon.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"another diagd already runs with {runtime_dir}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


async def serve(config: config_mod.Config) -> None:
    runtime_dir = paths.ensure_private_dir(paths.runtime_dir())
    state_dir = paths.ensure_private_dir(paths.state_dir())
    lock_fd = acquire_lock(runtime_dir)
    socket_paths = {"mcp": paths.mcp_socket(), "control": paths.control_socket()}
    for p in socket_paths.values():
        p.unlink(missing_ok=True)  # stale: the lock proves no live daemon owns it
    daemon: Daemon | None = None
    try:
        async with trio.open_nursery() as nursery:
            daemon = Daemon(config, nursery, runtime_dir=runtime_dir, state_dir=state_dir)
            daemon.load_backends()
            server = mcp_front.build_server(daemon.registry, version=diagd.__version__)
            max_line = config.daemon.max_line_bytes

            async def handle_mcp(stream: trio.SocketStream, client: str) -> None:
                await mcp_front.serve_connection(stream, server, client=client, max_line_bytes=max_line)

            async def handle_control(stream: trio.SocketStream, client: str) -> None:
                await control_server.serve_connection(stream, daemon, client=client)

            for kind, handle in (("mcp", handle_mcp), ("control", handle_control)):
                listener = await open_unix_listener(socket_paths[kind])
                await nursery.start(daemon.accept, listener, kind, handle)
                daemon.sockets[kind] = str(socket_paths[kind])
            nursery.start_soon(_handle_signals, daemon)
            sd_notify("READY=1\nSTATUS=listening")
            log.info("diagd ready", pid=os.getpid(), sockets=daemon.sockets, tools=len(daemon.registry.specs()))
    finally:
        for p in socket_paths.values():
            p.unlink(missing_ok=True)
        if daemon is not None:
            daemon.audit.close()
        os.close(lock_fd)
        sd_notify("STOPPING=1")
        log.info("diagd stopped")


async def _handle_signals(daemon: Daemon) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                try:
                    daemon.reload()
                except DiagdError as exc:
                    log.error("reload failed", error=exc.message)
                continue
            daemon.request_shutdown(f"signal {signal.Signals(signum).name}")
