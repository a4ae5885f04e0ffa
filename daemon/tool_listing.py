"""What `tools/list` says about a tool, kept small: every client reads the whole list on every request.

Input schemas go out as declared (they are what the daemon validates, constraints and defaults
included). The rest is cut to what a client uses:
- `outputSchema` names the keys every result has (`required`); their types, the optional keys and
  nested shapes stay in the declared schema (what the tests check results against), as the result
  itself shows them. Dropping keywords only widens a schema, so a result valid for the declared
  one is valid for this one: the SDK client, which checks `structuredContent` against it, accepts
  every answer it accepted before. (Types for the required keys alone cost ~4 KB over all tools.)
- annotations say only what a client acts on: `readOnlyHint`, and for tools that change something
  `destructiveHint` / `idempotentHint` (the spec gives them no meaning on a read-only tool). No
  `openWorldHint` (hints are advisory and clients do not act on it); the title is said once, on the tool.
"""

from __future__ import annotations

from typing import Any


def output_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The declared result schema cut to the keys every result has."""
    if schema is None:
        return None
    wire: dict[str, Any] = {"type": schema.get("type", "object")}
    if schema.get("required"):
        wire["required"] = list(schema["required"])
    return wire


def hints(*, read_only: bool, destructive: bool, idempotent: bool) -> dict[str, bool]:
    """The tool's hints, without the ones that restate MCP's defaults or mean nothing for it."""
    hints = {"readOnlyHint": read_only}
    if not read_only:
        hints |= {"destructiveHint": destructive, "idempotentHint": idempotent}
    return hints
