"""`diagd serve`: the daemon process: sockets, supervisor, back ends, signals, shutdown."""

from __future__ import annotations

import fcntl
import importlib
import os
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog
import trio

import diagd
from diagd.actors import heap, system
from diagd.actors.runtime import Client, StopCheck
from diagd.daemon import config as config_mod
from diagd.daemon import discovery, jsonrpc, paths
from diagd.daemon.server import (
    activation,
    builtin_tools,
    connections,
    control_server,
    listeners,
    logs,
    tool_listing,
)
from diagd.daemon.server import reload as reload_notes
from diagd.daemon.server.audit import AuditLog, CallStats, log_call
from diagd.daemon.server.backends import BackendRuntime
from diagd.daemon.server.config_check import check_tables, refused
from diagd.daemon.server.connections import ByteBudget, Connection, ConnectionTable, State, last_words
from diagd.daemon.server.declared import Declarations
from diagd.daemon.server.heap_trim import QuietTrimmer
from diagd.daemon.server.http import start as http_start
from diagd.daemon.server.mcp import sdk as mcp_sdk
from diagd.daemon.server.notify import sd_notify
from diagd.daemon.server.presence import Clients
from diagd.daemon.server.replies import ReloadReply, StatusReply
from diagd.daemon.server.services import ReloadNotes
from diagd.daemon.server.supervisor import Supervisor
from diagd.daemon.server.tools import CallContext, CallResult, ToolRegistry
from diagd.daemon.server.ui.auth import UiAuth
from diagd.daemon.tool_groups import Selection, check
from diagd.protocol import control, utc
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.daemon")

ConnectionHandler = Callable[[trio.SocketStream, Connection], Awaitable[None]]


class AlreadyRunning(Exception):
    pass


class ConnectionAwareRegistry(ToolRegistry):
    """Marks the calling connection busy while its tool call runs, so a long call is never dropped
    as idle (MCP connections are otherwise only known from the byte level)."""

    async def call(self, name: str, arguments: Any, ctx: CallContext, *, selection: Selection = None) -> CallResult:
        conn = connections.current.get()
        if conn is None:
            return await super().call(name, arguments, ctx, selection=selection)
        with conn.busy():
            return await super().call(name, arguments, ctx, selection=selection)

    def check_callable(self, name: str, selection: Selection, *, client: str, arguments: Any) -> None:
        # Here too, so the MCP front reaches the registry through this one class for both steps of a call.
        super().check_callable(name, selection, client=client, arguments=arguments)


