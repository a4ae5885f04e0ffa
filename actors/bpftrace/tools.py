"""The bpftrace MCP tools: list_probes, list_helpers, exec_program, get_result, stop_execution,
list_executions. Handlers check arguments, start an execution's actor or ask it (`messages`), and shape
the reply; waiting for output reads the run's single-writer `Execution` (see `BpftraceBackend.running`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from diagd.actors import system
from diagd.actors.bpftrace.actor import KIND, STOP_WAIT_MAX_S, BpftraceExecution
from diagd.actors.bpftrace.backend import BpftraceBackend
from diagd.actors.bpftrace.execution import Execution
from diagd.actors.bpftrace.messages import Page, Stop
from diagd.actors.bpftrace.parse import tracefs_error, tracefs_fix
from diagd.actors.bpftrace.probes import match_listing, normalize_filter, tracepoint_args
from diagd.actors.bpftrace.replies import (
    ExecReply,
    ExecutionsReply,
    HelpersReply,
    PageReply,
    ProbesReply,
    StopReply,
    Summary,
)
from diagd.actors.bpftrace.schemas import EXECUTION_ID_ARG
from diagd.actors.bpftrace.settings import (
    MAX_KILL_WAIT_S,
    MAX_SIGINT_GRACE_S,
    check_privileges,
    check_program,
    check_reload,
)
from diagd.actors.bpftrace.status import Status
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSet, paging
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[BpftraceBackend] = ToolSet()


@tools.tool(
    "list_probes", title="List bpftrace probes",
    description="Probes bpftrace can attach to.",
    props={
        "filter": {"type": "string", "maxLength": 512,
                   "description": "'tracepoint:sched:*' (bpftrace -l) or a substring ('openat')"},
        **paging(limit=200, maximum=5000),
        "with_args": {"type": "boolean", "default": False, "description": "add tracepoint fields"},
    },
    timeout_s=60,
)
async def list_probes(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> ProbesReply:
    settings = backend.settings()
    check_privileges(settings)
    pattern, shown = normalize_filter(args.get("filter") or "")
    tracefs = system.tracefs_dir() is not None
    if not tracefs and pattern is not None and pattern.startswith("tracepoint:"):
        raise tracefs_error("no tracepoint can be listed or attached", filter=shown)
    if pattern is not None:
        probes, warnings = await backend.listing(settings, pattern)
    else:
        everything, warnings = await backend.listing(settings, "")
        probes = match_listing(everything, shown)
    if not tracefs:
        if not probes and shown:
            raise tracefs_error(f"nothing matches {shown!r} (tracepoints cannot be listed)", filter=shown)
        warnings = [f"tracefs is not mounted: tracepoints are missing from this list; fix as root: "
                    f"{tracefs_fix()}", *warnings]
    offset, limit = args["offset"], args["limit"]
    chosen = probes[offset:offset + limit]
    result: ProbesReply = {
        "probes": chosen, "total": len(probes), "offset": offset, "returned": len(chosen),
        "has_more": offset + len(chosen) < len(probes), "next_offset": min(offset + len(chosen), len(probes)),
        "filter": shown or None, "tracefs_mounted": tracefs, "warnings": warnings,
    }
    if args["with_args"]:
        found = await trio.to_thread.run_sync(lambda: {p: tracepoint_args(p) for p in chosen})
        result["args"] = {p: a for p, a in found.items() if a is not None}
    return result


@tools.tool(
    "list_helpers", title="List bpftrace builtins and functions",
    description="Builtins, map functions and functions of the installed bpftrace, with signatures.",
    props={
        "kind": {"type": "string", "enum": ["builtin", "map_function", "function"], "description": "only these"},
        "name": {"type": "string", "description": "substring"},
    },
    timeout_s=60,
)
async def list_helpers(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> HelpersReply:
    found = await backend.helpers(backend.settings())
    helpers = found["helpers"]
    if kind := args.get("kind"):
        helpers = [h for h in helpers if h["kind"] == kind]
    if name := args.get("name"):
        helpers = [h for h in helpers if name.lower() in h["name"].lower()]
    return {**found, "helpers": helpers, "total": len(helpers)}


@tools.tool(
    "exec_program", title="Run a bpftrace program",
    description="Start a program; returns its execution_id once its probes attach (wait_s: and its first "
                "output). A rejected program fails at once with line/column.",
    props={
        "program": {"type": "string", "minLength": 1, "maxLength": 65536, "description": "bpftrace source"},
        "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600,
                    "description": "s to trace, then SIGINT: END runs, status completed "
                                   "(duration_reached); default [bpftrace] default_timeout_s"},
        "output_format": {"type": "string", "enum": ["text", "json"], "default": "text",
                          "description": "json: maps as data"},
        "wait_s": {"type": "number", "minimum": 0, "maximum": 30, "default": 0,
                   "description": "wait for the first output, return its page (first_page)"},
    },
    required=("program",), read_only=False, idempotent=False, timeout_s=60,
)
async def exec_program(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> ExecReply:
    settings = backend.settings()
    program = args["program"]
    if not program.strip():
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "the program is empty")
    # No schema default: it comes from the config, which a reload may change.
    timeout = float(args.get("timeout", settings.default_timeout_s))
    if timeout > settings.max_run_s:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"timeout {timeout:g} s exceeds [bpftrace] max_run_s = "
                         f"{settings.max_run_s:g}", max_run_s=settings.max_run_s)
    output_format = args["output_format"]
    check_program(settings, program)
    check_privileges(settings)
    slot = backend.reserve(settings)
    actor = None
    try:
        ex = Execution(id=backend.new_id(), program=program, output_format=output_format, timeout_s=timeout,
                       max_lines=settings.max_lines, max_bytes=settings.max_output_bytes)
        argv = settings.run_command(program, output_format, timeout)
        actor = BpftraceExecution(ex, backend, settings, argv, slot)
        await actor.spawn()  # now: its sandbox steps overlap the actor's start
        # The actor must not idle out while bpftrace runs: its idle timeout covers the whole run and
        # the longest stop; once finished it retires itself after linger_s.
        idle_s = timeout + MAX_SIGINT_GRACE_S + MAX_KILL_WAIT_S + settings.linger_s + 10
        await backend.runtime.start(KIND, ex.id, lambda: actor, idle_timeout_s=idle_s)
    except BaseException:
        if actor is not None:
            with trio.CancelScope(shield=True):
                await actor.discard()
        slot.release()
        raise
    # With wait_s, the first output in the same answer: one call, not exec_program then get_result.
    first: PageReply | None = None
    if args["wait_s"] > 0:
        if (running := backend.running(ex.id)) is not None:
            await backend.wait(ctx, running, 0, "output", args["wait_s"])
        first = await _page(backend, ctx, ex.id, 0, FIRST_PAGE_LINES, times=False)
    # `ex` is read once the actor's start() has returned: the attach (or the refusal) is decided.
    reply: ExecReply = {
        "execution_id": ex.id, "status": ex.status, "attached_probes": ex.attached_probes, "timeout_s": timeout,
        "output_format": output_format, "pid": ex.pid, "lines_total": len(ex.lines),
        "hint": "page the output with get_result (wait_s waits for output or the end); stop_execution "
                "stops it gracefully"}
    if first is not None:
        reply["first_page"] = first
    return reply


FIRST_PAGE_LINES = 100  # exec_program's first_page


async def _page(backend: BpftraceBackend, ctx: CallContext, execution_id: str, offset: int, limit: int, *,
                times: bool) -> PageReply:
    """A page of the execution's output: from its actor while it runs or lingers, else from its store."""
    page = await backend.ask(ctx, execution_id, Page(offset, limit, times))
    if page is None:
        return (await backend.load(execution_id)).page(offset, limit, times=times)
    return page


