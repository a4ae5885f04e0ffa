"""The crash back end: kernel crash-dump sessions with crash (pexpect) and drgn (a worker process).

`backend` holds the session table and starts session actors (`actor`, one per dump session, with
`commands`); `tools` declares the MCP tools, which talk to the actors through `messages`. Helpers:
`pty` (crash on a pseudo-terminal), `drgn` and `drgn_worker` (the worker process and its `proto`),
`identity` (what makes two dumps the same), `store`/`output` (stored outputs), `text`/`gdb` (parsing
crash's output, refusing escapes), `report`, `scripts`, `sessions`, `settings`, `schemas`.
"""

from __future__ import annotations

from diagd.actors.crash import tools
from diagd.actors.crash.backend import CrashBackend
from diagd.actors.crash.messages import KIND
from diagd.actors.runtime import Runtime
from diagd.actors.system import Needs, Tool, check_crash_version

# What `diagd setup crash` installs and `diagd doctor` checks (drgn and pexpect come with diagd).
SYSTEM_NEEDS = Needs(tools=(Tool("crash", ("--version",), "crash"),), modules=("pexpect", "drgn"),
                     checks=(check_crash_version,))


def register(runtime: Runtime) -> CrashBackend:
    backend = CrashBackend(runtime)
    runtime.on_client(gone=backend.client_gone)
    runtime.on_reload(backend.reload_notes)
    runtime.on_stop_request(KIND, backend.table.may_stop)
    # Whether the script tools exist is fixed here, by script_dirs at start (reload_notes says so).
    backend.script_tools = bool(backend.settings.script_dirs)
    for spec in tools.specs(backend):
        runtime.register_tool(spec)
    return backend
