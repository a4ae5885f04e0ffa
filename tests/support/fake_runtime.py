"""A `Runtime` without a daemon, for unit tests of one back end.

It is what `Daemon` gives a back end, minus sockets, audit and the other back ends: a real
supervisor and tool registry inside the test's nursery (so arguments are validated and defaults
filled as in production), a config table the test sets and reloads, clients it connects and drops.

    async with fake_runtime(tmp_path, "echo_actor", {"prefix": "> "}) as rt:
        echo_actor.register(rt)
        assert (await rt.call("echo", {"message": "hi"}))["message"] == "> hi"
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, overload

import trio

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
from diagd.actors.tooling import CallContext, ToolSpec
from diagd.daemon.server.presence import Clients
from diagd.daemon.server.supervisor import Supervisor
from diagd.daemon.server.tools import ToolRegistry
from diagd.protocol.errors import DiagdError


class FakeRuntime:
    def __init__(self, nursery: trio.Nursery, name: str, state_dir: Path, table: Mapping[str, Any] | None = None,
                 **shared: Any) -> None:
        self.name = name
        self.state_dir = state_dir / name
        self.supervisor = Supervisor(nursery, idle_timeout_s=600)
        self.registry = ToolRegistry(call_timeout_s=30)
        self._config = BackendConfig(table=dict(table or {}), **shared)
        self._reload_hooks: list[ReloadHook] = []
        self.stop_checks: dict[str, StopCheck] = {}
        self._clients = Clients()
        self.shutting_down = False
        # What the back end declared of itself (the daemon keeps these in daemon/server/declared.py).
        self.instructions: str | None = None
        self.timeline_source: TimelineSource | None = None
        self.deferred: list[Deferred] = []
        self.shares_exports = False
        self.references: dict[str, Resolver] = {}  # back end name -> resolver (the test may add others')
        self.off: dict[str, str] | None = None  # {"reason", "hint"} once it declared itself off
        self.uses: list[ToolUse] = []  # the tools of other groups it declared it calls (the daemon checks them)

    # -- what the test does

    async def call(self, tool: str, arguments: dict[str, Any] | None = None, *, client: str = "mcp:1",
                   progress: ProgressFn | None = None) -> dict[str, Any]:
        """Call a tool as a client would; a coded error is raised as the DiagdError it carries."""
        result = await self.registry.call(tool, arguments or {}, CallContext(client=client, progress=progress))
        if result.is_error:
            raise DiagdError.from_wire(**result.payload)
        return result.payload

    def set_table(self, table: Mapping[str, Any]) -> list[dict[str, Any]]:
        """`diagd reload` with a new table: the back end's hooks may refuse it (DiagdError) or note
        what waits for a reopen (returned)."""
        new = replace(self._config, table=dict(table))
        notes = [note for hook in self._reload_hooks for note in hook(self._config, new)]
        self._config = new
        return notes

    def connect(self, client: Client) -> None:
        self._clients.connected(client)

    def disconnect(self, client: Client) -> None:
        self._clients.gone(client)

    # -- the Runtime

    def register_tool(self, spec: ToolSpec) -> None:
        self.registry.register(replace(spec, group=self.name))

    async def start(self, kind: str, resource: str, factory: ActorFactory, *,
                    idle_timeout_s: IdleTimeout = None) -> ActorRef:
        return await self.supervisor.start(kind, resource, factory, idle_timeout_s=idle_timeout_s, group=self.name)

    @overload
    async def ask(self, ref: ActorRef, message: Message[ReplyT], *,  # type: ignore[overload-overlap]
                  progress: ProgressFn | None = None) -> ReplyT: ...

    @overload
    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]: ...

    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> Any:
        return await self.supervisor.ask(ref, message, progress=progress)

    def find(self, kind: str, resource: str) -> ActorRef | None:
        return self.supervisor.find(kind, resource)

    def actors(self, kind: str) -> list[ActorRef]:
        return [ref for ref in self.supervisor.actors() if ref.kind == kind]

    def stop(self, ref: ActorRef, reason: str) -> None:
        if ref.accepting:
            self.supervisor.stop(ref.id, reason=reason)

    def on_stop_request(self, kind: str, check: StopCheck) -> None:
        self.stop_checks[kind] = check

    def config(self) -> BackendConfig:
        return self._config

    def on_reload(self, hook: ReloadHook) -> None:
        self._reload_hooks.append(hook)

    def reload(self) -> dict[str, Any]:
        notes = self.set_table(self._config.table)
        return {"reloaded": True, "config": "<fake>", "changed": [], "not_yet_applied": notes}

    def clients(self) -> list[Client]:
        return self._clients.now()

    def on_client(self, *, connected: ClientHook | None = None, gone: ClientHook | None = None) -> None:
        if connected is not None:
            self._clients.connected_hooks.append(connected)
        if gone is not None:
            self._clients.gone_hooks.append(gone)


    def defer_on_reload(self, deferred: Deferred) -> None:
        self.deferred.append(deferred)

    def set_instructions(self, text: str) -> None:
        self.instructions = text

    def add_timeline_source(self, source: TimelineSource) -> None:
        self.timeline_source = source

    def add_status(self, section: StatusSection) -> None:
        self.status_section = section

    def share_exports(self) -> None:
        self.shares_exports = True

    def add_reference(self, resolve: Resolver) -> None:
        self.references[self.name] = resolve

    async def resolve_reference(self, text: str) -> Resolved | None:
        name, colon, ident = text.partition(":")
        resolver = self.references.get(name) if colon else None
        return None if resolver is None else await resolver(ident)

    def declare_off(self, reason: str, hint: str) -> None:
        self.off = {"reason": reason, "hint": hint}

    def uses_tool(self, group: str, tool: str, arguments: Iterable[str] = (), *, forwards: bool = False) -> None:
        self.uses.append(ToolUse(group, tool, tuple(arguments), forwards))


@asynccontextmanager
async def fake_runtime(state_dir: Path, name: str, table: Mapping[str, Any] | None = None,
                       **shared: Any) -> AsyncIterator[FakeRuntime]:
    async with trio.open_nursery() as nursery:
        runtime = FakeRuntime(nursery, name, state_dir, table, **shared)
        yield runtime
        runtime.shutting_down = True
        nursery.cancel_scope.cancel()
