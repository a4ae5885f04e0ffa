"""What a client reads per tool group, in bytes, offline: what of `tools/list` reaches the model, the
whole `tools/list` result, and the server instructions.

The registry is a real daemon's (`Daemon.load_backends`, as `diagd serve` builds it; no socket, no
process), each tool is what `list_tools` hands the MCP SDK (`to_mcp_tool`, daemon/server/mcp/front.py), serialized as
the SDK puts it on the wire (`by_alias`, `exclude_none`) into a 2025-era client's `{"tools": [...]}`
result, compact and UTF-8: the bytes `bench/tools_list.py` reads through `diagd mcp` and the shim.
The model-facing bytes are that result with each tool cut to its name, description and inputSchema
(`tool_listing.model_facing_bytes`: what hosts send the model; the budgets hold them); the whole
result adds each tool's full outputSchema, title and annotations, which hosts keep to themselves.
The instructions are what a connection that chose the groups gets in its `initialize` answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import mcp_types as types
import trio

from diagd.daemon import config as config_mod
from diagd.daemon import tool_groups
from diagd.daemon.server import tool_listing
from diagd.daemon.server.mcp import front as mcp_front
from diagd.daemon.server.server import Daemon

ALL = "all"  # the selection of every group (no `--tools`)


class Listed(NamedTuple):
    tools: int
    model: int  # model-facing bytes: name, description and inputSchema of each tool (the budgets)
    whole: int  # the whole tools/list result, output schemas included
    instructions: int


def wire(tools: list[types.Tool]) -> list[dict[str, Any]]:
    """The tools as a tools/list result holds them."""
    return [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools]


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
                tools = wire([mcp_front.to_mcp_tool(s) for s in specs])
                out[name] = Listed(len(specs), tool_listing.model_facing_bytes(tools),
                                   tool_listing.json_bytes({"tools": tools}),
                                   len(mcp_front.instructions(guides, selection).encode()))
            return out
        finally:
            daemon.audit.close()
            nursery.cancel_scope.cancel()


def measure(config: dict[str, Any], tmp: Path) -> dict[str, Listed]:
    """Per selection (`ALL`, then each group the daemon loads with `config`): tools, model-facing bytes,
    whole tools/list bytes, instruction bytes."""
    return trio.run(_measure, config, tmp)
