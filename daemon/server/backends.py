"""The daemon's side of `diagd.actors.runtime.Runtime`: what each back end gets.

`Daemon.load_backends` imports each back end found (daemon/discovery.py) and calls its
`register(runtime)` with a `BackendRuntime` of the back end's name: its config table is `[name]`,
its state dir `$state/name`. The runtime forwards to the daemon's supervisor, registry and config,
and keeps what the back end declares (daemon/server/declared.py; `Daemon.load_backends` checks the tools
each one declared it calls once all are loaded); a back end sees nothing else of the daemon.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, overload
from urllib.parse import urlsplit

from diagd.actors.base import ProgressFn
from diagd.actors.message import Message, ReplyT
from diagd.actors.runtime import (
    ActorFactory,
    ActorRef,
    BackendConfig,
    Client,
    ClientHook,
    Deferred,
    IdleTimeout,
    ReloadHook,
    Resolved,
    Resolver,
    StatusSection,
    StopCheck,
    ToolUse,
)
from diagd.actors.timeline_source import TimelineSource
from diagd.actors.tooling import ToolSpec, current_call, current_groups
from diagd.daemon.config import Config
from diagd.daemon.server.services import Services
from diagd.protocol.errors import DiagdError, ErrorCode


def backend_config(config: Config, name: str, state_dir: Path | None = None, runtime_dir: Path | None = None,
                   exports: dict[str, str] | None = None, http_url: str | None = None) -> BackendConfig:
    """`name`'s view of `config`; `exports`: the exports dirs of the back ends that share theirs;
    `http_url`: the HTTP listener's endpoint once bound (its port, where the config says port 0)."""
    exports = exports or {}
    private = tuple(str(d) for d in (state_dir, runtime_dir) if d is not None)
    return BackendConfig(table=config.backend(name), allowed_dirs=config.daemon.allowed_dirs,
                         regex_budget_s=config.daemon.regex_budget_s, call_timeout_s=config.daemon.call_timeout_s,
                         exports_dirs=exports, private_dirs=private, own_tcp_ports=own_tcp_ports(config, http_url))


def own_tcp_ports(config: Config, http_url: str | None) -> tuple[int, ...]:
    """Each TCP port of diagd's HTTP listener: the bound one, and the configured one (the same, unless
    it was 0: then only the bound one; a reload that changes `listen` applies at the next start, so
    the bound port stays the one served)."""
    found = {urlsplit(http_url).port} if http_url else set()
    if config.http.enabled and config.http.port:
        found.add(config.http.port)
    return tuple(sorted(p for p in found if p))


class BackendRuntime:
    """One back end's `Runtime`: the daemon's services, seen from that back end."""

    def __init__(self, daemon: Services, name: str) -> None:
        self._daemon = daemon
        self._name = name
        self._config: tuple[Config, tuple[int, str | None], BackendConfig] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def state_dir(self) -> Path:
        return self._daemon.state_dir / self._name

    def register_tool(self, spec: ToolSpec) -> None:
        self._daemon.registry.register(replace(spec, group=self._name))

    async def start(self, kind: str, resource: str, factory: ActorFactory, *,
                    idle_timeout_s: IdleTimeout = None) -> ActorRef:
        return await self._daemon.supervisor.start(kind, resource, factory, idle_timeout_s=idle_timeout_s,
                                                   group=self._name)

    @overload
    async def ask(self, ref: ActorRef, message: Message[ReplyT], *,  # type: ignore[overload-overlap]
                  progress: ProgressFn | None = None) -> ReplyT: ...

    @overload
    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]: ...

    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> Any:
        return await self._daemon.supervisor.ask(ref, message, progress=progress)

    def find(self, kind: str, resource: str) -> ActorRef | None:
        return self._daemon.supervisor.find(kind, resource)

    def actors(self, kind: str) -> list[ActorRef]:
        return [ref for ref in self._daemon.supervisor.actors() if ref.kind == kind]

    def stop(self, ref: ActorRef, reason: str) -> None:
        if ref.accepting:
            self._daemon.supervisor.stop(ref.id, reason=reason)

    def on_stop_request(self, kind: str, check: StopCheck) -> None:
        self._daemon.stop_checks[kind] = check

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self._daemon.declared.check_call(self._name, tool, arguments)
        ctx = current_call.get()
        if ctx is None:
            raise DiagdError(ErrorCode.INTERNAL_ERROR, f"{tool} was called outside a tool call")
        result = await self._daemon.registry.call(tool, arguments, replace(ctx, typed=False, queue_s=0.0),
                                                  selection=current_groups.get())
        if result.is_error:
            wire = result.payload
            raise DiagdError.from_wire(wire["code"], wire["message"], wire.get("details"))
        payload: dict[str, Any] = result.payload
        return payload

    def uses_tool(self, group: str, tool: str, arguments: Iterable[str] = (), *, forwards: bool = False) -> None:
        self._daemon.declared.use(self._name, ToolUse(group, tool, tuple(arguments), forwards))

    def _view(self, config: Config) -> BackendConfig:
        daemon = self._daemon
        return backend_config(config, self._name, daemon.state_dir, daemon.runtime_dir,
                              daemon.declared.exports_dirs(daemon.state_dir), daemon.sockets.get("http"))

    def config(self) -> BackendConfig:
        current, sharing = self._daemon.config, (len(self._daemon.declared.exporting), self._daemon.sockets.get("http"))
        # A new view after a reload, after a back end loaded later declared its exports, and once the
        # HTTP listener is bound (its port: own_tcp_ports).
        if self._config is None or self._config[0] is not current or self._config[1] != sharing:
            self._config = (current, sharing, self._view(current))
        return self._config[2]

    def on_reload(self, hook: ReloadHook) -> None:
        def notes(old: Config, new: Config) -> list[dict[str, Any]]:
            return hook(self._view(old), self._view(new))
        self._daemon.reload_hooks.append(notes)

    def defer_on_reload(self, deferred: Deferred) -> None:
        self._daemon.declared.deferred.setdefault(self._name, []).append(deferred)

    def reload(self) -> dict[str, Any]:
        return dict(self._daemon.reload())

    @property
    def shutting_down(self) -> bool:
        return self._daemon.shutdown_reason is not None

    def clients(self) -> list[Client]:
        return self._daemon.clients.now()

    def on_client(self, *, connected: ClientHook | None = None, gone: ClientHook | None = None) -> None:
        if connected is not None:
            self._daemon.clients.connected_hooks.append(connected)
        if gone is not None:
            self._daemon.clients.gone_hooks.append(gone)

    def set_instructions(self, text: str) -> None:
        self._daemon.declared.instructions[self._name] = text

    def add_timeline_source(self, source: TimelineSource) -> None:
        self._daemon.declared.timeline[self._name] = source

    def add_status(self, section: StatusSection) -> None:
        self._daemon.declared.status[self._name] = section

    def share_exports(self) -> None:
        if self._name not in self._daemon.declared.exporting:
            self._daemon.declared.exporting.append(self._name)

    def add_reference(self, resolve: Resolver) -> None:
        self._daemon.declared.references[self._name] = resolve

    async def resolve_reference(self, text: str) -> Resolved | None:
        return await self._daemon.declared.resolve(text)

    def declare_off(self, reason: str, hint: str) -> None:
        self._daemon.declared.off[self._name] = {"reason": reason, "hint": hint}
