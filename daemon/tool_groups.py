"""Which back ends a client sees: tool groups, their selection, and the MCP connection's options line.

A group is a back end's name (an installed one's or an extra back end's, daemon/discovery.py) plus
`diagd`, the daemon's own tools, which every client sees. A client chooses groups with
`diagd mcp --tools A,B`; the shim sends the choice as the first line on the MCP socket, before any
MCP bytes:

    {"diagd":{"v":1,"tools":["A","B"]}}

and the daemon reads it as the connection's options (a line with a "diagd" key and no "jsonrpc"
can never be an MCP message). Without it `[mcp] tools` in the config decides (default: every group).
Stdlib only: the shim and `diagd tools` import this.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from diagd.protocol.errors import DiagdError, ErrorCode

BUILTIN = "diagd"  # the daemon's own tools (status, calls, stop_actor, reload): always listed
OPTIONS_VERSION = 1
# The daemon reads at most this much as an options line (it is a few group names).
MAX_OPTIONS_BYTES = 4096

# A selection: the groups chosen, or None for every group.
Selection = frozenset[str] | None


def parse_list(text: str) -> list[str]:
    """`a,b` (spaces allowed) as a list of names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def check(names: Iterable[str], known: Iterable[str], *, where: str = "--tools",
          off: Mapping[str, Mapping[str, str]] | None = None) -> frozenset[str]:
    """`names` as a selection (the built-in group added), or INVALID_ARGUMENT naming close matches;
    `off`: groups whose back end declared it serves nothing under this config ({reason, hint}): named as such."""
    known = sorted(set(known) | {BUILTIN})
    chosen = set()
    for name in names:
        if off and name in off and name not in known:
            why = off[name]
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{where}: the tool group {name!r} serves no tool here: "
                             f"{why.get('reason', '')}; to turn it on: {why.get('hint', '')}", group=name,
                             reason=why.get("reason", ""), hint=why.get("hint", ""))
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{where}: unknown tool group {name!r}{hint}; the groups "
                             f"are {', '.join(known)}", group=name, did_you_mean=close, groups=known)
        chosen.add(name)
    return frozenset(chosen | {BUILTIN})


def selects(selection: Selection, group: str) -> bool:
    return selection is None or group == BUILTIN or group in selection


def options_line(groups: Iterable[str]) -> bytes:
    """The first line a client sends to choose its groups."""
    body = {"diagd": {"v": OPTIONS_VERSION, "tools": sorted(set(groups) - {BUILTIN})}}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def read_options(line: bytes) -> dict[str, Any] | None:
    """The options of a first line that is an options line, else None (it is MCP: pass it on).

    PROTOCOL_ERROR for an options line that is malformed or of another version.
    """
    if b'"diagd"' not in line or len(line) > MAX_OPTIONS_BYTES:
        return None
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):  # deep nesting fits in 4 KB: not options, the MCP parser answers it
        return None
    if not isinstance(raw, dict) or "diagd" not in raw or "jsonrpc" in raw:
        return None
    options = raw["diagd"]
    version = options.get("v") if isinstance(options, dict) else None
    if not isinstance(options, dict) or isinstance(version, bool) or version != OPTIONS_VERSION:  # true == 1
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"connection options must be {{\"v\": {OPTIONS_VERSION}, ...}}",
                         got=str(options)[:200])
    tools = options.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
        raise DiagdError(ErrorCode.PROTOCOL_ERROR, "connection options: tools must be a list of group names")
    return options
