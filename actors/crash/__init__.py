"""The crash back end: kernel crash-dump sessions with crash (pexpect) and drgn (a worker process).

`backend` holds the session table and starts session actors (`actor`, one per dump session, with
`commands`); `tools` declares the MCP tools, which talk to the actors through `messages`. Helpers:
`pty` (crash on a pseudo-terminal), `drgn` and `drgn_worker` (the worker process and its `proto`),
`identity` (what makes two dumps the same), `store`/`output` (stored outputs), `text`/`gdb` (parsing
crash's output, refusing escapes), `report`, `scripts`, `sessions`, `settings`, `schemas`.
"""

from __future__ import annotations

from diagd.actors.crash import timeline_source, tools
from diagd.actors.crash.backend import CrashBackend
from diagd.actors.crash.messages import KIND
from diagd.actors.runtime import Runtime
from diagd.actors.system import Needs, Tool, check_crash_version

# What `diagd setup crash` installs and `diagd doctor` checks (drgn and pexpect come with diagd).
# bubblewrap builds the namespaces crash and drgn run in (`sandbox.namespaces`).
SYSTEM_NEEDS = Needs(tools=(Tool("crash", ("--version",), "crash"), Tool("bwrap", ("--version",), "bubblewrap")),
                     modules=("pexpect", "drgn"),
                     checks=(check_crash_version,))


INSTRUCTIONS = """\
kernel crash dump (vmcore + vmlinux): open_vmcore_session (checks they match; drgn answers within
about a second while crash loads), then get_crash_info for triage (panic string, panic task bt, log
tail, memory, tasks). Dig with run_crash_command (bt, log, kmem, struct, dis, set <pid>) or
run_drgn_command (Python with `prog` and drgn helpers; sees every task); long outputs are stored:
page them with get_command_output and grep with search_command_output. load_module_debuginfo DIR
for modules' symbols. close_vmcore_session when done.
"""


def register(runtime: Runtime) -> CrashBackend:
    backend = CrashBackend(runtime)
    runtime.set_instructions(INSTRUCTIONS)
    runtime.add_timeline_source(timeline_source.SOURCE)
    runtime.on_client(gone=backend.client_gone)
    runtime.on_reload(backend.reload_notes)  # its deferred settings depend on the sessions open: a hook
    runtime.on_stop_request(KIND, backend.table.may_stop)
    # Whether the script tools exist is fixed here, by script_dirs at start (reload_notes says so).
    backend.script_tools = bool(backend.settings.script_dirs)
    for spec in tools.specs(backend):
        runtime.register_tool(spec)
    return backend
