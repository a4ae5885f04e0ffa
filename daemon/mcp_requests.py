"""Protocol errors the SDK server answers for diagd, short and the same on every transport.

- Params that fail the SDK's validation (`tools/call` without `name`, a `cursor` of 5) got -32602
  "Invalid request parameters" with empty data: `short_validation_errors` says which param and why.
- An unknown tool is a protocol error in the 2025-11-25 spec (-32602), not a tool result:
  `check_tool` raises it with `data.did_you_mean` (close names this client can call) and, for a
  tool of a group this client has not selected, that group, so the agent can ask for it.

An HTTP session's tool groups are fixed when it opens (`SESSION_TOOLS_KEY`, set by http_wire on
every request of the session), as a Unix-socket connection's are: `listChanged` stays false.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from diagd.daemon.tool_groups import Selection
from diagd.daemon.tools import ToolRegistry
from diagd.protocol.errors import DiagdError, ErrorCode

INVALID_PARAMS = -32602
SESSION_TOOLS_KEY = "diagd.session_tools"  # on an HTTP request's ASGI scope: its session's Selection


async def short_validation_errors(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
    """Server middleware: a pydantic error in a request's params as one short -32602 naming the param."""
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        raise MCPError(code=INVALID_PARAMS, message=f"Invalid params for {ctx.method}: {_first(exc)}",
                       data={"code": str(ErrorCode.INVALID_ARGUMENT), "path": _path(exc)}) from None


def _path(exc: ValidationError) -> str:
    errors = exc.errors()
    loc = tuple(errors[0]["loc"]) if errors else ()
    if loc[:1] == ("params",):  # the SDK validates the whole request for spec methods, its params alone otherwise
        loc = loc[1:]
    return "$.params" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)


def _first(exc: ValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "malformed"
    message = str(errors[0]["msg"])
    return f"{_path(exc)}: {message[:120]}".replace("Field required", "required, missing")


def check_tool(registry: ToolRegistry, name: str, selection: Selection) -> None:
    """MCPError -32602 when this client cannot call `name`: unknown, or of a group it has not selected."""
    try:
        registry.get(name, selection)
    except DiagdError as exc:
        data: dict[str, Any] = {"code": str(exc.code), "tool": name}
        if "group" in exc.details:  # it exists, for clients that selected its group
            data |= {"group": exc.details["group"], "selected": exc.details.get("selected", [])}
            message = (f"tool {name!r} is in group {exc.details['group']!r}, which this client has not "
                       "selected (diagd mcp --tools, or [mcp] tools in the config)")
        else:
            data["did_you_mean"] = exc.details.get("did_you_mean", [])
            hint = f" (did you mean {' or '.join(data['did_you_mean'])}?)" if data["did_you_mean"] else ""
            message = f"unknown tool {name!r}{hint}"
        raise MCPError(code=INVALID_PARAMS, message=message, data=data) from None


def session_tools(ctx: ServerRequestContext[Any, Any]) -> tuple[bool, Selection]:
    """(True, the groups) an HTTP session was opened with, (False, None) outside one."""
    scope = getattr(ctx.request, "scope", None)
    if isinstance(scope, dict) and SESSION_TOOLS_KEY in scope:
        selection: Selection = scope[SESSION_TOOLS_KEY]
        return True, selection
    return False, None
