"""Command outputs of crash sessions, stored on disk so they can be paged and searched at any time.

Layout (under the daemon's state dir, so it survives the session, the actor and a daemon restart):

    <state>/crash/<session_id>/session.json       what was opened, when, and its summary
    <state>/crash/<session_id>/cmd-000017.out     one command's output (text, cut at the size cap)
    <state>/crash/<session_id>/cmd-000017.json    its metadata (command, engine, context, lines, ...)

A command id is `<session_id>:<n>`; it names the files directly, so reading an output needs no
session, no actor and no index. Every function here blocks: call it through trio.to_thread.
Outputs are written as they are produced (`open_output`, or by the drgn worker itself) and then
described by `finish`; the daemon keeps only their first lines (`Entry`) and a small line index
per recently read output (`output`), never a whole output.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagd.actors._user_regex import Matcher
from diagd.actors.crash.output import LineIndex, OutputWriter, StoredLines, read_lines, read_nofollow, scan
from diagd.actors.crash.replies import Match, OutputPage, SearchReply
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

SESSION_ID = re.compile(r"^[a-z0-9][a-z0-9-]{5,40}$")
COMMAND_ID = re.compile(r"^(?P<session>[a-z0-9][a-z0-9-]{5,40}):(?P<n>[0-9]{1,9})$")
MAX_PAGE_LINES = 500


@dataclass
class Entry:
    """One stored output as the actor remembers it (first lines in memory, the rest on disk)."""

    command_id: str
    command: str
    engine: str
    head: list[str]
    total_lines: int
    context: dict[str, Any] | None
    duration_s: float
    meta: dict[str, Any] = field(default_factory=dict)


def _write_atomic(path: Path, data: bytes) -> None:
    # drgn code can write in a session dir: never write through a link planted at the temporary name.
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class OutputStore:
    def __init__(self, root: Path, *, cache_entries: int = 64) -> None:
        self.root = root
        self._indexes: OrderedDict[str, LineIndex] = OrderedDict()
        self._cache_entries = cache_entries

    def session_dir(self, session_id: str) -> Path:
        if not SESSION_ID.fullmatch(session_id):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"malformed session id {session_id!r}")
        return self.root / session_id

    def create_session(self, session_id: str, meta: dict[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        workdir = self.session_dir(session_id)
        workdir.mkdir(mode=0o700)
        _write_atomic(workdir / "session.json", json.dumps(meta, indent=1, default=str).encode())
        return workdir

    def update_session(self, session_id: str, **fields: Any) -> None:
        path = self.session_dir(session_id) / "session.json"
        try:
            meta = json.loads(read_nofollow(path))
        except (OSError, ValueError):
            meta = {}
        meta.update(fields)
        _write_atomic(path, json.dumps(meta, indent=1, default=str).encode())

    def session_meta(self, session_id: str) -> dict[str, Any] | None:
        """What session.json recorded of a session (this daemon's or an earlier one's); None if none."""
        try:
            meta = json.loads(read_nofollow(self.session_dir(session_id) / "session.json"))
        except (OSError, ValueError, DiagdError):
            return None
        return meta if isinstance(meta, dict) else None

    def output_path(self, session_id: str, n: int) -> Path:
        return self.session_dir(session_id) / f"cmd-{n:06d}.out"

    def open_output(self, session_id: str, n: int, limit: int) -> OutputWriter:
        """A writer streaming output n to its file; `finish` describes it once it is complete."""
        return OutputWriter(self.output_path(session_id, n), limit)

    def finish(self, session_id: str, n: int, meta: dict[str, Any], *, total_lines: int | None = None
               ) -> dict[str, Any]:
        """Write the metadata of output n (already on disk); returns it (with command_id, total_lines, bytes).

        `total_lines` comes from the writer that counted them; without it (the drgn worker wrote the
        file) the file is scanned, which also prepares its line index for paging.
        """
        command_id = f"{session_id}:{n}"
        path = self.output_path(session_id, n)
        try:
            size = path.lstat().st_size
        except FileNotFoundError:
            OutputWriter(path, 0).close()  # the worker died before creating it: an empty output
            size = 0
        if total_lines is None:
            total_lines = self._index(command_id, path).total
        full = {**meta, "command_id": command_id, "session_id": session_id, "total_lines": total_lines,
                "bytes": size, "stored_at": utc.iso()}
        _write_atomic(path.with_suffix(".json"), json.dumps(full, default=str).encode())
        return full

    def write(self, session_id: str, n: int, text: str, meta: dict[str, Any]) -> dict[str, Any]:
        """Store one output given whole (small ones; big ones stream through `open_output`)."""
        writer = self.open_output(session_id, n, limit=1 << 62)
        try:
            writer.write(text.encode())
        finally:
            writer.close()
        return self.finish(session_id, n, meta, total_lines=writer.lines)

    def next_number(self, session_id: str) -> int:
        workdir = self.session_dir(session_id)
        numbers = [int(p.name[4:10]) for p in workdir.glob("cmd-*.json") if p.name[4:10].isdigit()]
        return max(numbers, default=0) + 1

    # -- reading ----------------------------------------------------------------------------------

    def _paths(self, command_id: str) -> tuple[Path, Path]:
        m = COMMAND_ID.fullmatch(command_id or "")
        if not m:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"malformed command id {command_id!r}",
                             expected="<session_id>:<number>, as returned by run_crash_command")
        base = self.root / m["session"] / f"cmd-{int(m['n']):06d}"
        return base.with_suffix(".out"), base.with_suffix(".json")

    def load(self, command_id: str) -> tuple[dict[str, Any], StoredLines]:
        """An output's metadata and its lines, read from disk as they are used (never all at once)."""
        out_path, meta_path = self._paths(command_id)
        try:
            meta: dict[str, Any] = json.loads(read_nofollow(meta_path))
            return meta, StoredLines(out_path, self._index(command_id, out_path))
        except FileNotFoundError:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no stored output {command_id!r}", command_id=command_id) from None
        except (OSError, ValueError) as exc:
            raise DiagdError(ErrorCode.NOT_FOUND, f"stored output {command_id!r} is unreadable: {exc}",
                             command_id=command_id) from None

    def _index(self, command_id: str, out_path: Path) -> LineIndex:
        """The output's line index, rebuilt when the file changed (lstat: never through a symlink)."""
        st = out_path.lstat()
        index = self._indexes.get(command_id)
        if index is None or not index.fresh_for(st):
            index = scan(out_path)
        self._indexes[command_id] = index
        self._indexes.move_to_end(command_id)
        while len(self._indexes) > self._cache_entries:
            self._indexes.popitem(last=False)
        return index

    def page(self, command_id: str, offset: int, limit: int) -> OutputPage:
        meta, lines = self.load(command_id)
        limit = max(1, min(limit, MAX_PAGE_LINES))
        chosen = read_lines(lines.path, lines.line_index, offset, offset + limit)
        end = offset + len(chosen)
        return {"command_id": command_id, "command": meta.get("command"), "engine": meta.get("engine"),
                "session_id": meta.get("session_id"), "context": meta.get("context"), "offset": offset,
                "limit": limit, "returned": len(chosen), "total_lines": len(lines), "output": "\n".join(chosen),
                "has_more": end < len(lines), "next_offset": end if end < len(lines) else None}

    def search(self, command_id: str, matcher: Matcher, *, context_lines: int, max_matches: int) -> SearchReply:
        """Lines where the caller's pattern occurs; `matcher` bounds the matching time (a TIMEOUT names the line)."""
        meta, lines = self.load(command_id)
        matcher.unit, matcher.total = "line", len(lines)
        matches: list[Match] = []
        total = 0
        for i, line in enumerate(lines):
            if matcher.search(line, i):
                total += 1
                if len(matches) < max_matches:
                    lo, hi = max(0, i - context_lines), min(len(lines), i + context_lines + 1)
                    match: Match = {"line_number": i, "line": line}
                    if context_lines:
                        match["before"] = lines[lo:i]
                        match["after"] = lines[i + 1:hi]
                    matches.append(match)
        return {"command_id": command_id, "command": meta.get("command"), "query": matcher.user.source,
                "total_lines": len(lines),
                "match_count": total, "matches": matches, "truncated": total > len(matches)}

    # -- retention --------------------------------------------------------------------------------

    def prune(self, keep: int, live: set[str]) -> list[str]:
        """Remove the oldest session dirs beyond `keep` (never a live session's)."""
        if not self.root.is_dir():
            return []
        dirs = [p for p in self.root.iterdir() if p.is_dir() and SESSION_ID.fullmatch(p.name) and p.name not in live]
        dirs.sort(key=lambda p: p.stat().st_mtime)
        removed = []
        for old in dirs[: max(0, len(dirs) - keep)]:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old.name)
        for sid in removed:
            for cid in [c for c in self._indexes if c.startswith(sid + ":")]:
                del self._indexes[cid]
        return removed
