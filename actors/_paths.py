"""Path checks shared by back ends that open user-named files (captures, dumps, vmlinux)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from diagd.protocol.errors import DiagdError, ErrorCode


def resolve_allowed(raw: str, allowed_dirs: Sequence[str], *, what: str = "file", cwd: str | None = None,
                    directory: bool = False) -> Path:
    """Resolve `raw` (symlinks included) and require it inside one of `allowed_dirs`.

    A relative `raw` is relative to the caller's working directory `cwd` (`CallContext.cwd`), never
    to the daemon's: the daemon runs wherever systemd or an autostart left it, so "capture.pcap"
    would otherwise name a file the caller never meant. Without a known `cwd` a relative path is
    refused. An empty allow-list means no restriction. Errors: FILE_NOT_FOUND, PERMISSION_DENIED,
    INVALID_ARGUMENT (not a regular file, or relative with no known cwd). `directory`: it must be one.
    """
    if not raw or "\0" in raw:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what} path is empty or contains NUL", path=raw)
    path = Path(os.path.expanduser(raw))
    relative_to: dict[str, str] = {}
    if not path.is_absolute():
        if cwd is None or not os.path.isabs(cwd):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"{what} path {raw!r} is relative and the caller's working directory is unknown "
                             "(an HTTP client has none here; a local client's process may be gone or in "
                             "another mount namespace)", path=raw,
                             hint="pass an absolute path")
        path = Path(cwd) / path
        relative_to = {"cwd": cwd}
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        where = f" (relative to {cwd})" if relative_to else ""
        raise DiagdError(ErrorCode.FILE_NOT_FOUND, f"{what} not found: {raw}{where}", path=raw,
                         **relative_to) from None
    except (OSError, RuntimeError) as exc:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"cannot resolve {raw}: {exc}", path=raw) from None
    if allowed_dirs:
        roots = [Path(d).expanduser().resolve() for d in allowed_dirs]
        if not any(real == root or root in real.parents for root in roots):
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{real} is outside the allowed directories",
                             path=str(real), allowed_dirs=[str(r) for r in roots])
    if not (real.is_dir() if directory else real.is_file()):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{real} is not a {'directory' if directory else 'regular file'}",
                         path=str(real))
    if not os.access(real, os.R_OK):
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{real} is not readable by diagd", path=str(real))
    return real
