"""The HTTP session records on disk: `http_sessions.json` in the state directory, owner-only.

Stdlib only. Each record is what a restarted daemon needs to bring a client's session back: its id,
the id of the token that opened it (never its name: a name revoked and added again is another token),
the client's `initialize` params and when it was last used (wall-clock seconds). A file of another
format version yields no records: version 1 bound sessions to token names, so its records are dropped
rather than trusted. The file is written whole (temporary file, then rename) with mode 0600 and
opened only through the checked state directory's fd with O_NOFOLLOW, so a planted symlink is
refused, never followed. A file that cannot be read (refused, damaged) yields no records: the
daemon then starts with no revivable session, which costs clients a new `initialize`, nothing more.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.daemon import paths
from diagd.protocol.errors import DiagdError, ErrorCode

FILE = "http_sessions.json"
FORMAT_VERSION = 2  # 2: "token_id" (1 had the token's name in "token")
MAX_FILE_BYTES = 8 * 1024 * 1024  # far above max_sessions x MAX_PARAMS_BYTES at any sane setting
MAX_PARAMS_BYTES = 8 * 1024  # a client's initialize params larger than this are not kept (not revivable)


@dataclass(frozen=True)
class Stored:
    sid: str
    token: str  # the token's id (tokens.Token.id)
    initialize: dict[str, Any]
    last_used_wall: float


def load(directory: Path) -> list[Stored]:
    """The records in `directory`'s file; [] when there is none. DiagdError when it is unsafe or damaged."""
    d = paths.open_private_dir(directory, what="state directory")
    try:
        try:
            fd = d.open(FILE, os.O_RDONLY | os.O_NONBLOCK)
        except DiagdError:
            if not os.path.lexists(d.path / FILE):
                return []
            raise
        try:
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) & 0o077 or st.st_size > MAX_FILE_BYTES:
                raise DiagdError(ErrorCode.PERMISSION_DENIED, f"refusing {d.path / FILE}: mode "
                                 f"{stat.S_IMODE(st.st_mode):04o}, {st.st_size} bytes", path=str(d.path / FILE))
            with os.fdopen(fd, "rb", closefd=False) as f:
                raw = f.read(MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        d.close()
    try:
        data = json.loads(raw)
        if data["version"] != FORMAT_VERSION:
            return []
        return [Stored(str(e["id"]), str(e["token_id"]), dict(e["initialize"]), float(e["last_used"]))
                for e in data["sessions"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{directory / FILE} is damaged ({exc!r})",
                         path=str(directory / FILE)) from None


def save(directory: Path, records: list[Stored]) -> None:
    """Replace the file with `records` (readers see the old file or the new, never half)."""
    data = {"version": FORMAT_VERSION,
            "sessions": [{"id": r.sid, "token_id": r.token, "initialize": r.initialize,
                          "last_used": r.last_used_wall} for r in records]}
    encoded = (json.dumps(data, separators=(",", ":")) + "\n").encode()
    d = paths.open_private_dir(directory, what="state directory")
    try:
        tmp = FILE + ".tmp"
        fd = d.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)  # O_CREAT's mode only applies to a new file
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(encoded)
        finally:
            os.close(fd)
        os.replace(tmp, FILE, src_dir_fd=d.fd, dst_dir_fd=d.fd)
    finally:
        d.close()


def params_fit(params: dict[str, Any]) -> bool:
    """Whether `params` is small enough to keep (a record without them cannot be revived)."""
    return len(json.dumps(params, separators=(",", ":"))) <= MAX_PARAMS_BYTES
