"""Params that fail the SDK's validation, answered short: one -32602 naming the param and why.

`tools/call` without `name` or a `cursor` of 5 got -32602 "Invalid request parameters" with empty
data from the SDK; this server middleware says which param and why, the same on every transport.
"""

from __future__ import annotations

from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from diagd.protocol.errors import ErrorCode

INVALID_PARAMS = -32602


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
