"""Path checks shared by back ends: the files a caller may name (captures, dumps, vmlinux), and the
names of the files diagd writes (the caller picks a stem at most; diagd the directory and extension)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from diagd.protocol.errors import DiagdError, ErrorCode


def resolve_allowed(raw: str, allowed_dirs: Sequence[str], *, what: str = "file", cwd: str | None = None,
                    directory: bool = False, private_dirs: Sequence[str] = (), shared_dirs: Sequence[str] = (),
                    hints: Mapping[str, str] | None = None) -> Path:
    """Resolve `raw` (symlinks included) and require it inside one of `allowed_dirs`.

    A relative `raw` is relative to the caller's working directory `cwd` (`CallContext.cwd`), never
    to the daemon's: the daemon runs wherever systemd or an autostart left it, so "capture.pcap"
    would otherwise name a file the caller never meant. Without a known `cwd` a relative path is
    refused. An empty allow-list means no restriction. Errors: FILE_NOT_FOUND, PERMISSION_DENIED,
    INVALID_ARGUMENT (not a regular file, or relative with no known cwd). `directory`: it must be one.
    `private_dirs` (diagd's own: state, runtime) are refused whatever allowed_dirs says, except
    `shared_dirs` inside them (see `refuse_private`).
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
    refuse_private(real, private_dirs, shared_dirs, what=what, hints=hints)
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


def inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def refuse_private(real: Path, private_dirs: Sequence[str], shared_dirs: Sequence[str] = (), *, what: str = "file",
                   hints: Mapping[str, str] | None = None) -> None:
    """PERMISSION_DENIED when the resolved path `real` is inside one of diagd's own directories.

    The state dir holds every client's crash outputs, serial logs, bpftrace results and the audit
    log; the runtime dir the sockets. A tool that reads caller-named files must not read them,
    even where allowed_dirs covers them (a home directory often does), or a client held to one
    tool group would read what the others wrote. `shared_dirs` inside them (a group's exports dir,
    for a client that selected the group) stay readable; `hints` (dir -> text) say how to reach one.
    """
    shared = [Path(d).resolve() for d in shared_dirs]
    if any(inside(real, d) for d in shared):
        return
    for raw_root in private_dirs:
        root = Path(raw_root).resolve()
        if inside(real, root):
            hint = next((text for d, text in (hints or {}).items() if inside(real, Path(d).resolve())),
                        "name a file outside diagd's directories")
            raise DiagdError(ErrorCode.PERMISSION_DENIED,
                             f"{what} {real} is inside {root}, one of diagd's own directories (state, runtime): "
                             "tools never read diagd's own files (other clients' crash outputs, serial logs, "
                             "bpftrace results, the audit log), whatever allowed_dirs says",
                             path=str(real), private_dir=str(root), hint=hint)


# A stem a caller may give a file diagd writes: a safe alphabet, no leading dot (no dot-files) and no
# leading dash (no option look-alike), bounded; diagd adds the extension and picks the directory.
STEM_MAX = 64
_STEM = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9._-]{{0,{STEM_MAX - 1}}}")
_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def caller_stem(raw: str, *, argument: str, extension: str) -> str:
    """`raw` as the stem of a file diagd writes, or INVALID_ARGUMENT with a hint.

    Only a stem: no directory (`/`, `..`), no dot-file, no extension of its own (`keys.sh`), nothing
    outside [A-Za-z0-9._-]; the file is `<exports dir>/<stem><extension>`.
    """
    hint = (f"give a stem of up to {STEM_MAX} letters, digits, '_', '-' or '.' (not first) without an "
            f"extension, e.g. 'modem-run1': diagd writes <exports dir>/<stem>{extension} and returns its path")
    why = None
    if "/" in raw or raw in (".", ".."):
        why = "is a path: only a stem is accepted, the directory is diagd's"
    elif raw.startswith("."):
        why = "starts with '.': diagd writes no dot-files"
    elif not _STEM.fullmatch(raw):
        why = f"holds characters outside [A-Za-z0-9._-], starts with '-' or is longer than {STEM_MAX}"
    elif found := _EXTENSION.search(raw):
        why = f"has an extension of its own ({found.group()}); diagd adds {extension}"
    if why:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{argument} {raw!r} {why}", argument=argument, hint=hint)
    return raw


def made_stem(text: str) -> str:
    """A stem diagd makes from a name it did not choose (a capture's, a port's): unsafe characters
    become '_', no leading '.' or '-', bounded."""
    return _UNSAFE.sub("_", text).lstrip(".-")[:STEM_MAX] or "file"


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create_new(path: Path, mode: int = 0o600) -> int:
    """Create `path` as a new file (never through a link, never over another file): its fd."""
    return os.open(path, _CREATE, mode)


def replace_whole(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: `data` into a new file of a name of its own beside it (created as
    create_new does), renamed over `path` (a reader never sees half of it; a link at `path` is replaced,
    never written through). OSError as it comes; the new file is removed then."""
    partial = path.with_name(f"{path.name}.{os.getpid()}-{os.urandom(4).hex()}.partial")
    try:
        with os.fdopen(create_new(partial), "wb") as f:
            f.write(data)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
