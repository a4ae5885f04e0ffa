"""How a back end declares its MCP tools: specs, the call context, one decorator, shared schema parts.

Back ends declare tools with a `ToolSet`; the daemon's registry validates arguments against each
input schema (filling in every `default` the schema declares, so handlers read `args["limit"]`
and never restate a default), runs the handler and turns its result or error into the reply.
Nothing here imports the daemon: a back end's tools can be called by a test without one.

    tools: ToolSet[EchoBackend] = ToolSet()

    class EchoReply(TypedDict):          # the reply model: its outputSchema (actors/replies.py)
        message: str

    @tools.tool("echo", "Echo a message through the echo actor.",
                {"message": {"type": "string"}, **paging(limit=20, maximum=100)}, required=("message",))
    async def echo(backend: EchoBackend, ctx: CallContext, args: dict[str, Any]) -> EchoReply:
        return {"message": args["message"][args["offset"]:][:args["limit"]]}

    tools.register(runtime, EchoBackend(runtime))   # in the back end's register(runtime)
"""

from __future__ import annotations

import contextvars
import copy
import functools
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

import jsonschema

from diagd.actors.base import ProgressFn
from diagd.actors.replies import is_reply_model, reply_schema
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass
class CallContext:
    """What a handler knows about the call it serves."""

    client: str
    progress: ProgressFn | None = None
    queue_s: float = 0.0  # time the call's requests waited in actor inboxes (added by the supervisor's ask)
    # The client's working directory (its process's, read at connect time): relative paths in its
    # arguments are resolved against it. None when it is not known: relative paths are refused.
    cwd: str | None = None
    # The client is one short-lived command (`diagd call`: one control connection per command):
    # whatever it holds (crash session references) ends with its connection.
    ephemeral: bool = False
    # The arguments were typed on a command line (`diagd call key=value`): a number where the schema
    # wants a string is the text typed (`payload=12`). From an agent, it is a mistake refused.
    typed: bool = False
    # The client renders MCP Apps views (it declared the extension, docs/views.md): a tool with a view may
    # add what only the view reads. Any other client gets exactly the reply it got before views existed.
    views: bool = False

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self.progress is not None:
            await self.progress(progress, total, message)


# What a handler returns: its reply model (a TypedDict, which mypy checks the handler against).
Reply = Mapping[str, Any]
Handler = Callable[[CallContext, dict[str, Any]], Awaitable[Reply]]

# The call a task serves, for code below a handler that resolves paths without being handed its
# context (set by the registry around the handler; tasks the handler starts inherit it). The
# supervisor's `ask` adds inbox waits to its `queue_s`.
current_call: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("diagd_call", default=None)


def caller_cwd() -> str | None:
    """The working directory of the client whose call this task serves (None: unknown)."""
    ctx = current_call.get()
    return ctx.cwd if ctx is not None else None


# The tool groups of the client whose call this task serves (None: every group), set by the
# registry around the handler like current_call. Back ends read it where a group's boundary
# reaches their own files (the pcap tools read the serial group's exports only for a client that
# selected serial too); a tool that calls other tools passes it on.
current_groups: contextvars.ContextVar[frozenset[str] | None] = contextvars.ContextVar("diagd_groups", default=None)


def caller_selects(group: str) -> bool:
    """Whether the client whose call this task serves selected the tool group `group`."""
    groups = current_groups.get()
    return groups is None or group in groups


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Handler
    # The reply's model (a TypedDict, actors/replies.py): the tool's outputSchema is generated from it,
    # never written by hand. `ToolSet.tool` always sets it; only a bare spec of a unit test has none.
    reply: type | None = None
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    # None: the daemon's call_timeout_s. A callable is asked at each call, for limits that derive
    # from a back end's settings and must follow `diagd reload`.
    timeout_s: float | Callable[[], float] | None = None
    title: str | None = None
    # The back end that registered it (its runtime's name; "diagd" for the daemon's own tools):
    # clients choose the groups they see (`diagd mcp --tools pcap`).
    group: str = ""
    # The tool's view (an MCP Apps `ui://` resource, docs/views.md), or None. A host that renders MCP Apps
    # shows the tool's result in it; tools/list names it only when it is built (daemon/app_views.py).
    ui: str | None = None

    @functools.cached_property
    def output_schema(self) -> dict[str, Any] | None:
        """The whole JSON Schema of the tool's result (generated from `reply` on first use, then kept by
        this spec: the registry's; the caller must not change it)."""
        return reply_schema(self.reply) if self.reply is not None else None


# ---------------------------------------------------------------------------------------------
# Declaring tools


B = TypeVar("B")
# A tool's handler as declared: the back end's own object (its state: runtime, settings, records)
# first, then the call. `ToolSet.specs(owner)` binds it into a `Handler`.
ToolHandler = Callable[[B, CallContext, dict[str, Any]], Awaitable[Reply]]


@dataclass(frozen=True)
class _Declared(Generic[B]):
    spec: ToolSpec  # with a placeholder handler until bound
    handler: ToolHandler[B]


