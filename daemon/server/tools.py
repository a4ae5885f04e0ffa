"""The tool registry: schemas, argument checks, and the one place calls become results.

Back ends register `ToolSpec`s (declared with `diagd.actors.tooling`); the MCP front end and the
control socket both call `ToolRegistry.call()`, which validates arguments (the low-level MCP
server does not) and fills in the schema's defaults, runs the handler under the call timeout,
turns every exception into a coded error, measures the call and hands it to the audit log.
Nothing here knows about MCP types.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import structlog
import trio

from diagd.actors.tooling import (
    CallContext,
    Handler,
    ToolSpec,
    arguments_validator,
    caller_cwd,
    current_call,
    current_groups,
)
from diagd.daemon.server.audit import CallRecord
from diagd.daemon.tool_groups import BUILTIN, Selection, selects
from diagd.protocol.errors import DiagdError, ErrorCode, as_error

log = structlog.get_logger("diagd.tools")

# Declared in diagd.actors.tooling (below the back ends) and CallRecord in diagd.daemon.server.audit (the
# record serialises itself there, so writing one never calls back into this module); re-exported.
__all__ = ["CallContext", "CallRecord", "CallResult", "Handler", "ToolRegistry", "ToolSpec", "caller_cwd", "coerce",
           "current_call", "current_selection"]


# The groups of the client whose call this task serves (set around the handler, like current_call): a
# tool that calls other tools (diagd_timeline) calls them with the client's selection, so a client held
# to some groups (an HTTP client under [mcp] tools) cannot reach the others through it. Declared in
# diagd.actors.tooling, where back ends read it too.
current_selection: contextvars.ContextVar[Selection] = current_groups


@dataclass
class CallResult:
    is_error: bool
    payload: dict[str, Any]  # the result, or {code, message, details}
    text: str  # compact JSON of payload: what goes on the wire as text content
    meta: dict[str, Any] = field(default_factory=dict)


Observer = Callable[[CallRecord], None]


class ToolRegistry:
    def __init__(self, *, call_timeout_s: float = 30.0) -> None:
        self._tools: dict[str, ToolSpec] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self.call_timeout_s = call_timeout_s
        self.observers: list[Observer] = []  # each gets a call's "started" record, then its final one
        self._call_ids = itertools.count(1)
        self._call_prefix = secrets.token_hex(3)  # call ids stay unique across daemon restarts in one log

    def register(self, spec: ToolSpec) -> None:
        if spec.name in self._tools:
            raise ValueError(f"tool {spec.name!r} registered twice")
        validator = arguments_validator(spec.input_schema)
        self._tools[spec.name] = spec
        self._validators[spec.name] = validator

    def update(self, spec: ToolSpec) -> None:
        """Replace a registered tool's spec, keeping its place in the list (the daemon completes
        diagd_timeline's schema once the back ends declared their sources)."""
        if spec.name not in self._tools:
            raise ValueError(f"tool {spec.name!r} is not registered")
        self._validators[spec.name] = arguments_validator(spec.input_schema)
        self._tools[spec.name] = spec

    def specs(self, selection: Selection = None) -> list[ToolSpec]:
        """Every tool, or those of the selected groups (the daemon's own always)."""
        return [spec for spec in self._tools.values() if selects(selection, spec.group)]

    def group_of(self, name: str) -> str:
        """The group of the tool `name`; the daemon's own for a name no tool has (a refused call)."""
        spec = self._tools.get(name)
        return spec.group if spec is not None else BUILTIN

    def groups(self) -> list[str]:
        """The groups tools were registered under, in registration order."""
        return list(dict.fromkeys(spec.group for spec in self._tools.values()))

    def get(self, name: str, selection: Selection = None) -> ToolSpec:
        spec = self._tools.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, [s.name for s in self.specs(selection)], n=3)
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown tool {name!r}", did_you_mean=close)
        if not selects(selection, spec.group):
            # It exists: say so and how to get it, rather than "unknown" (the agent may know it from elsewhere).
            chosen = sorted(selection or ())
            raise DiagdError(ErrorCode.NOT_FOUND, f"tool {name!r} exists (group {spec.group!r}) but this client "
                             f"has not selected it (tools: {','.join(chosen)}); add {spec.group!r} to "
                             "`diagd mcp --tools` or to [mcp] tools in the config",
                             tool=name, group=spec.group, selected=chosen)
        return spec

    def validate(self, spec: ToolSpec, arguments: Any, *, typed: bool = False) -> dict[str, Any]:
        """The arguments checked against the tool's schema, its defaults filled in. `typed`: they were
        typed on a command line (`diagd call key=value`), where a number may be the text meant."""
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "arguments must be a JSON object", path="$")
        _refuse_unsafe_text(arguments)
        # Before the schema's checks: a misspelt name is reported as itself, not as the required
        # argument it was meant to be (nor as a bad value of the default filled in for it).
        _refuse_unknown_names(spec.input_schema, arguments, "$", spec.name)
        args = coerce(spec.input_schema, arguments, numbers_as_text=typed)
        _refuse_unusable_numbers(args)
        # Validation fills `args` with the defaults the schema declares (a new dict: coerce copied it).
        error = jsonschema.exceptions.best_match(list(self._validators[spec.name].iter_errors(args)))
        if error is not None:
            path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            extra: dict[str, Any] = {}
            if error.validator == "additionalProperties" and not error.absolute_path:
                # An argument the tool does not take (one it took once, like out_path): say which it takes.
                known = sorted(spec.input_schema.get("properties", {}))
                extra["hint"] = f"{spec.name} takes {', '.join(known) or 'no arguments'}"
            raise DiagdError(
                ErrorCode.INVALID_ARGUMENT, f"{path}: {error.message}",
                path=path, schema_path="/".join(str(p) for p in error.absolute_schema_path), **extra,
            )
        return dict(args)

    async def call(self, name: str, arguments: Any, ctx: CallContext, *, selection: Selection = None) -> CallResult:
        """Run one tool call to completion; never raises except trio.Cancelled. A tool outside
        `selection` (the client's groups; None: all) is refused with NOT_FOUND."""
        started = time.monotonic()
        outcome, code = "error", None
        result: CallResult | None = None
        shown_args, call_id = _shown(arguments), self._next_call_id()
        self._observe(CallRecord(ts=time.time(), client=ctx.client, tool=name, arguments=shown_args, duration_ms=0.0,
                                 queue_ms=0.0, outcome="started", code=None, bytes=0, truncated=False,
                                 call_id=call_id, replay=(arguments, ctx.cwd)))
        try:
            try:
                spec = self.get(name, selection)
                args = self.validate(spec, arguments, typed=ctx.typed)
                timeout = self.call_timeout_s if spec.timeout_s is None else (
                    spec.timeout_s() if callable(spec.timeout_s) else spec.timeout_s)
                token, groups = current_call.set(ctx), current_selection.set(selection)
                try:
                    with trio.fail_after(timeout):
                        payload = await spec.handler(ctx, args)
                finally:
                    current_selection.reset(groups)
                    current_call.reset(token)
                result = _success(payload)
                outcome = "ok"
            except trio.TooSlowError:
                result = _failure(DiagdError(ErrorCode.TIMEOUT, f"{name} did not finish within {timeout:g} s",
                                             timeout_s=timeout))
            except DiagdError as exc:
                result = _failure(exc)
            except Exception as exc:  # the one place a bug becomes INTERNAL_ERROR, not a traceback
                log.exception("tool crashed", tool=name)
                result = _failure(as_error(exc, name))
        except trio.Cancelled:
            outcome, code = "cancelled", str(ErrorCode.CANCELLED)
            raise
        finally:
            duration_ms = (time.monotonic() - started) * 1000
            if result is not None and result.is_error:
                code = result.payload["code"]
            nbytes = len(result.text.encode()) if result is not None else 0
            truncated = bool(result is not None and result.payload.get("truncated"))
            if result is not None:
                result.meta = {"duration_ms": round(duration_ms, 3), "queue_ms": round(ctx.queue_s * 1000, 3),
                               "bytes": nbytes, "truncated": truncated}
            self._observe(CallRecord(
                ts=time.time(), client=ctx.client, tool=name, arguments=shown_args,
                duration_ms=round(duration_ms, 3), queue_ms=round(ctx.queue_s * 1000, 3), outcome=outcome,
                code=code, bytes=nbytes, truncated=truncated, call_id=call_id,
            ))
        return result

    def check_callable(self, name: str, selection: Selection, *, client: str, arguments: Any) -> None:
        """Raise `get`'s DiagdError when this client cannot call `name` (unknown, or of a group it has
        not selected), after auditing and counting the refused call (MCP answers it with a JSON-RPC
        -32602 error, not a result; mcp/requests.py's `refused` builds that)."""
        try:
            self.get(name, selection)
        except DiagdError as exc:
            if "group" in exc.details:
                details = {"group": exc.details["group"], "selected": exc.details.get("selected", [])}
            else:
                details = {"did_you_mean": exc.details.get("did_you_mean", [])}
            self.record_refusal(name, arguments, client, str(exc.code), jsonrpc_code=-32602, **details)
            raise

    def record_refusal(self, name: str, arguments: Any, client: str, code: str, **details: Any) -> None:
        """A call refused before it began (a tool this client cannot call, which MCP answers with a
        JSON-RPC error, not a result): audited and counted all the same, its start and its end, with
        `details` (the JSON-RPC code, did_you_mean) in the final record. The name as asked, cut at
        the 128 characters the MCP spec gives a tool name."""
        shown = name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS] + f"...(+{len(name) - MAX_NAME_CHARS})"
        record = CallRecord(ts=time.time(), client=client, tool=shown, arguments=_shown(arguments), duration_ms=0.0,
                            queue_ms=0.0, outcome="started", code=None, bytes=0, truncated=False,
                            call_id=self._next_call_id())
        self._observe(record)
        self._observe(dataclasses.replace(record, ts=time.time(), outcome="error", code=code, details=details))

    def _next_call_id(self) -> str:
        return f"{self._call_prefix}-{next(self._call_ids)}"

    def _observe(self, record: CallRecord) -> None:
        for observe in self.observers:
            try:
                observe(record)
            except Exception:  # a full disk must not fail the call it records
                log.exception("call observer failed", observer=getattr(observe, "__qualname__", repr(observe)))


