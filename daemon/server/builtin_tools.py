"""The daemon's own tools: status, recent calls, stopping actors, reloading config."""

from __future__ import annotations

import copy
import textwrap
from dataclasses import replace
from typing import Any

from diagd.actors.tooling import CallContext, ToolSet, paging
from diagd.daemon.server import timeline as timeline_mod
from diagd.daemon.server.audit import CallRecord
from diagd.daemon.server.replies import CallInfo, CallsReply, ReloadReply, StatusReply, StopActorReply, TimelineReply
from diagd.daemon.server.services import Services
from diagd.daemon.server.tools import current_selection
from diagd.daemon.tool_groups import BUILTIN, selects
from diagd.protocol.errors import DiagdError, ErrorCode

Daemon = Services  # what the tools see of the daemon

tools: ToolSet[Daemon] = ToolSet()


@tools.tool("diagd_status", "Daemon, clients, actors (state, inbox, idle time, restarts), per-tool call stats.",
            title="diagd status")
async def status(daemon: Daemon, ctx: CallContext, args: dict[str, Any]) -> StatusReply:
    # A client sees the actors and tool statistics of its own groups only (docs/security.md).
    selection = current_selection.get()
    answer = daemon.status()
    if selection is not None:
        answer["actors"] = [a for a in answer["actors"] if selects(selection, a["group"])]
        answer["tools"] = {name: stats for name, stats in answer["tools"].items()
                           if selects(selection, daemon.registry.group_of(name))}
        answer["backends"] = {name: part for name, part in answer["backends"].items() if selects(selection, name)}
    return answer


@tools.tool("diagd_calls", "Recent calls of this client's groups, newest first (other clients' arguments "
            "redacted).",
            {"limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 20, "description": "at most"},
             "tool": {"type": "string", "description": "only this tool's"},
             "errors_only": {"type": "boolean", "default": False, "description": "only failed ones"}},
            title="Recent tool calls")
async def calls(daemon: Daemon, ctx: CallContext, args: dict[str, Any]) -> CallsReply:
    # Running calls count as the newest: a call that hangs is at the top, with its time so far.
    records = [*daemon.stats.recent, *daemon.stats.running()]
    # Only calls of the client's groups; the arguments of other clients' calls (payloads, scripts,
    # programs) only when the config says so.
    selection = current_selection.get()
    records = [r for r in records if selects(selection, daemon.registry.group_of(r.tool))]
    if tool := args.get("tool"):
        records = [r for r in records if r.tool == tool]
    if args["errors_only"]:
        records = [r for r in records if r.outcome not in ("ok", "running")]
    chosen = records[-args["limit"]:][::-1]  # newest first
    show_all = daemon.config.mcp.show_other_clients_arguments
    return {"calls": [r.to_json() if show_all or r.client == ctx.client else _redacted(r) for r in chosen],
            "returned": len(chosen), "total_calls": daemon.stats.total}


REDACTED = "<redacted: another client's argument ([mcp] show_other_clients_arguments)>"


def _redacted(record: CallRecord) -> CallInfo:
    """Another client's call: which arguments it gave, not their values."""
    return {**record.to_json(), "arguments": dict.fromkeys(record.arguments, REDACTED)}


@tools.tool("diagd_stop_actor", "Stop an actor of this client's groups, releasing its resource (not one "
            "another client owns).",
            {"actor_id": {"type": "string", "description": "from diagd_status"}}, required=("actor_id",),
            title="Stop an actor", read_only=False, destructive=True, idempotent=False)
async def stop_actor(daemon: Daemon, ctx: CallContext, args: dict[str, Any]) -> StopActorReply:
    # Only an actor of the client's groups, and only as the back end's own tools would let this client
    # (a resource another client owns, or others hold: BUSY naming them).
    selection = current_selection.get()
    mine = [ref for ref in daemon.supervisor.actors() if selects(selection, ref.group)]
    ref = next((r for r in mine if r.id == args["actor_id"]), None)
    if ref is None:
        raise DiagdError(ErrorCode.NOT_FOUND, f"no actor with id {args['actor_id']!r} among this client's tool "
                         "groups", known=[r.id for r in mine], groups=sorted(selection) if selection else None)
    if check := daemon.stop_checks.get(ref.kind):
        check(ref, ctx.client)
    daemon.supervisor.stop(ref.id, reason=f"stopped by {ctx.client}")
    return {"stopped": ref.id, "kind": ref.kind, "resource": ref.resource}


@tools.tool("diagd_reload", "Re-read the config file; says what waits for a reopen.",
            title="Reload configuration",
            read_only=False, idempotent=True)
async def reload(daemon: Daemon, ctx: CallContext, args: dict[str, Any]) -> ReloadReply:
    return daemon.reload()


# Sources, their options and the answer are in docs/timeline.md; the schema stays small (it
# is in every client's tools/list): timeline.parse_sources and parse_time check the rest, with hints.
# The sources' description names the kinds the back ends declared (`describe_sources`, once they did).
TIME = {"type": ["number", "string"], "description": "Unix s or ISO 8601"}
@tools.tool("diagd_timeline", "Merge sources' rows by wall-clock time.",
            {"sources": {"type": "array", "items": {"type": "object"},
                         "description": "{KIND: reference, offset_ms?, label?, options of its kind}"},
             "start": TIME, "end": TIME, **paging(limit=200, maximum=2000)},
            required=("sources",), timeout_s=120)
async def timeline(daemon: Daemon, ctx: CallContext, args: dict[str, Any]) -> TimelineReply:
    async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        # Through the registry, like any client's call: validation, limits, coded errors, the audit log,
        # and the client's tool groups (a source of a group it has not selected is NOT_FOUND).
        result = await daemon.registry.call(name, arguments, ctx, selection=current_selection.get())
        if result.is_error:
            wire = result.payload
            raise DiagdError.from_wire(wire["code"], wire["message"], wire.get("details"))
        return result.payload

    return await timeline_mod.build(call, daemon.declared.timeline, args["sources"], start=args.get("start"),
                                    end=args.get("end"), limit=args["limit"], offset=args["offset"])


def register(daemon: Daemon) -> None:
    for spec in tools.specs(daemon):
        daemon.registry.register(replace(spec, group=BUILTIN))


def describe_sources(daemon: Daemon) -> None:
    """Once the back ends are loaded: diagd_timeline's schema names the source kinds they declared."""
    spec = daemon.registry.get("diagd_timeline")
    schema = copy.deepcopy(spec.input_schema)
    schema["properties"]["sources"]["description"] = daemon.declared.timeline_schema_hint()
    daemon.registry.update(replace(spec, input_schema=schema))


GUIDE = ("diagd itself: diagd_status (daemon, actors, per-tool statistics), diagd_calls (recent calls with "
         "durations and outcomes), diagd_stop_actor to release a resource.")


def instructions(daemon: Daemon) -> dict[str, str]:
    """Every group's paragraph of the MCP instructions: the back ends' as they declared them, then the daemon's."""
    declared = daemon.declared
    merged = (f"{GUIDE} diagd_timeline merges {declared.timeline_summary()} by wall-clock time (a source "
              f"names its kind and reference; options of some kinds: {declared.timeline_options()}).")
    return {**daemon.declared.instructions, BUILTIN: textwrap.fill(merged, width=100) + "\n"}