class ToolSet(Generic[B]):
    """The tools of one back end, each declared once, next to its handler, by `@tools.tool(...)`.

    Handlers are plain functions (or methods) taking the back end's object first; `register(runtime,
    owner)` binds them to it. So a back end's tools.py is a flat list of small handlers, never one
    long register() of closures.
    """

    def __init__(self) -> None:
        self._declared: dict[str, _Declared[B]] = {}

    def tool(self, name: str, description: str, props: Mapping[str, Any] | None = None, *,
             required: Sequence[str] = (), title: str | None = None,
             input_schema: dict[str, Any] | None = None, read_only: bool = True, destructive: bool = False,
             idempotent: bool = True, timeout_s: float | Callable[[], float] | None = None,
             ui: str | None = None,
             ) -> Callable[[ToolHandler[B]], ToolHandler[B]]:
        """Declare a tool. `props` (and `required`) make a closed input object; `input_schema` gives a
        whole schema instead. Every tool states what it returns: the handler's return annotation is
        its reply model (a TypedDict), from which its outputSchema is generated. `ui` names the tool's
        view (`ui://diagd/<name>`: daemon/views/src/views/<name>.html, docs/views.md)."""
        if props is not None and input_schema is not None:
            raise ValueError(f"tool {name!r}: give props or input_schema, not both")
        if ui is not None and not ui.startswith("ui://"):
            raise ValueError(f"tool {name!r}: ui must be a ui:// resource URI, not {ui!r}")
        schema = input_schema if input_schema is not None else object_schema(props or {}, required, closed=True)

        def declare(handler: ToolHandler[B]) -> ToolHandler[B]:
            if name in self._declared:
                raise ValueError(f"tool {name!r} declared twice")
            reply = _reply_model(name, handler)
            spec = ToolSpec(name=name, description=description, input_schema=schema, handler=_unbound,
                            reply=reply, read_only=read_only, destructive=destructive,
                            idempotent=idempotent, timeout_s=timeout_s, title=title, ui=ui)
            self._declared[name] = _Declared(spec, handler)
            return handler
        return declare

    def specs(self, owner: B) -> list[ToolSpec]:
        """Every tool, its handler bound to `owner`."""
        return [replace(d.spec, handler=functools.partial(d.handler, owner)) for d in self._declared.values()]

    def register(self, runtime: ToolSink, owner: B) -> None:
        for spec in self.specs(owner):
            runtime.register_tool(spec)


class ToolSink(Protocol):
    """Where a `ToolSet` registers its tools: a back end's `Runtime` (actors/runtime.py, which imports this)."""

    def register_tool(self, spec: ToolSpec) -> None: ...


def _reply_model(name: str, handler: Callable[..., Any]) -> type:
    """The reply model a handler's return annotation names (resolved in the handler's module)."""
    annotation = handler.__annotations__.get("return")
    model = eval(annotation, handler.__globals__) if isinstance(annotation, str) else annotation
    if not is_reply_model(model):
        raise TypeError(f"tool {name!r}: the handler must return a reply model (a TypedDict), not {annotation!r}")
    return typing.cast(type, model)


async def _unbound(ctx: CallContext, args: dict[str, Any]) -> Reply:
    raise DiagdError(ErrorCode.INTERNAL_ERROR, "a declared tool was called before ToolSet.specs() bound it")


# ---------------------------------------------------------------------------------------------
# Schema fragments shared by back ends


def object_schema(props: Mapping[str, Any], required: Sequence[str] = (), *, closed: bool = False) -> dict[str, Any]:
    """An object with these properties; `closed` refuses any other key (every tool input is closed)."""
    schema: dict[str, Any] = {"type": "object", "properties": dict(props)}
    if required:  # an empty list says nothing: left out of every tools/list
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def paging(*, limit: int, maximum: int) -> dict[str, Any]:
    """`offset` (default 0) and `limit` (default `limit`, at most `maximum`) of a paged listing.

    Said in two words each: every tool's schema is in every client's tools/list, paid for on
    every request, and the names, bounds and defaults say the rest."""
    return {
        "offset": {"type": "integer", "minimum": 0, "default": 0, "description": "to skip"},
        "limit": {"type": "integer", "minimum": 1, "maximum": maximum, "default": limit, "description": "page size"},
    }


def display_filter(description: str = "Wireshark filter") -> dict[str, Any]:
    """An optional Wireshark display filter (empty: every frame)."""
    return {"display_filter": {"type": "string", "default": "", "description": description}}


def path(what: str, *, description: str = "") -> dict[str, Any]:
    """A file path argument: relative paths are relative to the caller's working directory."""
    text = description or f"the {what}"
    return {"type": "string", "minLength": 1,
            "description": f"{text}; a relative path is relative to the caller's working directory"}


# ---------------------------------------------------------------------------------------------
# Validation that fills defaults


def _fill_defaults(validator_class: type[jsonschema.protocols.Validator]) -> type[jsonschema.protocols.Validator]:
    """`validator_class` whose `properties` keyword first sets every absent property that declares a
    `default` (a copy of it), then validates as before: the defaults are checked like sent values."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def properties(validator: Any, props: dict[str, Any], instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, sub in props.items():
                if isinstance(sub, dict) and "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, props, instance, schema)

    extended: type[jsonschema.protocols.Validator] = jsonschema.validators.extend(
        validator_class, {"properties": properties})
    return extended


ArgumentsValidator = _fill_defaults(jsonschema.Draft202012Validator)


def arguments_validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """A validator for a tool's input schema: `iter_errors(args)` fills `args` with the schema's defaults."""
    ArgumentsValidator.check_schema(schema)
    return ArgumentsValidator(schema)
