"""What a client reads per tool group: its `tools/list` result and server instructions, in bytes, offline.

The registry is a real daemon's (`Daemon.load_backends`, as `diagd serve` builds it; no socket, no
process), each tool is what `list_tools` hands the MCP SDK (`mcp_front.to_mcp_tool`), serialized as
the SDK puts it on the wire (`by_alias`, `exclude_none`) into a 2025-era client's `{"tools": [...]}`
result, compact and UTF-8: the bytes `bench/tools_list.py` reads through `diagd mcp` and the shim.
The instructions are what a connection that chose the groups gets in its `initialize` answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import mcp_types as types
import trio

from diagd.daemon import config as config_mod
from diagd.daemon import tool_groups
from diagd.daemon.server import mcp_front
from diagd.daemon.server.server import Daemon

ALL = "all"  # the selection of every group (no `--tools`)


class Listed(NamedTuple):
    tools: int
    bytes: int
    instructions: int


def wire_bytes(tools: list[types.Tool]) -> int:
    result = {"tools": [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]}
    return len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode())


async def _measure(config: dict[str, Any], tmp: Path) -> dict[str, Listed]:
    async with trio.open_nursery() as nursery:
        daemon = Daemon(config_mod.parse(config), nursery, runtime_dir=tmp, state_dir=tmp / "state")
        try:
            daemon.load_backends()
            groups = sorted(daemon.registry.groups())
            guides = daemon.instructions()
            out = {}
            for name in (ALL, *groups):
                selection = None if name == ALL else tool_groups.check([name], groups)
                specs = daemon.registry.specs(selection)
                out[name] = Listed(len(specs), wire_bytes([mcp_front.to_mcp_tool(s) for s in specs]),
                                   len(mcp_front.instructions(guides, selection).encode()))
            return out
        finally:
            daemon.audit.close()
            nursery.cancel_scope.cancel()


def measure(config: dict[str, Any], tmp: Path) -> dict[str, Listed]:
    """Per selection (`ALL`, then each group the daemon loads with `config`): tools, bytes, instruction bytes."""
    return trio.run(_measure, config, tmp)
