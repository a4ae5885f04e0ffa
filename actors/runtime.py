"""What a back end gets from the daemon: the `Runtime` its `register(runtime)` receives.

Everything a back end may reach goes through this interface: registering its tools, starting,
asking, finding and stopping its actors, its own config table (re-read on `diagd reload`, with a
hook to refuse a broken table or say what waits for a reopen), its state directory, the
clients that connect and go, and what the daemon tells about it: its paragraph of the MCP
instructions, its diagd_timeline source, the settings a reload leaves to a reopen, the exports
other groups read, why it serves nothing when a setting leaves it off, and the other groups' tools it
calls (`uses_tool`: checked against those tools once every back end is loaded). The daemon knows no
back end by name: whatever it says of one, the back end declared here (its `SYSTEM_NEEDS`, read
without starting it, is the one declaration outside).

The daemon implements it: one runtime per back end, of the back end's name (its `diagd.backends`
entry point's, daemon/discovery.py: `pcap`, its table `[pcap]`, its state dir `$state/pcap`);
a test can implement it without one (tests/support/fake_runtime.py). Nothing here imports the daemon.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload

from diagd.actors.base import Actor, ProgressFn
from diagd.actors.message import Message, ReplyT
from diagd.actors.timeline_source import TimelineSource
from diagd.actors.tooling import ToolSpec

ActorFactory = Callable[[], Actor]
# An actor's idle timeout: None follows the daemon's idle_timeout_s; a callable reads a back end's
# current setting (both follow a reload); a number stays fixed for the actor's life.
IdleTimeout = float | Callable[[], float] | None


class ActorRef(Protocol):
    """A started actor, as `Runtime.start` returns it and `Runtime.ask` takes it.

    A reference stays valid after its actor stopped: asking it then raises `ActorGone`; the
    supervisor never starts a new actor behind it.
    """

    @property
    def id(self) -> str: ...  # e.g. "serial-3": what diagd_status shows and diagd_stop_actor takes

    @property
    def kind(self) -> str: ...

    @property
    def resource(self) -> str: ...

    @property
    def actor(self) -> Actor | None: ...  # the current instance (a restart replaces it)

    @property
    def accepting(self) -> bool: ...  # False once it stops, expires or fails for good

    def statistics(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class BackendConfig:
    """A back end's view of the config: its own table as the file has it, and the daemon-wide
    settings back ends follow. A new object after each reload (the old one is never changed), so
    settings parsed from it may be cached by identity."""

    table: Mapping[str, Any] = field(default_factory=dict)  # [<back end>], raw: the back end parses it
    allowed_dirs: tuple[str, ...] = ()  # [daemon] allowed_dirs: the default of a back end's own
    regex_budget_s: float = 5.0  # [daemon] regex_budget_s: matching time one call may spend
    call_timeout_s: float = 30.0  # [daemon] call_timeout_s: the limit of a tool without its own
    # Where back ends write files for the other back ends' tools to read (serial sessions as pcapng),
    # by the group that writes them: readable like allowed_dirs (only diagd writes there, under names
    # it makes), though only for a client that selected that group too (docs/security.md).
    exports_dirs: Mapping[str, str] = field(default_factory=dict)
    # diagd's own directories (the state dir: crash outputs, serial logs, bpftrace results, the audit
    # log; the runtime dir: sockets): no tool reads a caller-named file under them, whatever
    # allowed_dirs says, except a group's exports dir above.
    private_dirs: tuple[str, ...] = ()
    # The TCP ports diagd itself serves MCP on (the [http] listener, as bound): its requests carry bearer
    # tokens, so a live capture must never record them, whatever interface it is allowed on.
    own_tcp_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class Client:
    """A connected client, as tool calls name it (`CallContext.client`)."""

    name: str  # "mcp:<pid>" (an MCP client through `diagd mcp`) or "cli:<pid>" (a `diagd call` command)
    pid: int
    # One short-lived command (`diagd call`): whatever it holds ends with its connection.
    ephemeral: bool = False


@dataclass(frozen=True)
class Deferred:
    """Settings of a back end's table that a reload does not apply to what is already open: `diagd
    reload` lists a changed one under `not_yet_applied`, with what it applies to and why."""

    keys: tuple[str, ...]
    applies_to: str  # e.g. "ports opened after the reload"
    why: str  # e.g. "an open port keeps the limits it was opened with"


@dataclass(frozen=True)
class Resolved:
    """What a reference `<back end>:<id>` names, as one file of that back end's exports that the other
    back ends' tools read in place of a path (`capture:cap-1a2b3c4d`: a live capture's packets so far)."""

    path: str  # a file in the declaring back end's exports dir
    about: dict[str, Any] = field(default_factory=dict)  # what the file holds of it, for the answers


# The group of the daemon's own tools (diagd_status, diagd_timeline, ...), for a `ToolUse` of one.
DAEMON_GROUP = "diagd"


@dataclass(frozen=True)
class ToolUse:
    """A tool of some group that a back end calls with `Runtime.call`, as it declared it with `uses_tool`."""

    group: str  # the group the tool belongs to (a back end's name, or DAEMON_GROUP)
    tool: str
    arguments: tuple[str, ...] = ()  # every argument name the back end's own code passes it
    # It also passes arguments its caller gave for that tool (a recording's `capture` object to start_capture):
    # names the back end cannot declare, which that tool validates as its own.
    forwards: bool = False


# A back end's resolver of its references: the part after `<name>:` -> the file (coded errors).
Resolver = Callable[[str], Awaitable[Resolved]]

# Called by a reload with the old and the new config: returns notes on changed settings that do not
# apply to what is already open (`not_yet_applied`), or raises DiagdError to refuse the new config.
ReloadHook = Callable[[BackendConfig, BackendConfig], list[dict[str, Any]]]
ClientHook = Callable[[Client], None]
# What `diagd status` shows of a back end beyond its actors (its files on disk...): called at each status,
# in the event loop (quick reads only); each key a list of rows (dicts), shown as a table.
StatusSection = Callable[[], dict[str, list[dict[str, Any]]]]
# Asked before `diagd_stop_actor` stops one of the back end's actors for a client (its name): raises
# DiagdError (BUSY, PERMISSION_DENIED, naming the owner) when the back end's own tools would refuse it.
StopCheck = Callable[[ActorRef, str], None]


class Runtime(Protocol):
    """Everything a back end gets (see the module docstring); the daemon implements it per back end."""

    @property
    def name(self) -> str: ...  # the back end's name: its config table and state dir

    @property
    def state_dir(self) -> Path: ...  # $state/<name>: the back end's own files (created by the back end)

    # -- tools

    def register_tool(self, spec: ToolSpec) -> None: ...

    # -- actors

    async def start(self, kind: str, resource: str, factory: ActorFactory, *,
                    idle_timeout_s: IdleTimeout = None) -> ActorRef:
        """Start the actor for (kind, resource), or return the one running (two racing starts start
        it once). The actor's setup errors are raised here."""
        ...

    # A message that says its reply (`Message[SomeReply]`, actors/base.py) gets that model back, checked
    # by mypy where the handler returns it; any other message a plain dict (the messages not typed yet).
    # The overloads are tried in order, so a Message, which is also an object, takes the first.
    @overload
    async def ask(self, ref: ActorRef, message: Message[ReplyT], *,  # type: ignore[overload-overlap]
                  progress: ProgressFn | None = None) -> ReplyT:
        """Send `message` to the actor and wait for its reply; never starts one (`ActorGone` when it
        has stopped). The inbox wait is added to the current call's `queue_s`."""
        ...

    @overload
    async def ask(self, ref: ActorRef, message: object, *, progress: ProgressFn | None = None) -> dict[str, Any]: ...

    def find(self, kind: str, resource: str) -> ActorRef | None: ...

    def actors(self, kind: str) -> list[ActorRef]: ...

    def stop(self, ref: ActorRef, reason: str) -> None:
        """Stop the actor (its running and queued requests fail); nothing if it has stopped already."""
        ...

    def on_stop_request(self, kind: str, check: StopCheck) -> None:
        """`check` decides whether a client may stop this kind's actors with diagd_stop_actor (the
        daemon's own tool): ownership as the back end's own tools honour it. Without one, any client
        that selected the back end's group may."""
        ...

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call a tool of any group (another back end's, the daemon's) by name for the client whose call
        this task serves, as that client would: validation, limits, the audit log and its tool groups
        (a tool of a group it has not selected is NOT_FOUND); the tool's coded error is raised. A tool
        that composes others (a recording) names them, not their packages. Only a tool declared with
        `uses_tool`, with the arguments declared there (INTERNAL_ERROR otherwise: the declaration is
        what the daemon checked at start, so it may not drift from the calls)."""
        ...

    def uses_tool(self, group: str, tool: str, arguments: Iterable[str] = (), *, forwards: bool = False) -> None:
        """Declare that the back end calls `tool` of `group` (`call`), passing `arguments` (every name its
        code passes); `forwards`: it passes its caller's own arguments for that tool too. Once every back end
        is loaded the daemon checks each declaration against the tool's inputSchema (the tool exists in that
        group, takes each argument, and, unless `forwards`, gets each of its required ones) and refuses
        to start otherwise (BACKEND_UNAVAILABLE naming both), so a renamed tool or argument stops the
        start rather than a call. A use of a group that declared itself off is not checked (its tools
        are not there to call). Declaring a tool twice adds the arguments."""
        ...

    # -- config

    def config(self) -> BackendConfig: ...

    def on_reload(self, hook: ReloadHook) -> None: ...

    def reload(self) -> dict[str, Any]:
        """Re-read the config file for the whole daemon (what `diagd reload` does), returning its answer."""
        ...

    def defer_on_reload(self, deferred: Deferred) -> None:
        """Declare settings a reload leaves to a reopen (a hook may add notes of its own)."""
        ...

    @property
    def shutting_down(self) -> bool: ...  # the daemon is stopping: actors stop for that, not for failure

    # -- clients

    def clients(self) -> list[Client]: ...  # the clients connected now

    def on_client(self, *, connected: ClientHook | None = None, gone: ClientHook | None = None) -> None: ...

    # -- what the daemon says of the back end

    def set_instructions(self, text: str) -> None:
        """Its paragraph of the MCP server instructions, read by a client that selected its group."""
        ...

    def add_timeline_source(self, source: TimelineSource) -> None:
        """diagd_timeline reads a `{"<name>": ref, ...}` source with it (one per back end)."""
        ...

    def add_status(self, section: StatusSection) -> None:
        """`diagd status` shows what `section()` gives under the back end's name (one per back end): what
        it keeps that no running actor shows (a capture's index on disk)."""
        ...

    def share_exports(self) -> None:
        """Its `$state/<name>/exports` holds files other groups' tools read (for a client that selected
        both groups: `BackendConfig.exports_dirs`)."""
        ...

    def add_reference(self, resolve: Resolver) -> None:
        """`<name>:<id>`, where another back end's tool takes a file, names what `resolve(id)` gives: one
        file of its exports (`share_exports`), read by a client that selected its group too."""
        ...

    async def resolve_reference(self, text: str) -> Resolved | None:
        """The file `text` names when it is `<name>:<id>` of a back end that declared references (None
        when it is not one: a path); PERMISSION_DENIED when the client has not selected that group."""
        ...

    def declare_off(self, reason: str, hint: str) -> None:
        """Under this config the back end serves nothing (it registers no tool): `reason` says why, `hint`
        what turns it on, as the exact setting to put in config.toml and what applies it (`diagd restart`
        or `diagd reload`). `diagd tools` shows both, and `diagd client add --tools <name>` is refused
        with them (a client that selected only this group could not start)."""
        ...
