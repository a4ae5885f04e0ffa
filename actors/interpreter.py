"""Python processes of diagd: an interpreter import path that trusts no directory.

`python -m module` puts the working directory first on sys.path, and an empty or relative PYTHONPATH
entry means the working directory too: a `msgpack.py`, a `trio/` or a `diagd/` folder wherever a
client happened to start (an MCP host often starts `diagd mcp` in a cloned repository) would be
imported by the daemon, which may run as root. So every Python process diagd starts itself (the
daemon from `diagd start` and the MCP shim's autostart, the drgn worker) runs with `-P` (nothing
prepended to sys.path) and a PYTHONPATH of absolute entries only, in a known working directory; and
the daemon, however it was started, drops such entries from its own path and environment and moves
to `/` first thing (`settle`).

PYTHONPATH itself is kept (absolute entries only): it is the environment the user chose, not a
directory the process happens to be in (the tests add their back end, tests/support, through it), and
so are the user's site-packages (a `pip install --user` diagd lives there). The sandbox launcher runs
with `-I -S` (it needs the standard library only). Stdlib only: the MCP shim imports this.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

# Where the daemon runs: always there, never removed or unmounted, and writable by root alone.
DAEMON_CWD = "/"


def module_argv(module: str, *args: str) -> list[str]:
    """`python -P -m module args`: this interpreter, nothing prepended to sys.path."""
    return [sys.executable, "-P", "-m", module, *args]


def script_argv(script: str, *args: str) -> list[str]:
    """`python -P /abs/script.py args`: a script of diagd's own by its absolute path (one that need not
    import the package it sits in), nothing prepended to sys.path."""
    return [sys.executable, "-P", os.path.abspath(script), *args]


def unsafe_entries(pythonpath: str | None) -> list[str]:
    """PYTHONPATH entries that name no fixed directory: empty (the working directory) or relative."""
    return [p for p in pythonpath.split(os.pathsep) if not os.path.isabs(p)] if pythonpath else []


def safe_pythonpath(pythonpath: str | None) -> str | None:
    """PYTHONPATH with its absolute entries only (None when none is left)."""
    kept = [p for p in pythonpath.split(os.pathsep) if os.path.isabs(p)] if pythonpath else []
    return os.pathsep.join(dict.fromkeys(kept)) or None


def sanitise(env: MutableMapping[str, str]) -> None:
    """Drop PYTHONPATH's entries that depend on the working directory, in place."""
    path = safe_pythonpath(env.pop("PYTHONPATH", None))
    if path:
        env["PYTHONPATH"] = path


def child_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment for a Python child: `base` (default os.environ) with a sanitised PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    sanitise(env)
    env.update(extra)
    return env


def settle(directory: str = DAEMON_CWD) -> None:
    """For the daemon, before it imports anything else: forget sys.path entries the start directory put
    there (an empty or relative PYTHONPATH entry, which site has made absolute by now), pass a sanitised
    PYTHONPATH on to every child, and move to `directory` for life."""
    start = os.getcwd()
    unsafe = {os.path.abspath(os.path.join(start, p)) for p in unsafe_entries(os.environ.get("PYTHONPATH"))}
    sys.path[:] = [p for p in sys.path if p and os.path.isabs(p) and p not in unsafe]
    sanitise(os.environ)
    os.chdir(directory)
