"""The raw Tx/Rx log of one port session (format in `diagd.actors.serial`): writing, pruning, paging."""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors import statefile
from diagd.actors.serial.codec import decode
from diagd.actors.serial.replies import LogPage, LogRecord
from diagd.actors.serial.settings import SerialConfig, port_slug
from diagd.protocol import utc


class RawLog:
    """Append-only JSON-lines log of one port session (format in `diagd.actors.serial`).

    Each record is written with one `os.write` on an O_APPEND fd (no user-space buffer): a record
    is in the page cache before the next read from the port, so a daemon crash loses nothing that
    was logged. A sparse index (every `INDEX_EVERY` records) makes paging O(page), not O(file).
    """

    INDEX_EVERY = 64

    def __init__(self, path: Path, *, max_bytes: int, header: dict[str, Any], wall: float) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.records = 0
        self.size = 0
        self.unlogged_bytes = 0  # data bytes past max_bytes (reported, never silent)
        self._index: list[int] = []
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.event("session", wall, **header)

    @property
    def closed(self) -> bool:
        return self._fd is None

    def data(self, direction: str, data: bytes, wall: float) -> int:
        """Log Tx or Rx bytes; returns the record index (-1 past the size limit or after close)."""
        if self._fd is None or self.size >= self.max_bytes:
            if self._fd is not None and self.unlogged_bytes == 0:
                self.event("log_limit", wall, max_bytes=self.max_bytes)
            self.unlogged_bytes += len(data)
            return -1
        return self._append({"ts": round(wall, 6), "dir": direction, "hex": data.hex().upper()})

    def event(self, name: str, wall: float, **info: Any) -> int:
        if self._fd is None:
            return -1
        return self._append({"ts": round(wall, 6), "dir": "event", "event": name, **info})

    def _append(self, record: dict[str, Any]) -> int:
        assert self._fd is not None
        line = json.dumps(record, separators=(",", ":"), default=str).encode() + b"\n"
        if self.records % self.INDEX_EVERY == 0:
            self._index.append(self.size)
        os.write(self._fd, line)
        self.size += len(line)
        self.records += 1
        return self.records - 1

    def close(self, wall: float, **info: Any) -> None:
        if self._fd is not None:
            self.event("closed", wall, **info)
            fd, self._fd = self._fd, None
            os.close(fd)

    def snapshot(self) -> LogView:
        """A consistent view for a reader thread: only what is written now."""
        return LogView(self.path, self.records, self.size, list(self._index), self.INDEX_EVERY)


@dataclass(frozen=True)
class LogView:
    path: Path
    records: int | None  # None: unknown (a closed session's file), count while reading
    size: int | None
    index: list[int]
    every: int


def read_log_page(view: LogView, offset: int, limit: int, byte_budget: int,
                  *, as_hex: bool = False) -> LogPage:
    """Records [offset, offset+limit) of a log, stopping early past `byte_budget` data bytes.

    Blocking file I/O: run it in a thread.
    """
    slot = min(offset // view.every, len(view.index) - 1) if view.index else -1
    pos, rec = (view.index[slot], slot * view.every) if slot >= 0 else (0, 0)
    out: list[LogRecord] = []
    budget = byte_budget
    next_offset: int | None = None
    with open(statefile.open_file(view.path, os.O_RDONLY), "rb") as f:
        f.seek(pos)
        end = view.size if view.size is not None else math.inf
        while pos < end:
            line = f.readline()
            if not line or not line.endswith(b"\n"):
                break  # a record still being written by another process
            pos += len(line)
            if rec >= offset:
                if len(out) >= limit or (out and budget <= 0):
                    next_offset = rec
                    break
                item = _render(rec, json.loads(line), as_hex=as_hex)
                budget -= int(item.get("bytes", 0))
                out.append(item)
            rec += 1
        total = view.records
        if total is None:  # count the rest of a closed session's file
            total = rec + (1 if next_offset is not None else 0)
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    if next_offset is None and offset + len(out) < total:
        next_offset = offset + len(out)
    return {"offset": offset, "returned": len(out), "total_records": total, "next_offset": next_offset,
            "records": out}


def _render(index: int, record: dict[str, Any], *, as_hex: bool) -> LogRecord:
    if record.get("dir") in ("tx", "rx"):
        raw = bytes.fromhex(record.get("hex", ""))
        text, fmt = decode(raw, as_hex=as_hex)
        return {"i": index, "ts": record.get("ts"), "dir": record["dir"], "data": text, "format": fmt,
                "bytes": len(raw)}
    info = {k: v for k, v in record.items() if k not in ("ts", "dir", "event")}
    return {"i": index, "ts": record.get("ts"), "dir": "event", "event": record.get("event"), "info": info}



def session_logs(log_dir: Path, key: str) -> list[Path]:
    """This port's session logs, oldest first (exact names: another port's slug may extend ours)."""
    pattern = re.compile(re.escape(port_slug(key)) + r"-(\d{8}T\d{9}Z)(?:-(\d+))?\.jsonl")
    found = []
    for entry in os.scandir(log_dir) if log_dir.is_dir() else []:
        if m := pattern.fullmatch(entry.name):
            found.append(((m[1], int(m[2] or 0)), Path(entry.path)))
    return [path for _, path in sorted(found)]


def new_log(log_dir: Path, key: str, config: SerialConfig, header: dict[str, Any]) -> RawLog:
    """A new session log for port `key`, pruning its oldest so that [serial] log_keep remain.

    Blocking file I/O: run it in a thread.
    """
    statefile.ensure_dir(log_dir)  # never a link: the logs hold what the devices said
    slug = port_slug(key)
    existing = session_logs(log_dir, key)
    for old in existing[: max(0, len(existing) - config.log_keep + 1)]:
        old.unlink(missing_ok=True)
    wall = time.time()
    stamp = utc.compact(wall, digits=3)
    for n in range(1000):
        path = log_dir / f"{slug}-{stamp}{'' if n == 0 else f'-{n}'}.jsonl"
        try:
            return RawLog(path, max_bytes=config.log_max_bytes, header=header, wall=wall)
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot find a free log file name for {key}")