AUDIT_MAX_CHARS = 1024
MAX_NAME_CHARS = 128  # a tool name, as the MCP spec bounds it (a refused call's name is the client's)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_unknown_names(schema: dict[str, Any], value: Any, path: str, tool: str) -> None:
    """Every key of a closed object (`additionalProperties: false`) must be one of its properties, at
    any depth: INVALID_ARGUMENT naming the unknown key and the close property names (did you mean)."""
    props = schema.get("properties")
    if isinstance(value, dict) and isinstance(props, dict):
        if schema.get("additionalProperties") is False:
            for key in value:
                if key not in props:
                    _unknown_name(key, list(props), [p for p in props if p not in value], path, tool)
        for key, item in value.items():
            if isinstance(props.get(key), dict):
                _refuse_unknown_names(props[key], item, f"{path}.{key}", tool)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _refuse_unknown_names(schema["items"], item, f"{path}[{i}]", tool)


def _unknown_name(key: str, names: list[str], unused: list[str], path: str, tool: str) -> None:
    """Refuse `key`, suggesting the names not given yet that are close to it (else listing them all)."""
    close = difflib.get_close_matches(key, unused, n=3, cutoff=0.6)
    if not close:  # a prefix or a part of a name: `frame` for `frame_numbers`
        close = [n for n in unused if key and (key.lower() in n.lower() or n.lower() in key.lower())][:3]
    hint = f"did you mean {' or '.join(map(repr, close))}?" if close else f"arguments: {', '.join(names)}"
    where = "" if path == "$" else f"{path}: "
    shown = key if len(key) <= 100 else key[:100] + "…"  # the key is the caller's: any size
    # What it takes, in full, as a hint (an argument it took once, like out_path, has no close match).
    takes = f"{tool if path == '$' else path} takes {', '.join(sorted(names)) or 'no arguments'}"
    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{where}unknown argument {shown!r} ({hint})",
                     path=f"{path}.{shown}", did_you_mean=close, hint=takes)