class Daemon:
    """Daemon-wide state: lives for the whole process, outside any MCP session's lifespan."""

    def __init__(self, config: config_mod.Config, nursery: trio.Nursery, *, runtime_dir: Path,
                 state_dir: Path) -> None:
        self.config = config
        self.http_at_start = config.http
        self.runtime_dir = runtime_dir
        self.state_dir = state_dir
        self._nursery = nursery
        self.registry: ToolRegistry = ConnectionAwareRegistry(call_timeout_s=config.daemon.call_timeout_s)
        self.supervisor = Supervisor(nursery, idle_timeout_s=config.daemon.idle_timeout_s,
                                     inbox_size=config.daemon.inbox_size)
        self.stats = CallStats()
        self.audit = AuditLog(state_dir / "audit.jsonl", max_bytes=config.daemon.audit_max_bytes,
                              keep=config.daemon.audit_keep)
        self.trimmer = QuietTrimmer()
        self.registry.observers += [self.stats.observe, self.audit.write, log_call, self.trimmer.observe]
        self.connection_table = ConnectionTable(config.daemon.max_connections)
        # A frame up to the request limit must always fit, whatever the setting says.
        self.frame_budget = ByteBudget(max(config.daemon.control_buffer_bytes, control.MAX_REQUEST_BYTES))
        self.sockets: dict[str, str] = {}
        self.sockets_from_systemd: list[str] = []  # the kinds whose listening socket systemd handed us
        self.started_wall = time.time()
        self.started_clock = trio.current_time()
        self.shutdown_reason: str | None = None
        # Run (together, each bounding itself) when a stop is requested, before anything is cancelled.
        self.before_stop: list[Callable[[str], Awaitable[object]]] = []
        # The connected clients; back ends are told when one comes or goes (a `diagd call` command's
        # references to a back end's sessions end with it).
        self.clients = Clients()
        # Called by `reload` with the old and the new config: each returns notes on changed settings
        # that do not apply to what is already open, or raises DiagdError to refuse the new config.
        self.reload_hooks: list[ReloadNotes] = []
        # Per actor kind, the back end's check before diagd_stop_actor stops one for a client (ownership).
        self.stop_checks: dict[str, StopCheck] = {}
        # What the back ends declared of themselves: instructions, timeline sources, reload effects, exports.
        self.declared = Declarations()
        self.ui_auth = UiAuth()  # the web view's login links (`diagd ui`) and browser sessions

    @property
    def connections(self) -> dict[int, dict[str, Any]]:
        """A snapshot of the connected clients (id, kind, pid, state, ...), as status and actors read it."""
        return {c.id: c.statistics() for c in self.connection_table}

    def runtime(self, name: str) -> BackendRuntime:
        """What the back end `name` gets: its `Runtime` (config table [name], state dir $state/name)."""
        return BackendRuntime(self, name)

    def load_backends(self) -> None:
        """Register the daemon's own tools, then every back end found (daemon/discovery.py); then check the
        other groups' tools each declared it calls (`Runtime.uses_tool`, declared.py): BACKEND_UNAVAILABLE."""
        builtin_tools.register(self)
        for backend in discovery.backends(self.config.daemon.extra_backends):
            try:
                module = importlib.import_module(backend.module)
            except ImportError as exc:  # a misspelt extra back end: one coded line, not a traceback
                if backend.installed:
                    raise
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[daemon] extra_backends: cannot import "
                                 f"{backend.module!r} ({exc}); is it on the daemon's PYTHONPATH?",
                                 backend=backend.module) from None
            # $state/<name> is checked like the state dir itself (never a link, ours, owner-only) before use.
            paths.ensure_private_dir(self.state_dir / backend.name, what=f"{backend.name} state directory")
            module.register(self.runtime(backend.name))
            log.info("backend loaded", backend=backend.name, module=backend.module)
        builtin_tools.describe_sources(self)
        # Every tool is registered now (diagd_timeline's schema completed): the tools each back end declared it
        # calls must be there with the arguments it passes, or the start stops here, naming both.
        self.declared.check_uses(self.registry.specs())

    def instructions(self) -> dict[str, str]:
        """Each group's paragraph of the MCP server instructions (the back ends', then the daemon's)."""
        return builtin_tools.instructions(self)

    def check_config(self, new: config_mod.Config, *, running: bool) -> list[dict[str, Any]]:
        """Refuse `new` unless all of it is right (daemon/server/config_check.py); returns the back ends' notes."""
        try:
            check_tables(new, [*self.registry.groups(), *self.declared.off])  # an off back end reads its table
            self.configured_tools(new)
            return [note for hook in self.reload_hooks for note in hook(self.config, new)]
        except DiagdError as exc:
            raise refused(exc, new.source, running=running) from None

    def configured_tools(self, config: config_mod.Config | None = None) -> Selection:
        """The groups `[mcp] tools` selects (None: all), checked against the loaded back ends."""
        names = (config or self.config).mcp.tools
        return check(names, self.registry.groups(), where="[mcp] tools") if names else None

    def status(self) -> StatusReply:
        actors = [ref.statistics() for ref in self.supervisor.actors()]
        # Each actor lists the processes it owns (its workers) under details.workers.
        workers = [w for a in actors for w in a["details"].get("workers", [])]
        return {
            "daemon": {
                "pid": os.getpid(),
                "version": diagd.__version__,
                "uptime_s": round(trio.current_time() - self.started_clock, 3),
                "started_at": utc.iso(self.started_wall),
                "sockets": self.sockets,
                "sockets_from_systemd": self.sockets_from_systemd,
                "config": self.config.source,
                "state_dir": str(self.state_dir),
                "clients": list(self.connections.values()),
                "connections_dropped": self.connection_table.dropped,
                "connections_refused": self.connection_table.refused,
                "calls_total": self.stats.total,
                "rss_bytes": system.rss_bytes(),  # this process only, workers not counted
                "workers": len(workers),
                "workers_rss_bytes": sum(w["rss_bytes"] or 0 for w in workers),
                "heap_trims": self.trimmer.trims,
                "warnings": self.warnings(),
            },
            "actors": actors,
            "tools": self.stats.summary(),
            "backends": self.backend_status(),
        }

    def backend_status(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """Each back end's own part of the status (Runtime.add_status); one that fails says so, in its place."""
        found: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for name, section in self.declared.status.items():
            try:
                found[name] = section()
            except Exception as exc:  # a back end's bug must not take `diagd status` down
                log.warning("back end status failed", backend=name, error=repr(exc))
                found[name] = {"errors": [{"error": f"{type(exc).__name__}: {exc}"}]}
        return found

    def warnings(self) -> list[str]:
        """What an operator must know is unsafe about how this daemon runs (shown by `diagd status`)."""
        http = self.http_at_start  # the listener keeps these until a restart (reload.HTTP)
        if http.enabled and http.test_no_auth:
            return [f"HTTP listener {http.listen} serves MCP WITHOUT A TOKEN ([http] test_no_auth = true): "
                    "a test listener, never for real use"]
        return []

    def reload(self) -> ReloadReply:
        """Swap in the config file's current content; the answer says what changed and what of it
        does not apply to what is already running (`not_yet_applied`, see `daemon.reload`). A config
        with any error is refused (DiagdError, see `check_config`): the old one stays in force."""
        old = self.config
        path = Path(old.source) if old.source != "<defaults>" else paths.config_file()
        try:
            new = config_mod.load(path)
        except DiagdError as exc:
            raise refused(exc, str(path), running=True) from None
        pending = self.check_config(new, running=True)
        self.config = new
        self.registry.call_timeout_s = new.daemon.call_timeout_s
        self.supervisor.inbox_size = new.daemon.inbox_size
        retimed = self.supervisor.set_idle_timeout(new.daemon.idle_timeout_s)
        self.audit.max_bytes, self.audit.keep = new.daemon.audit_max_bytes, new.daemon.audit_keep
        pending = reload_notes.static_notes(old, new, self.declared.deferred) + pending
        changed = reload_notes.changed_keys(old, new)
        log.info("config reloaded", source=new.source, actors_retimed=retimed, changed=changed,
                 not_yet_applied=[n["setting"] for n in pending])
        return {"reloaded": True, "config": new.source, "actors_retimed": retimed, "changed": changed,
                "not_yet_applied": pending}

    def stopping_notice(self) -> bytes | None:
        """The last line of an MCP connection the daemon closes because it stops (None: it does not)."""
        if self.shutdown_reason is None:
            return None
        return notice("mcp", ErrorCode.DAEMON_STOPPING,
                      f"the daemon is stopping ({self.shutdown_reason}); a new one may take over the session")

    def request_shutdown(self, reason: str) -> None:
        """Stop: first what must be said before the listeners go (`before_stop`: e.g. HTTP answers each
        request in flight), then cancel everything. A second request (a second SIGTERM) cancels at once."""
        first = self.shutdown_reason is None
        self.shutdown_reason = reason
        log.info("shutting down", reason=reason)
        if first and self.before_stop:
            self._nursery.start_soon(self._say_then_stop, reason)
        else:
            self._nursery.cancel_scope.cancel(reason=reason)

    async def _say_then_stop(self, reason: str) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for hook in self.before_stop:
                    nursery.start_soon(hook, reason)
        except Exception:  # what it could not say is not said; the stop goes on
            log.exception("a step before stopping failed")
        finally:
            self._nursery.cancel_scope.cancel(reason=reason)

    async def accept(self, listener: trio.SocketListener, kind: str, handle: ConnectionHandler, *,
                     task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
                     ) -> None:
        """Serve one listening socket: check the peer, admit it to the table (dropping the oldest
        idle connection when full, refusing with BUSY when none is idle), run its handler."""

        async def on_connection(stream: trio.SocketStream) -> None:
            try:
                pid, uid, _gid = listeners.peer_credentials(stream.socket)
                if uid != os.getuid():
                    log.warning("refused connection from another uid", kind=kind, peer_uid=uid, peer_pid=pid)
                    return
                await self._serve_admitted(stream, kind, pid, handle)
            except Exception:
                log.exception("connection handler failed", kind=kind)  # one client's fault, not the daemon's
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    await stream.aclose()

        await trio.serve_listeners(on_connection, [listener], task_status=task_status)

    async def _serve_admitted(self, stream: trio.SocketStream, kind: str, pid: int, handle: ConnectionHandler
                              ) -> None:
        settings = self.config.daemon
        self.connection_table.max_connections = settings.max_connections  # a reload applies to the next accept
        conn, dropped = self.connection_table.admit(kind, pid)
        if conn is not None:
            conn.cwd = await trio.to_thread.run_sync(connections.peer_cwd, pid)  # /proc reads: off the loop
        if dropped is not None:
            log.warning("dropped an idle connection to make room", dropped=repr(dropped), newcomer=f"{kind}:{pid}")
        if conn is None:
            message = (f"diagd serves {settings.max_connections} connections and none is idle; "
                       "try again when a call finishes")
            log.warning("refused connection: every connection is busy", kind=kind, peer_pid=pid)
            await last_words(stream, notice(kind, ErrorCode.BUSY, message))
            return
        conn.on_drop = lambda reason: _write_nowait(stream, notice(kind, ErrorCode.BUSY, reason))
        connections.current.set(conn)  # this task's context: inherited by the handler's tasks
        try:
            with conn.scope:
                if kind == "mcp":
                    if not await listeners.first_line(stream, conn.connected_at + settings.handshake_timeout_s):
                        log.warning("mcp handshake timed out", client=conn.client)
                        await last_words(stream, notice(kind, ErrorCode.TIMEOUT, "no complete first message within "
                                                    f"{settings.handshake_timeout_s:g} s; closing"))
                        return
                    conn.touch(State.IDLE)  # from here on only its tool calls make it busy
                await handle(stream, conn)
        finally:
            self.connection_table.remove(conn)


def notice(kind: str, code: ErrorCode, message: str) -> bytes:
    """A coded error a connection gets before the daemon closes it, in that socket's protocol."""
    if kind == "control":
        return control.REPLIES.encode(control.ErrorReply(id=0, code=str(code), message=message))
    return jsonrpc.coded_error(code, message, closing=True)


def _write_nowait(stream: trio.SocketStream, data: bytes) -> None:
    """Best effort, from another task: an idle connection has room in its socket buffer."""
    try:
        os.write(stream.socket.fileno(), data)
    except OSError:
        pass


def acquire_lock(rundir: paths.PrivateDir) -> int:
    """Hold daemon.lock for the process lifetime: a second daemon (two shims autostarting) exits."""
    fd = rundir.open("daemon.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AlreadyRunning(f"another diagd already runs with {rundir.path}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


class LazyFront:
    """The MCP front end, imported when the first MCP client connects, not at start-up.

    The MCP SDK brings pydantic, its protocol models, starlette, httpx, uvicorn, cryptography and
    OpenTelemetry along: ~40 MB of the daemon's ~80 MB at idle (issue 12), which a daemon serving
    only `diagd status`/`call` (the control socket) never needs; imported, ~28 MB (mcp_sdk.lean()
    leaves the SDK's client and high-level server out). The import (~0.3 s) runs in a
    worker thread, so the control socket stays served meanwhile; it happens once per daemon. So does
    generating the tools' output schemas, which tools/list gives whole (~0.3 s, tool_listing.warm).
    """

    def __init__(self, registry: ToolRegistry, default_tools: Callable[[], Selection],
                 guides: dict[str, str] | None = None) -> None:
        self._registry, self._default_tools, self._guides = registry, default_tools, guides
        self._lock = trio.Lock()
        self._front: tuple[ModuleType, Any] | None = None

    async def get(self) -> tuple[ModuleType, Any]:
        """(the MCP front end's module, mcp/front.py, and its SDK server), built on the first call."""
        async with self._lock:
            if self._front is None:
                module = await trio.to_thread.run_sync(_import_front)
                # The output schemas tools/list gives, generated off the event loop (pydantic, ~0.3 s).
                await trio.to_thread.run_sync(tool_listing.warm, self._registry.specs())
                self._front = module, module.build_server(self._registry, version=diagd.__version__,
                                                          default_tools=self._default_tools, guides=self._guides)
                heap.settle()  # the SDK is here for good: out of the cyclic collector's walks
        return self._front


def _import_front() -> ModuleType:
    mcp_sdk.lean()  # the SDK's server modules without its client and HTTP stacks (~12 MB)
    return importlib.import_module("diagd.daemon.server.mcp.front")


def offline_catalogue(config: config_mod.Config) -> dict[str, Any]:
    """The catalogue a daemon started now with `config` would serve (tool_listing.catalogue), built
    without one: `diagd tools` (and `client add`'s check) when no daemon runs.

    The back ends are loaded into a throwaway Daemon whose runtime and state dirs are a fresh private
    temporary directory, removed afterwards, so nothing of the user's state or runtime dirs is read or
    written (a back end's `register` may recover its stored records: it finds none). Nothing is
    served or started: no socket is bound and `register` is synchronous, so it cannot await an
    actor's start (nor does any back end run a process there); the config is checked as at a start."""

    async def build(tmp: Path) -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            daemon = Daemon(config, nursery, runtime_dir=tmp, state_dir=tmp / "state")
            try:
                daemon.load_backends()
                daemon.check_config(config, running=False)
                return tool_listing.catalogue(daemon)
            finally:
                daemon.audit.close()
                nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory(prefix="diagd-tools-") as tmp, logs.quiet():
        return trio.run(build, Path(tmp))


# Everything the daemon and its children create is owner-only: the audit log holds every call's
# arguments, the back ends' stored outputs hold kernel memory and what the devices and the kernel
# said. Set once for the process (and inherited by every worker a back end starts), so no
# back end can forget it; files that matter also pass 0600 explicitly.
STATE_UMASK = 0o077


async def serve(config: config_mod.Config) -> None:
    os.umask(STATE_UMASK)
    socket_names = {"mcp": paths.mcp_socket().name, "control": paths.control_socket().name}
    # First, so the LISTEN_* variables are gone before anything could start a child.
    inherited = activation.take_listen_fds(socket_names)
    heap.configure()  # big freed buffers go back to the OS (issue 12; see actors/heap.py)
    rundir = paths.open_private_dir(paths.runtime_dir(), what="runtime directory")
    try:
        paths.ensure_private_dir(paths.state_dir(), what="state directory")
        lock_fd = acquire_lock(rundir)
        paths.record_daemon_paths(rundir, Path(config.source) if config.source != "<defaults>" else paths.config_file(),
                                  paths.state_dir())
    except BaseException:
        rundir.close()
        raise
    state_dir = paths.state_dir()
    bound: list[str] = []
    daemon: Daemon | None = None
    try:
        async with trio.open_nursery() as nursery:
            daemon = Daemon(config, nursery, runtime_dir=rundir.path, state_dir=state_dir)
            daemon.load_backends()
            daemon.check_config(config, running=False)  # a typo anywhere stops the start, with its close matches
            heap.settle()  # the back ends' modules are here for good: out of the cyclic collector's walks
            front = LazyFront(daemon.registry, daemon.configured_tools, daemon.instructions())

            handle_mcp = _mcp_handler(daemon, front)

            async def handle_control(stream: trio.SocketStream, conn: Connection) -> None:
                await control_server.serve_connection(stream, daemon, client=conn.client, conn=conn)

            # Before any socket: a client (or a test) that sees the sockets may signal at once, and a
            # SIGHUP before the receiver is open would end the daemon (its default action).
            await nursery.start(_handle_signals, daemon)
            if config.http.enabled:  # first: once the control socket answers, every listener accepts
                daemon.sockets["http"] = await nursery.start(http_start.serve, daemon, front)
            for kind, handle in (("mcp", handle_mcp), ("control", handle_control)):
                listener, where = await listeners.listen(rundir, socket_names[kind], inherited.get(kind))
                if kind in inherited:  # systemd's: never unlinked (systemd owns the file)
                    daemon.sockets_from_systemd.append(kind)
                else:
                    bound.append(socket_names[kind])
                await nursery.start(daemon.accept, listener, kind, handle)
                daemon.sockets[kind] = str(where)
            nursery.start_soon(daemon.trimmer.run)
            sd_notify("READY=1\nSTATUS=listening")
            log.info("diagd ready", pid=os.getpid(), sockets=daemon.sockets, tools=len(daemon.registry.specs()))
    except BaseExceptionGroup as group:
        raise _single_coded(group) or group from None
    finally:
        for name in bound:
            rundir.remove(name)
        if daemon is not None:
            daemon.audit.close()
        os.close(lock_fd)
        rundir.close()
        sd_notify("STOPPING=1")
        log.info("diagd stopped")


def _mcp_handler(daemon: Daemon, front: LazyFront) -> ConnectionHandler:
    """Serve MCP on one accepted connection (the SDK's server, imported on the first one)."""

    async def handle_mcp(stream: trio.SocketStream, conn: Connection) -> None:
        mcp_front, server = await front.get()
        # Read per connection: a reload applies to connections made after it (reload.DAEMON).
        max_line = daemon.config.daemon.max_line_bytes
        client = Client(conn.client, conn.pid)
        daemon.clients.connected(client)
        try:
            await mcp_front.serve_connection(stream, server, client=conn.client, max_line_bytes=max_line,
                                             frame_timeout_s=daemon.config.daemon.frame_timeout_s,
                                             budget=daemon.frame_budget, conn=conn,
                                             stopping=daemon.stopping_notice, tools=daemon.configured_tools(),
                                             groups=daemon.registry.groups(), guides=daemon.instructions(),
                                             off=daemon.declared.off)
        finally:
            daemon.clients.gone(client)

    return handle_mcp


def _single_coded(group: BaseExceptionGroup[BaseException]) -> DiagdError | None:
    """The coded error a start-up step raised inside the nursery (which wraps it in a group), so
    `diagd serve` prints it as one line."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 and isinstance(leaves[0], DiagdError) else None


async def _handle_signals(daemon: Daemon, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        async for signum in signals:
            if signum == signal.SIGHUP:
                try:
                    daemon.reload()
                except DiagdError as exc:
                    log.error("reload failed", error=exc.message)
                continue
            daemon.request_shutdown(f"signal {signal.Signals(signum).name}")
