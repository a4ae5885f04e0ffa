"""What `tools/list` says about a tool, kept small: every client reads the whole list on every request.

Input schemas go out as declared (they are what the daemon validates, constraints and defaults
included). The rest is cut to what a client uses:
- `outputSchema` names the keys every result has, with their JSON types; optional keys and nested
  shapes stay in the declared schema (`diagd tools --json`, the tests). Dropping keywords only
  widens a schema, so a result valid for the declared one is valid for this one: the SDK client,
  which checks `structuredContent` against it, accepts every answer it accepted before.
- annotations say only what differs from MCP's defaults or matters: `readOnlyHint`, and for tools
  that change something `destructiveHint` / `idempotentHint` (the spec gives them no meaning on a
  read-only tool); `openWorldHint: false` (the default is true). The title is said once, on the tool.
"""

from __future__ import annotations

from typing import Any


def output_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The declared result schema cut to its required keys, each with its type only."""
    if schema is None:
        return None
    required = [key for key in schema.get("required", ())]
    props = schema.get("properties", {})
    wire: dict[str, Any] = {"type": schema.get("type", "object")}
    if required:
        wire["properties"] = {key: _type_only(props.get(key, {})) for key in required}
        wire["required"] = required
    return wire


def _type_only(schema: Any) -> dict[str, Any]:
    if isinstance(schema, dict) and "type" in schema:
        return {"type": schema["type"]}
    if isinstance(schema, dict) and "enum" in schema:
        return {"enum": schema["enum"]}
    return {}


def annotations(*, read_only: bool, destructive: bool, idempotent: bool) -> dict[str, bool]:
    """The tool's hints, without the ones that restate MCP's defaults or mean nothing for it."""
    hints = {"readOnlyHint": read_only, "openWorldHint": False}
    if not read_only:
        hints |= {"destructiveHint": destructive, "idempotentHint": idempotent}
    return hints
