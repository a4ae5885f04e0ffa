"""What `tools/list` says about a tool, and what of it reaches the model.

Hosts give a model each tool's name, description and input schema (`MODEL_FACING`), and keep the
rest (`outputSchema`, annotations, the title) to themselves: those model-facing bytes are read on
every turn, and they are the ones kept small (`model_facing_bytes`; the budgets in
tests/e2e/test_tool_groups.py and bench/tools_list.py).

Input schemas go out as declared (they are what the daemon validates: types, constraints, every
property's description), less what only restates how any client reads them:
- `additionalProperties: false`: every tool's arguments (and objects in them) are closed, and the
  daemon refuses an unknown name itself, before any other check, naming the close ones ("did you
  mean");
- a default that is its type's empty value (`false`, `""`, `[]`, `0`): an absent optional argument
  means that already. Defaults that say something (`true`, `limit: 500`) stay;
- a `maximum` of 2**32 - 1 or more: a storage width (pcapng frame numbers are 32-bit), no bound a
  caller meets in practice; the daemon still refuses a value past it, with a coded error.
Together ~1.3 KB of the full list, which pays for a description on every property.
`outputSchema` is the whole schema generated from the tool's reply model (`diagd tools NAME
--output` prints the same): hosts validate `structuredContent` with it, and no model reads it.
Generating them all takes ~0.3 s, so the daemon does it once, in a worker thread, before its first
MCP client's requests (`warm`).
Annotations say only what a client acts on: `readOnlyHint`, and for tools that change something
`destructiveHint` / `idempotentHint` (the spec gives them no meaning on a read-only tool). No
`openWorldHint` (hints are advisory and clients do not act on it); the title is said once, on the tool.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from diagd.actors.tooling import ToolSpec

if TYPE_CHECKING:
    from diagd.daemon.server.services import Services


def input_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The declared input schema as tools/list gives it (validation uses the declared one)."""
    wire = {k: v for k, v in schema.items() if not (k == "additionalProperties" and v is False)}
    if isinstance(schema.get("properties"), dict):
        wire["properties"] = {name: _property(prop) for name, prop in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        wire["items"] = _property(schema["items"])
    return wire


def _property(prop: Any) -> Any:
    if not isinstance(prop, dict):
        return prop
    return input_schema({k: v for k, v in prop.items()
                         if not (k == "default" and _empty(v)) and not (k == "maximum" and _width(v))})


def _width(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 2**32 - 1


def _empty(value: Any) -> bool:
    """`value` is its JSON type's empty value (not null: a null default says something)."""
    return value is False or (value == 0 and not isinstance(value, bool)) or value in ("", [], {})


def output_schema(spec: ToolSpec) -> dict[str, Any] | None:
    """The tool's whole result schema, generated from its reply model (cached: see `warm`)."""
    return spec.output_schema


def warm(specs: Iterable[ToolSpec]) -> None:
    """Generate the tools' output schemas now (each is cached), so no tools/list pays for it."""
    for spec in specs:
        _ = spec.output_schema


MODEL_FACING = ("name", "description", "inputSchema")  # what hosts send the model of each listed tool


def model_facing_bytes(tools: Sequence[Mapping[str, Any]]) -> int:
    """The model-facing bytes of a tools/list result's tools (as on the wire, camelCase): a
    `{"tools": [...]}` of each tool's `MODEL_FACING` keys, compact JSON, UTF-8."""
    return json_bytes({"tools": [{k: t[k] for k in MODEL_FACING if k in t} for t in tools]})


def json_bytes(value: Any) -> int:
    """Bytes of `value` as compact JSON in UTF-8 (how the daemon writes a result: the whole tools/list's size)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def hints(*, read_only: bool, destructive: bool, idempotent: bool) -> dict[str, bool]:
    """The tool's hints, without the ones that restate MCP's defaults or mean nothing for it."""
    hints = {"readOnlyHint": read_only}
    if not read_only:
        hints |= {"destructiveHint": destructive, "idempotentHint": idempotent}
    return hints


def catalogue(daemon: Services) -> dict[str, Any]:
    """What `diagd tools` shows: the running daemon's answer to the control request, and the same built
    without a daemon (server.offline_catalogue), one code path. The groups served, `[mcp] tools`, every
    tool with its input schema as tools/list gives it and its whole output schema (the fuzz tests check
    results), and the back ends that serve nothing under this config, as they declared it
    (`Runtime.declare_off`): {group: {"reason", "hint"}}."""
    configured = daemon.configured_tools()
    return {"groups": daemon.registry.groups(), "configured": sorted(configured) if configured else None,
            "tools": [{"name": s.name, "group": s.group, "title": s.title, "description": s.description,
                       "input_schema": input_schema(s.input_schema), "output_schema": s.output_schema}
                      for s in daemon.registry.specs()],
            "off": {group: dict(why) for group, why in daemon.declared.off.items()}}
