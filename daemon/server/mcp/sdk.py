"""The MCP SDK's server side, imported without the SDK's package `__init__`s (issue 12).

`import mcp.server.lowlevel` first runs `mcp/__init__.py` and `mcp/server/__init__.py`, and they
import the whole client (httpx, its auth, every transport) and the high-level `MCPServer` (its
resources, prompts and function introspection): ~12 MB of the daemon's RSS for code a low-level
`Server` on a Unix socket never runs. `lean()` puts both packages in `sys.modules` as bare
packages (their `__path__` only), so importing a submodule runs that submodule alone. A name
asked of a bare package (`from mcp import Client`) runs its real `__init__` then, in place: code
that wants the full SDK in the same process still gets it.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

PACKAGES = ("mcp", "mcp.server")


def lean() -> None:
    """Make the SDK's packages bare where nothing has imported them yet (call before importing any)."""
    for name in PACKAGES:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return  # not the SDK this was written for: import it as it is
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _full_init(module)  # type: ignore[method-assign]
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _full_init(module: ModuleType) -> Any:
    def __getattr__(attr: str) -> Any:
        spec = module.__spec__
        if module.__dict__.get("_lean_initialised") or spec is None or spec.loader is None:
            raise AttributeError(f"module {module.__name__!r} has no attribute {attr!r}")
        module._lean_initialised = True  # type: ignore[attr-defined]
        spec.loader.exec_module(module)
        return getattr(module, attr)

    return __getattr__
