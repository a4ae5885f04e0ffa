"""Protocol errors for tool calls the registry refused before they began, and HTTP sessions' tool groups.

(Params that fail the SDK's own validation are answered by `validation.py`.)
- An unknown tool is a protocol error in the 2025-11-25 spec (-32602), not a tool result:
  `refused` builds it with `data.did_you_mean` (close names this client can call) and, for a
  tool of a group this client has not selected, that group, so the agent can ask for it. Still a
  call: audited and counted like any other, with the name asked and that data.

An HTTP session's tool groups are fixed when it opens (`SESSION_TOOLS_KEY`, set by http/wire.py on
every request of the session), as a Unix-socket connection's are: `listChanged` stays false.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from diagd.daemon.tool_groups import Selection
from diagd.protocol.errors import DiagdError

INVALID_PARAMS = -32602
SESSION_TOOLS_KEY = "diagd.session_tools"  # on an HTTP request's ASGI scope: its session's Selection


def refused(name: str, exc: DiagdError) -> MCPError:
    """The -32602 protocol error for a call the registry refused before it began (`check_callable`,
    which has audited and counted it): unknown, or of a group this client has not selected."""
    data: dict[str, Any] = {"code": str(exc.code), "tool": name}
    if "group" in exc.details:  # it exists, for clients that selected its group
        data |= {"group": exc.details["group"], "selected": exc.details.get("selected", [])}
        message = (f"tool {name!r} is in group {exc.details['group']!r}, which this client has not "
                   "selected (diagd mcp --tools, or [mcp] tools in the config)")
    else:
        data["did_you_mean"] = exc.details.get("did_you_mean", [])
        hint = f" (did you mean {' or '.join(data['did_you_mean'])}?)" if data["did_you_mean"] else ""
        message = f"unknown tool {name!r}{hint}"
    return MCPError(code=INVALID_PARAMS, message=message, data=data)


def session_tools(ctx: ServerRequestContext[Any, Any]) -> tuple[bool, Selection]:
    """(True, the groups) an HTTP session was opened with, (False, None) outside one."""
    scope = getattr(ctx.request, "scope", None)
    if isinstance(scope, dict) and SESSION_TOOLS_KEY in scope:
        selection: Selection = scope[SESSION_TOOLS_KEY]
        return True, selection
    return False, None
