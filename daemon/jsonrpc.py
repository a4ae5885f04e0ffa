"""The JSON-RPC error lines diagd writes itself: one builder, and the coded server error of its notices.

Stdlib only: the daemon's accept loop (before the MCP SDK is imported), the MCP front end and the
shim all write them. A coded diagd error goes out as JSON-RPC's implementation-defined server error
(`SERVER_ERROR`), its message "CODE: text" and its data `{"code": CODE, ...}`.
"""

from __future__ import annotations

import json
from typing import Any

from diagd.protocol.errors import ErrorCode

SERVER_ERROR = -32000  # JSON-RPC's implementation-defined server error
MAX_MESSAGE = 500


def error_line(code: int, message: str, ident: Any = None, *, data: dict[str, Any] | None = None) -> bytes:
    """One JSON-RPC error response, newline-terminated (written by us: the SDK's types cannot echo 1.5)."""
    error: dict[str, Any] = {"code": code, "message": message[:MAX_MESSAGE]}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}, separators=(",", ":")).encode() + b"\n"


def coded_error(code: ErrorCode, message: str, ident: Any = None, **data: Any) -> bytes:
    """A coded diagd error as a JSON-RPC server error (`closing=True` in `data`: the daemon closes next)."""
    return error_line(SERVER_ERROR, f"{code}: {message}", ident, data={"code": str(code), **data})


def restart_error(ident: Any, method: str, *, stopping: str | None = None) -> bytes:
    """The answer to a request that was in flight when the daemon went away (the shim's, after the
    connection dropped) or as it goes (`stopping`: why; HTTP's, written by the stopping daemon)."""
    what = "restarted" if stopping is None else f"stopped ({stopping})"
    message = (f"the daemon {what} while {method} was in flight; it may or may not have run. The session goes "
               "on: the call may be retried" + ("" if stopping is None else " once the daemon is back"))
    return coded_error(ErrorCode.DAEMON_RESTARTED, message, ident, method=method)
