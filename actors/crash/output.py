"""One command output on disk: written as it is produced, read back a page at a time.

crash and drgn outputs can be tens of megabytes. Nobody keeps one in memory: `OutputWriter` streams
it to its `.out` file (crash's pty thread in the daemon, the drgn worker in its own process), keeps
only the first `head_bytes` for the reply and counts bytes and lines; past `limit` the output is cut
and flagged. Reading goes through a sparse `LineIndex` (the byte offset of every 1024th line, found
by one scan of the file) so a page anywhere costs a seek and at most 1023 skipped lines, and
`StoredLines` offers a stored output as a read-only sequence of lines for search and reports.

A line is what ends in "\\n" (a last line without one counts too). Files are read as UTF-8 with
invalid bytes replaced. Stdlib only: the drgn worker imports this before drgn.

drgn code may write in its session directory, so a stored file is never trusted to be ours: files
are created fresh (an existing name is unlinked first, then O_EXCL) and opened without following
symlinks, and only a regular file with a single link is read (a hard link to a file elsewhere is not).
"""

from __future__ import annotations

import errno
import os
import stat
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO, Protocol, overload

HEAD_BYTES = 64 * 1024  # what the daemon keeps of an output for the reply (and its cache)
INDEX_STRIDE = 1024
MAX_LINE_BYTES = 256 * 1024  # a longer line is cut when read back (a page stays a page)
_SCAN_CHUNK = 1 << 20
_CUT_MARK = " [... line cut]"


class ByteSink(Protocol):
    """Where an output's bytes go: its file, or (the drgn worker) the frames that carry it to the daemon."""

    def write(self, data: bytes | bytearray, /) -> int | None: ...

    def close(self) -> None: ...


class OutputWriter:
    """Streams one output to `path`: the first `head_bytes` kept, bytes and lines counted, cut at `limit`.

    The file is created owner-only and never through a symlink (it lives in a session directory
    that drgn code may write to).
    """

    def __init__(self, path: str | Path | None, limit: int, head_bytes: int = HEAD_BYTES, *,
                 stream: ByteSink | None = None) -> None:
        """Onto a fresh file at `path`, or, with `stream` (and no path), onto that stream."""
        if stream is None:
            if path is None:
                raise ValueError("OutputWriter needs a path or a stream")
            Path(path).unlink(missing_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            stream = os.fdopen(fd, "wb", buffering=_SCAN_CHUNK)
        self.path = None if path is None else Path(path)
        self.limit = max(0, limit)
        self.head_bytes = head_bytes
        self.size = 0
        self.newlines = 0
        self.truncated = False
        self._head = bytearray()
        self.ends_with_newline = True
        self._file: ByteSink | None = stream

    def write(self, data: bytes | bytearray) -> None:
        """Append what fits under the limit; the rest is dropped and `truncated` set."""
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:max(0, room)]
        self._append(data)

    def append_unlimited(self, data: bytes) -> None:
        """Append past the limit: a short trailer (drgn's traceback) that must not be lost to the cap."""
        self._append(data)

    def _append(self, data: bytes | bytearray) -> None:
        if not data or self._file is None:
            return
        self._file.write(data)
        self.size += len(data)
        self.newlines += data.count(b"\n")
        self.ends_with_newline = data.endswith(b"\n")
        if len(self._head) < self.head_bytes:
            self._head += data[:self.head_bytes - len(self._head)]

    @property
    def lines(self) -> int:
        return self.newlines + (0 if self.ends_with_newline else 1)

    @property
    def head(self) -> str:
        return self._head.decode(errors="replace")

    def head_lines(self, limit: int) -> list[str]:
        return head_lines(self.head, complete=self.size <= len(self._head))[:limit]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def head_lines(head: str, *, complete: bool) -> list[str]:
    """The whole lines in `head`; when the output goes on past it, its last partial line is dropped
    (unless it is the only one: a giant first line is shown cut)."""
    lines = head.split("\n")
    if lines and lines[-1] == "" and (complete or len(lines) > 1):
        lines.pop()  # the final newline ends a line rather than starting an empty one
    elif not complete and len(lines) > 1:
        lines.pop()
    return lines