@tools.tool(
    "get_result", title="Page through a bpftrace execution's output",
    description="Status and output lines of an execution (json runs: maps too).",
    props={
        "execution_id": EXECUTION_ID_ARG,
        **paging(limit=1000, maximum=10000),
        "wait_s": {"type": "number", "minimum": 0, "maximum": 120, "default": 0, "description": "wait for until"},
        "until": {"type": "string", "enum": ["output", "done"], "default": "output",
                  "description": "output past offset, or the end"},
        "times": {"type": "boolean", "default": False, "description": "each line's arrival (line_ts)"},
    },
    required=("execution_id",), timeout_s=130,
)
async def get_result(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> PageReply:
    execution_id = args["execution_id"]
    offset, limit = args["offset"], args["limit"]
    running = backend.running(execution_id)
    if running is not None and args["wait_s"] > 0:
        await backend.wait(ctx, running, offset, args["until"], args["wait_s"])
    return await _page(backend, ctx, execution_id, offset, limit, times=args["times"])


@tools.tool(
    "stop_execution", title="Stop a bpftrace execution",
    description="Stop a running execution (SIGINT: END runs; SIGKILL if it hangs). Output is kept.",
    props={"execution_id": EXECUTION_ID_ARG},
    required=("execution_id",), read_only=False, idempotent=True,
    timeout_s=STOP_WAIT_MAX_S + 10,
)
async def stop_execution(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> StopReply:
    execution_id = args["execution_id"]
    running = backend.running(execution_id)
    if running is None or running.finished:
        ex = await backend.execution(execution_id)
        return {**ex.summary(), "already_finished": True}
    await backend.ask(ctx, execution_id, Stop())
    with trio.move_on_after(STOP_WAIT_MAX_S):
        while not running.finished:
            await running.wait_changed()
    return {**running.summary(), "already_finished": False}


@tools.tool(
    "list_executions", title="List bpftrace executions",
    description="Executions newest first, with status and line count; how many run now.",
    props={
        "status": {"type": "string", "enum": [str(s) for s in Status], "description": "only these"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50, "description": "at most"},
    },
)
async def list_executions(backend: BpftraceBackend, ctx: CallContext, args: dict[str, Any]) -> ExecutionsReply:
    settings = backend.settings()
    metas = await trio.to_thread.run_sync(backend.store.metas) if backend.store.root.exists() else []
    rows: dict[str, Summary] = {}
    for meta in metas:
        with contextlib.suppress(KeyError, ValueError, TypeError):
            row = Execution.from_meta(meta, []).summary()
            row["lines_total"] = meta["lines_total"]  # the lines are not loaded: the record counts them
            rows[meta["id"]] = row
    live = backend.live_executions()
    for ex in live:
        rows[ex.id] = ex.summary()
    ordered = sorted(rows.values(), key=lambda r: r.get("created_at") or "", reverse=True)
    if status := args.get("status"):
        ordered = [r for r in ordered if r["status"] == status]
    running = sum(1 for ex in live if not ex.finished)
    return {"executions": ordered[:args["limit"]], "total": len(ordered), "running": running,
            "max_concurrent": settings.max_concurrent}


def register(runtime: Runtime) -> BpftraceBackend:
    """Register the six tools; returns the back end (the daemon ignores it, tests use it)."""
    backend = BpftraceBackend(runtime)
    runtime.on_reload(check_reload)  # a broken [bpftrace] table is refused at start and by `diagd reload`
    backend.recover()
    tools.register(runtime, backend)
    return backend
