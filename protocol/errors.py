"""Stable error codes and the one exception type that carries them.

Every failure that reaches a client (MCP or CLI) is a `DiagdError` turned into
`{code, message, details}`; anything else is mapped to INTERNAL_ERROR in exactly one
place (`diagd.daemon.tools.ToolRegistry.call`), so no traceback ever reaches the wire.
"""

from __future__ import annotations

import enum
from typing import Any


class ErrorCode(enum.StrEnum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    FILE_NOT_FOUND = "FILE_NOT_FOUND"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    TIMEOUT = "TIMEOUT"
    OUTPUT_TOO_LARGE = "OUTPUT_TOO_LARGE"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    BUSY = "BUSY"
    CANCELLED = "CANCELLED"
    ACTOR_FAILED = "ACTOR_FAILED"
    PROTOCOL_ERROR = "PROTOCOL_ERROR"
    TSHARK_NOT_FOUND = "TSHARK_NOT_FOUND"
    INVALID_FILTER = "INVALID_FILTER"
    INVALID_FIELDS = "INVALID_FIELDS"
    INTERNAL_ERROR = "INTERNAL_ERROR"


class DiagdError(Exception):
    """A failure with a stable code, safe to show to a client as-is."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        return {"code": str(self.code), "message": self.message, "details": self.details}

    def __repr__(self) -> str:
        return f"DiagdError({self.code}, {self.message!r})"
