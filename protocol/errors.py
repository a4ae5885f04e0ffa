"""Stable error codes and the one exception type that carries them.

Every failure that reaches a client (MCP or CLI) is a `DiagdError` turned into
`{code, message, details}` (`to_wire`), and read back with `from_wire`; anything else becomes
INTERNAL_ERROR through `as_error` (the tool registry's one place for that), so no traceback ever
reaches the wire.
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
    # `--ssh` (daemon/cli/remote.py): why a remote diagd could not be reached.
    SSH_NOT_FOUND = "SSH_NOT_FOUND"
    SSH_UNREACHABLE = "SSH_UNREACHABLE"
    SSH_AUTH_FAILED = "SSH_AUTH_FAILED"
    SSH_FAILED = "SSH_FAILED"
    REMOTE_DIAGD_NOT_FOUND = "REMOTE_DIAGD_NOT_FOUND"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    # The daemon's last line to its MCP clients when it stops (a restart, an upgrade, `diagd stop`):
    # unlike a refusal (BUSY, a too-long line) the shim reconnects after it.
    DAEMON_STOPPING = "DAEMON_STOPPING"
    # The shim's answer to a call that was in flight when the daemon went away; the session goes on.
    DAEMON_RESTARTED = "DAEMON_RESTARTED"


class DiagdError(Exception):
    """A failure with a stable code, safe to show to a client as-is."""

    def __init__(self, code: ErrorCode, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    def to_wire(self) -> dict[str, Any]:
        return {"code": str(self.code), "message": self.message, "details": self.details}

    @classmethod
    def from_wire(cls, code: str, message: str, details: dict[str, Any] | None = None) -> DiagdError:
        """The error a peer sent (control socket, drgn worker); a code this version does not know is
        INTERNAL_ERROR."""
        return cls(error_code(code), message, **(details or {}))

    def __repr__(self) -> str:
        return f"DiagdError({self.code}, {self.message!r})"


def error_code(raw: str) -> ErrorCode:
    try:
        return ErrorCode(raw)
    except ValueError:
        return ErrorCode.INTERNAL_ERROR


def as_error(exc: BaseException, doing: str) -> DiagdError:
    """`exc` as a coded error: a DiagdError as it is, anything else (a bug) as INTERNAL_ERROR naming
    what failed and the exception, never its traceback."""
    if isinstance(exc, DiagdError):
        return exc
    return DiagdError(ErrorCode.INTERNAL_ERROR, f"{doing} failed: {type(exc).__name__}: {exc}")
