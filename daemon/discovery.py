"""Which back ends exist: the installed `diagd.backends` entry points, then `[daemon] extra_backends`.

Built-in and third-party back ends are found the same way: a distribution declares an entry point
in the `diagd.backends` group whose name is the back end's (its tool group, config table and state
dir) and whose value is its module, which has `register(runtime)` (and may have `SYSTEM_NEEDS`):

    [project.entry-points."diagd.backends"]
    mine = "mypackage.diagd_backend"

`[daemon] extra_backends` adds modules by name (named after their last component), for back ends
that are not installed (the tests' echo_actor). Stdlib only, and nothing is imported here: `diagd mcp
--tools`, `diagd setup` and `diagd tools` ask for names and start fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from diagd.protocol.errors import DiagdError, ErrorCode

GROUP = "diagd.backends"


@dataclass(frozen=True)
class Backend:
    name: str  # its tool group, config table [name] and state dir $state/name
    module: str  # has register(runtime)
    installed: bool = True  # False: named in [daemon] extra_backends


def module_name(module: str) -> str:
    """An extra back end's name: its module's last component (`tests.support.echo_actor` -> `echo_actor`)."""
    return module.rpartition(".")[2]


def installed() -> list[Backend]:
    """The back ends installed as entry points, by name (installers write them sorted anyway: the order
    never depends on which one wrote them)."""
    return sorted((Backend(ep.name, ep.value) for ep in metadata.entry_points(group=GROUP)), key=lambda b: b.name)


def backends(extra: Iterable[str] = ()) -> list[Backend]:
    """Every back end a daemon with these `extra_backends` loads, each name once.

    BACKEND_UNAVAILABLE when no back end is installed at all: diagd's own entry points are missing,
    i.e. diagd runs from a checkout that was never installed (`pip install -e .` writes them).
    """
    found = installed()
    if not found:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"no back end is installed (no {GROUP!r} entry point): "
                         "install diagd (pip install -e . in a checkout) so its entry points exist")
    names = {b.name for b in found}
    for module in extra:
        name = module_name(module)
        if name in names:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[daemon] extra_backends: {module!r} is named {name!r}, "
                             "like an installed back end", setting="[daemon] extra_backends", backend=name)
        names.add(name)
        found.append(Backend(name, module, installed=False))
    return found


def names(extra: Iterable[str] = ()) -> list[str]:
    return [b.name for b in backends(extra)]
