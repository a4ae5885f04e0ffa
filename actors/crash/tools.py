"""The crash MCP tools: schemas (`schemas`) and handlers that only build a message for a session actor
(`messages`) or read the back end's table and stored outputs, and shape the reply.

The analysis-script tools are a separate set: they exist only when [crash] script_dirs is set at
start (see `register`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from diagd.actors import sandbox
from diagd.actors._paths import resolve_allowed
from diagd.actors._user_regex import Matcher, compile_in_thread
from diagd.actors.crash import modules, schemas
from diagd.actors.crash.backend import CrashBackend
from diagd.actors.crash.messages import RunCrash, RunDrgn, Triage
from diagd.actors.crash.replies import (
    CloseReply,
    CommandResult,
    ListReply,
    ModuleDirReply,
    OpenReply,
    OutputPage,
    ScriptsReply,
    SearchReply,
    TriageReply,
)
from diagd.actors.crash.scripts import PYKDUMP_DIRS, find_pykdump, list_scripts
from diagd.actors.crash.sessions import SessionRecord
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.tooling import CallContext, ToolSet, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode

tools: ToolSet[CrashBackend] = ToolSet()
script_tools: ToolSet[CrashBackend] = ToolSet()  # registered only when [crash] script_dirs is set at start

# Call limits that derive from [crash] settings, by tool: `specs` binds each to the back end's current
# settings, so a reload moves a tool's limit with the limits it covers.
LIMITS: dict[str, Callable[[CrashSettings], float]] = {
    "open_vmcore_session": lambda s: s.load_timeout_s + 30,
    "run_crash_command": lambda s: s.command_timeout_s + s.interrupt_grace_s + 15,
    "run_drgn_command": lambda s: s.drgn_timeout_s + s.interrupt_grace_s + s.load_timeout_s,
    "get_crash_info": lambda s: s.command_timeout_s * 2 + s.drgn_timeout_s,
    "run_analysis_script": lambda s: s.drgn_timeout_s + s.interrupt_grace_s + s.load_timeout_s,
}


def specs(backend: CrashBackend) -> list[ToolSpec]:
    """The crash tools bound to `backend`: the script tools only when [crash] script_dirs is set now."""
    script_dirs = backend.settings.script_dirs
    bound = tools.specs(backend) + (script_tools.specs(backend) if script_dirs else [])
    out = []
    for spec in bound:
        if (seconds := LIMITS.get(spec.name)) is not None:
            spec = replace(spec, timeout_s=functools.partial(_limit, backend, seconds))
        if spec.name == "list_analysis_scripts":
            spec = replace(spec, description=f"drgn analysis scripts from {', '.join(script_dirs)} "
                                             "(name, first docstring line).")
        out.append(spec)
    return out


def _limit(backend: CrashBackend, seconds: Callable[[CrashSettings], float]) -> float:
    return seconds(backend.settings)


@tools.tool("open_vmcore_session",
            "Open (or join) a crash + drgn session on a vmcore and its vmlinux (checked to match); crash loads "
            "in ~10 s. The summary has the panic string and task.",
            input_schema=schemas.OPEN_INPUT, read_only=False, idempotent=False)
async def open_session(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> OpenReply:
    return await backend.open(ctx, args["vmcore_path"], args["vmlinux_path"], args["crash_args"])


@tools.tool("close_vmcore_session",
            "Drop your reference to a session; the last one stops crash and drgn. Stored outputs stay readable.",
            input_schema=schemas.SESSION_INPUT, read_only=False, idempotent=False,
            timeout_s=45)
async def close_session(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> CloseReply:
    return await backend.close(ctx, args.get("session_id"))


@tools.tool("list_vmcore_sessions", "Crash sessions of this daemon: id, state, references, dump, commands run.",
            input_schema=schemas.NO_INPUT)
async def list_sessions(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> ListReply:
    return backend.table.listing(ctx.client)


async def _drgn(backend: CrashBackend, ctx: CallContext, rec: SessionRecord, message: RunDrgn) -> CommandResult:
    sandbox.require_confinement("drgn code (run_drgn_command, drgn:)",
                                 allowed_unconfined=backend.settings.allow_unconfined,
                                 setting="[crash] allow_unconfined")
    return await backend.ask(ctx, rec, message)


def _pykdump(backend: CrashBackend) -> str:
    extension = find_pykdump(backend.settings.pykdump_path)
    if extension is None:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                         "pykdump is not installed (no mpykdump*.so crash extension found)",
                         searched=list(PYKDUMP_DIRS),
                         hint="Debian has no pykdump package: build it and set [crash] pykdump_path; "
                              "drgn: does the same kind of scripting")
    return extension


@tools.tool("run_crash_command",
            "Run a crash command (bt, log, kmem -i, struct, dis, set <pid>...): first lines, total_lines and a "
            "command_id to page/search.",
            input_schema=schemas.RUN_CRASH_INPUT, read_only=False, idempotent=False)
async def run_crash_command(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> CommandResult:
    rec = await backend.resolve(ctx, args.get("session_id"))
    command = args["command"].strip()
    prefix, sep, rest = command.partition(":")
    max_lines, force = args.get("max_lines"), args["force_execute"]
    extension = None
    if sep and prefix.strip() in ("crash", "drgn", "pykdump"):
        prefix, rest = prefix.strip(), rest.strip()
        if not rest:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"nothing after {prefix}:")
        if prefix == "drgn":
            return await _drgn(backend, ctx, rec, RunDrgn(rest, max_lines=max_lines))
        if prefix == "pykdump":
            extension = _pykdump(backend)
        command = rest
    return await backend.ask(ctx, rec, RunCrash(command, force, max_lines, extension))


@tools.tool("load_module_debuginfo",
            "Load modules' debug info from .ko files (crash mod -S DIR) in crash and drgn.",
            input_schema=schemas.MODULE_DIR_INPUT, read_only=False,
            idempotent=False)
async def load_module_debuginfo(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> ModuleDirReply:
    rec = await backend.resolve(ctx, args.get("session_id"))
    # Through the allowed-dirs policy, like the dump's paths; crash reads the words of its command line
    # itself, so the path must be one plain word.
    path = await trio.to_thread.run_sync(functools.partial(
        resolve_allowed, args["dir"], backend.settings.allowed_dirs, what="directory", cwd=ctx.cwd, directory=True,
        private_dirs=backend.runtime.config().private_dirs))
    if not modules.PLAIN_PATH.fullmatch(str(path)):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}: spaces and shell characters cannot reach crash's "
                         "command line; link the directory under a plain name", path=str(path))
    found = await trio.to_thread.run_sync(modules.find, path)
    files = found.files
    if not files:
        raise DiagdError(ErrorCode.NOT_FOUND, f"no .ko file under {path}" + "".join(f"; {n}" for n in found.notes()),
                         path=str(path), left_out=found.skipped)
    # What `mod -S DIR` does, one module at a time: crash's -S searches with `find` through a shell,
    # which its sandbox may not execute. A file of a module the dump did not load is said so by crash.
    crash = []
    for file in files:
        name = Path(file).name.split(".ko")[0].replace("-", "_")
        crash.append(await backend.ask(ctx, rec, RunCrash(f"mod -s {name} {file}", True, None, None)))
    drgn: dict[str, Any]
    try:
        code = f"prog.load_debug_info({files!r})\nprint(len({files!r}), 'files offered')"
        drgn = dict(await _drgn(backend, ctx, rec, RunDrgn(code, max_lines=20)))
    except DiagdError as exc:  # crash has them; drgn's failure is said, not hidden
        drgn = {"error": exc.to_wire()}
    answer: ModuleDirReply = {"session_id": rec.session_id, "dir": str(path), "drgn": drgn, "files": files,
                              "modules": [c["output"] for c in crash]}
    if found.skipped:
        answer["left_out"] = found.notes()
    return answer


@tools.tool("run_drgn_command",
            "Run Python in the session's drgn worker: `prog` and drgn's helpers are there, variables persist, "
            "a final expression is shown.",
            input_schema=schemas.RUN_DRGN_INPUT, read_only=False, idempotent=False)
async def run_drgn_command(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> CommandResult:
    rec = await backend.resolve(ctx, args.get("session_id"))
    return await _drgn(backend, ctx, rec, RunDrgn(args["code"], max_lines=args.get("max_lines")))


@tools.tool("get_command_output",
            "A page of lines of a stored command output (also after the session closed).",
            input_schema=schemas.GET_OUTPUT_INPUT)
async def get_output(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> OutputPage:
    # The store is read-only here and safe from any task: outputs are complete files once listed.
    return await trio.to_thread.run_sync(backend.store.page, args["command_id"], args["offset"], args["limit"])


@tools.tool("search_command_output",
            "Regex search in a stored command output; matches with line_number and context.",
            input_schema=schemas.SEARCH_INPUT)
async def search_output(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> SearchReply:
    pattern = await compile_in_thread(args["query"], case_sensitive=args["case_sensitive"])
    matcher = Matcher(pattern, backend.runtime.config().regex_budget_s, unit="line")
    return await matcher.run(functools.partial(
        backend.store.search, args["command_id"], matcher, context_lines=args["context_lines"],
        max_matches=args["max_matches"]))


@tools.tool("get_crash_info",
            "Triage in one call: panic string, the panic task's backtrace, log tail, kmem -i, tasks.",
            input_schema=schemas.SESSION_INPUT)
async def crash_info(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> TriageReply:
    rec = await backend.resolve(ctx, args.get("session_id"))
    return await backend.ask(ctx, rec, Triage())


@script_tools.tool("list_analysis_scripts", "drgn analysis scripts from [crash] script_dirs (name, first docstring "
                   "line).", input_schema=schemas.NO_INPUT)
async def list_analysis(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> ScriptsReply:
    scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
    return {"scripts": list(scripts.values()), "dirs": list(backend.settings.script_dirs)}


@script_tools.tool("run_analysis_script",
                   "Run one listed drgn analysis script in the session (fresh namespace with prog and the helpers, "
                   "__name__ == '__main__'); output stored like run_drgn_command.",
                   input_schema=schemas.RUN_SCRIPT_INPUT, read_only=False,
                   idempotent=False)
async def run_analysis(backend: CrashBackend, ctx: CallContext, args: dict[str, Any]) -> CommandResult:
    scripts = await trio.to_thread.run_sync(list_scripts, backend.settings.script_dirs)
    script = scripts.get(args["name"])
    if script is None:
        raise DiagdError(ErrorCode.NOT_FOUND, f"no analysis script {args['name']!r}", known=sorted(scripts))
    source = await trio.to_thread.run_sync(Path(script["path"]).read_text)
    rec = await backend.resolve(ctx, args.get("session_id"))
    return await backend.ask(ctx, rec, RunDrgn(
        source, filename=script["path"], isolated=True, max_lines=args.get("max_lines"),
        label=f"[script] {args['name']}"))
