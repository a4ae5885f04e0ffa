"""The daemon's side of `diagd.actors.runtime.Runtime`: what each back end gets, and the clients.

`Daemon.load_backends` imports each back-end module and calls its `register(runtime)` with a
`BackendRuntime` named after the module (`diagd.actors.pcap` -> `pcap`): its config table is
`[pcap]`, its state dir `$state/pcap`. The runtime forwards to the daemon's supervisor, registry
and config; a back end sees nothing else of the daemon.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from diagd.actors.base import ProgressFn
from diagd.actors.runtime import (
    ActorFactory,
    ActorRef,
    BackendConfig,
    Client,
    ClientHook,
    IdleTimeout,
    ReloadHook,
    StopCheck,
)
from diagd.actors.tooling import ToolSpec
from diagd.daemon.config import Config

if TYPE_CHECKING:
    from diagd.daemon.server import Daemon

log = structlog.get_logger("diagd.backends")


def backend_name(module: str) -> str:
    """A back end's name: its module's last component (`diagd.actors.pcap` -> `pcap`)."""
    return module.rpartition(".")[2]


# Back ends whose `$state/<name>/exports` other back ends read (export_serial_pcapng feeds the pcap tools).
EXPORTING_BACKENDS = ("serial",)


def backend_config(config: Config, name: str, state_dir: Path | None = None,
                   runtime_dir: Path | None = None) -> BackendConfig:
    exports = {n: str(state_dir / n / "exports") for n in EXPORTING_BACKENDS} if state_dir else {}
    private = tuple(str(d) for d in (state_dir, runtime_dir) if d is not None)
    return BackendConfig(table=config.backend(name), allowed_dirs=config.daemon.allowed_dirs,
                         regex_budget_s=config.daemon.regex_budget_s, call_timeout_s=config.daemon.call_timeout_s,
                         exports_dirs=exports, private_dirs=private)


class Clients:
    """Who is connected, as back ends see clients, and the hooks told when one comes or goes.

    MCP clients count from their connection's first message to its end; a `diagd call` command
    from its hello to its end. A client may hold several connections: it is gone with the last.
    """

    def __init__(self) -> None:
        self._connected: dict[str, tuple[Client, int]] = {}
        self.connected_hooks: list[ClientHook] = []
        self.gone_hooks: list[ClientHook] = []

    def now(self) -> list[Client]:
        return [client for client, _ in self._connected.values()]

    def connected(self, client: Client) -> None:
        _, count = self._connected.get(client.name, (client, 0))
        self._connected[client.name] = (client, count + 1)
        if count == 0:
            self._tell(self.connected_hooks, client)

    def gone(self, client: Client) -> None:
        _, count = self._connected.get(client.name, (client, 1))
        if count > 1:
            self._connected[client.name] = (client, count - 1)
            return
        self._connected.pop(client.name, None)
        self._tell(self.gone_hooks, client)

    @staticmethod
    def _tell(hooks: list[ClientHook], client: Client) -> None:
        for hook in hooks:
            try:
                hook(client)
            except Exception:  # one back end's bug must not keep the others holding the client's resources
                log.exception("client hook failed", client=client.name)


class BackendRuntime:
    """One back end's `Runtime`: the daemon's services, seen from that back end."""

    def __init__(self, daemon: Daemon, name: str) -> None:
        self._daemon = daemon
        self._name = name
        self._config: tuple[Config, BackendConfig] | None = None

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

    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]:
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

    def config(self) -> BackendConfig:
        current = self._daemon.config
        if self._config is None or self._config[0] is not current:
            self._config = (current, backend_config(current, self._name, self._daemon.state_dir,
                                                    self._daemon.runtime_dir))
        return self._config[1]

    def on_reload(self, hook: ReloadHook) -> None:
        def notes(old: Config, new: Config) -> list[dict[str, Any]]:
            dirs = (self._daemon.state_dir, self._daemon.runtime_dir)
            return hook(backend_config(old, self._name, *dirs), backend_config(new, self._name, *dirs))
        self._daemon.reload_hooks.append(notes)

    def reload(self) -> dict[str, Any]:
        return self._daemon.reload()

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


ReloadNotes = Callable[[Config, Config], list[dict[str, Any]]]