def open_nofollow(path: Path) -> BinaryIO:
    """Open a stored file for reading: no symlink, a regular file with one link, else OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular file of its own", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_nofollow(path: Path) -> bytes:
    with open_nofollow(path) as f:
        return f.read()


@dataclass(frozen=True)
class LineIndex:
    """Where lines start in one file: offsets[k] is the byte offset of line k * INDEX_STRIDE."""

    total: int
    offsets: array[int]
    size: int
    mtime_ns: int

    def fresh_for(self, st: os.stat_result) -> bool:
        return st.st_size == self.size and st.st_mtime_ns == self.mtime_ns


def scan(path: Path) -> LineIndex:
    """Count the lines of `path` and note every INDEX_STRIDE-th line's offset (one pass, C loops only)."""
    offsets = array("Q", [0])
    newlines = 0
    base = 0
    last = b"\n"
    with open_nofollow(path) as f:
        st = os.fstat(f.fileno())
        while chunk := f.read(_SCAN_CHUNK):
            parts = chunk.split(b"\n")
            # byte offset (in this chunk) just past each newline = cumulative (part length + 1)
            ends = list(accumulate(map((1).__add__, map(len, parts[:-1]))))
            first = (-(newlines + 1)) % INDEX_STRIDE  # the newline that starts line k * INDEX_STRIDE
            offsets.extend(base + e for e in ends[first::INDEX_STRIDE])
            newlines += len(ends)
            base += len(chunk)
            last = chunk[-1:]
    total = newlines + (1 if base and last != b"\n" else 0)
    return LineIndex(total, offsets, st.st_size, st.st_mtime_ns)


def _read_line(f: BinaryIO) -> bytes | None:
    """One line without its newline, cut at MAX_LINE_BYTES (the rest of it is skipped); None at EOF."""
    raw = f.readline(MAX_LINE_BYTES)
    if not raw:
        return None
    if raw.endswith(b"\n"):
        return raw[:-1]
    if len(raw) == MAX_LINE_BYTES:
        rest = raw
        while rest and not rest.endswith(b"\n"):
            rest = f.readline(_SCAN_CHUNK)
        return raw + _CUT_MARK.encode()
    return raw


def read_lines(path: Path, index: LineIndex, start: int, stop: int) -> list[str]:
    """Lines start..stop-1 of `path` (clamped to the file), found through `index`."""
    start, stop = max(0, start), min(stop, index.total)
    if start >= stop:
        return []
    checkpoint = min(start // INDEX_STRIDE, len(index.offsets) - 1)
    out: list[str] = []
    with open_nofollow(path) as f:
        f.seek(index.offsets[checkpoint])
        line_no = checkpoint * INDEX_STRIDE
        while line_no < stop:
            raw = _read_line(f)
            if raw is None:
                break
            if line_no >= start:
                out.append(raw.decode(errors="replace"))
            line_no += 1
    return out


def iter_lines(path: Path) -> Iterator[str]:
    with open_nofollow(path) as f:
        while (raw := _read_line(f)) is not None:
            yield raw.decode(errors="replace")


class StoredLines(Sequence[str]):
    """A stored output as a read-only sequence of lines, read from disk when asked (never all at once)."""

    def __init__(self, path: Path, index: LineIndex) -> None:
        self.path = path
        self.line_index = index

    def __len__(self) -> int:
        return self.line_index.total

    def __iter__(self) -> Iterator[str]:
        return iter_lines(self.path)

    @overload
    def __getitem__(self, item: int) -> str: ...

    @overload
    def __getitem__(self, item: slice) -> list[str]: ...

    def __getitem__(self, item: int | slice) -> str | list[str]:
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step == 1:
                return read_lines(self.path, self.line_index, start, stop)
            return [self[i] for i in range(start, stop, step)]
        i = item + len(self) if item < 0 else item
        if not 0 <= i < len(self):
            raise IndexError(item)
        return read_lines(self.path, self.line_index, i, i + 1)[0]
