"""The daemon's own tools: status, recent calls, stopping actors, reloading config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diagd.daemon.tools import CallContext, ToolSpec

if TYPE_CHECKING:
    from diagd.daemon.server import Daemon

_STATUS_OUTPUT = {
    "type": "object",
    "properties": {
        "daemon": {"type": "object"},
        "actors": {"type": "array", "items": {"type": "object"}},
        "tools": {"type": "object"},
    },
    "required": ["daemon", "actors", "tools"],
}

_CALLS_OUTPUT = {
    "type": "object",
    "properties": {
        "calls": {"type": "array", "items": {"type": "object"}},
        "returned": {"type": "integer"},
        "total_calls": {"type": "integer"},
    },
    "required": ["calls", "returned", "total_calls"],
}


def register(daemon: Daemon) -> None:
    async def status(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return daemon.status()

    async def calls(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        # Running calls count as the newest: a call that hangs is at the top, with its time so far.
        records = [*daemon.stats.recent, *daemon.stats.running()]
        if tool := args.get("tool"):
            records = [r for r in records if r.tool == tool]
        if args.get("errors_only"):
            records = [r for r in records if r.outcome not in ("ok", "running")]
        limit = args.get("limit", 20)
        chosen = records[-limit:][::-1]  # newest first
        return {"calls": [r.to_json() for r in chosen], "returned": len(chosen),
                "total_calls": daemon.stats.total}

    async def stop_actor(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        ref = daemon.supervisor.stop(args["actor_id"], reason=f"stopped by {ctx.client}")
        return {"stopped": ref.id, "kind": ref.kind, "resource": ref.resource}

    async def reload(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return daemon.reload()

    registry = daemon.registry
    registry.register(ToolSpec(
        name="diagd_status",
        title="diagd status",
        description="The daemon (uptime, pid, sockets, clients), every actor (kind, resource, state, inbox "
                    "depth, idle time left, restarts) and per-tool call statistics (count, p50/p95, failure rate).",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        output_schema=_STATUS_OUTPUT,
        handler=status,
    ))
    registry.register(ToolSpec(
        name="diagd_calls",
        title="Recent tool calls",
        description="Recent tool calls, newest first: time, client, tool, arguments, duration, queue wait, "
                    "outcome (ok, error, cancelled, or running with its time so far) and error code, result bytes.",
        input_schema={
            "type": "object",
            "properties": {
                "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 20},
                "tool": {"type": "string", "description": "only calls of this tool"},
                "errors_only": {"type": "boolean", "default": False},
            },
            "additionalProperties": False,
        },
        output_schema=_CALLS_OUTPUT,
        handler=calls,
    ))
    registry.register(ToolSpec(
        name="diagd_stop_actor",
        title="Stop an actor",
        description="Stop one actor by id (see diagd_status): its resource is released; the next call that "
                    "needs it starts a fresh one.",
        input_schema={"type": "object", "properties": {"actor_id": {"type": "string"}},
                      "required": ["actor_id"], "additionalProperties": False},
        handler=stop_actor, read_only=False, destructive=True, idempotent=False,
    ))
    registry.register(ToolSpec(
        name="diagd_reload",
        title="Reload configuration",
        description="Re-read the config file; new limits apply to new calls and new actors, and idle "
                    "timeouts to running actors too.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        handler=reload, read_only=False, idempotent=True,
    ))