def _refuse_unsafe_text(arguments: dict[str, Any]) -> None:
    """No string argument of any tool may hold a NUL or a lone surrogate.

    No back end takes them (argv, C strings, file paths and ptys end at NUL; a surrogate is not
    Unicode and fails on encoding), and a handler meeting one failed with INTERNAL_ERROR. Checked
    here, once, before any handler runs, naming the argument like a schema error does.
    """
    stack: list[tuple[str, Any]] = [("$", arguments)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            what = _unsafe(value)
            if what:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: {what}", path=path)
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                if not isinstance(key, str):
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: key {key!r} is not a string", path=path)
                if _unsafe(key):
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: key {key!r}: {_unsafe(key)}", path=path)
                stack.append((f"{path}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))


INT_LIMIT = 2**63  # what every back end (msgpack and the programs back ends drive) can hold


def _refuse_unusable_numbers(arguments: dict[str, Any]) -> None:
    """No number argument may be NaN, an infinity, or an integer beyond 64 bits.

    JSON Schema lets them through (`1e308` is an integer to it, NaN passes any `minimum`); handlers
    then failed on indexing, encoding or comparison, and NaN made the audit log invalid JSON.
    """
    stack: list[tuple[str, Any]] = [("$", arguments)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: {value!r} is not a finite number", path=path)
        if isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT <= value < INT_LIMIT:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: integer out of range (at most 2**63 - 1)",
                             path=path)
        if isinstance(value, dict):
            stack.extend((f"{path}.{key}", item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))


def _unsafe(text: str) -> str | None:
    if "\x00" in text:
        return f"contains a NUL byte (\\u0000) at offset {text.index(chr(0))}; no back end accepts one"
    if not text.isascii() and (m := _SURROGATE.search(text)):
        return f"contains a lone surrogate (\\u{ord(m.group()):04x}) at offset {m.start()}; it is not Unicode text"
    return None


def _shown(arguments: Any) -> dict[str, Any]:
    """A call's arguments as its audit records keep them."""
    return _abridge(arguments) if isinstance(arguments, dict) else {"_raw": repr(arguments)[:200]}


def _abridge(value: Any) -> Any:
    """Arguments as the audit log keeps them: long strings (scripts, payloads) cut with their size."""
    if isinstance(value, str) and len(value) > AUDIT_MAX_CHARS:
        return value[:AUDIT_MAX_CHARS] + f"...(+{len(value) - AUDIT_MAX_CHARS} chars)"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # JSON has no NaN/Infinity: the audit log and diagd_calls stay strict JSON
    if isinstance(value, bytes | bytearray):  # msgpack on the control socket carries what JSON cannot
        return repr(bytes(value[:AUDIT_MAX_CHARS]))
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _abridge(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        shown = [_abridge(v) for v in value[:100]]
        return [*shown, f"...(+{len(value) - 100} items)"] if len(value) > 100 else shown
    return value


def compact(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str)


def _success(payload: Mapping[str, Any]) -> CallResult:
    return CallResult(is_error=False, payload=dict(payload), text=compact(payload))


def _failure(error: DiagdError) -> CallResult:
    wire = error.to_wire()
    return CallResult(is_error=True, payload=wire, text=compact(wire))


def coerce(schema: dict[str, Any], value: Any, *, numbers_as_text: bool = False) -> Any:
    """Accept numbers and booleans sent as strings where the schema wants them.

    Agents often send `"limit": "50"`; refusing that wastes a round trip for no safety gain. The other
    way round only for `numbers_as_text` (a command line, where `payload=12` parses as a number but
    means the text typed): from an agent, `"pcap_path": 5` is a mistake its schema refuses.
    """
    types = schema.get("type")
    wanted = set(types) if isinstance(types, list) else {types} if types else set()
    if "integer" in wanted and isinstance(value, float) and value.is_integer():
        return int(value)  # 5.0 is an integer to JSON Schema; handlers index and slice with it
    if isinstance(value, str):
        text = value.strip()
        if "integer" in wanted and "string" not in wanted:
            try:
                return int(text)
            except ValueError:
                pass
        if "number" in wanted and "string" not in wanted:
            try:
                return float(text) if any(c in text for c in ".eE") else int(text)
            except ValueError:
                pass
        if "boolean" in wanted and "string" not in wanted and text.lower() in ("true", "false"):
            return text.lower() == "true"
        return value
    if numbers_as_text and wanted == {"string"} and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # `diagd call payload=12` parses 12 as JSON; the schema wants the text
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: coerce(props[k], v, numbers_as_text=numbers_as_text) if k in props else v
                for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [coerce(schema["items"], v, numbers_as_text=numbers_as_text) for v in value]
    return value
