"""A port session's raw log as pcapng (`export_serial_pcapng`): one packet per Tx/Rx record, streamed.

Blocking file I/O: the tool runs `export_session` in a thread. It reads the log line by line and
writes block by block, so memory stays bounded whatever the session's size.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from diagd.actors import statefile
from diagd.actors.serial.pcapng import PcapngWriter
from diagd.actors.serial.rawlog import session_logs
from diagd.actors.serial.settings import port_slug
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def export_session(log: Path, out: Path, *, end: int | None, port: str, application: str) -> dict[str, Any]:
    """Write the Tx/Rx records of `log` (up to byte `end` of a live log) to the new file `out` (0600).

    Timestamps are exact: the log's decimal microseconds are read as decimals, never as floats.
    Records that are not data (session header, settings, signals, ...) are counted, not exported.
    """
    with open(statefile.open_file(log, os.O_RDONLY), "rb") as source:  # the raw log, never read through a link
        fd = os.open(out, _CREATE, 0o600)  # a new file: never through a link, never over another file
        try:
            with os.fdopen(fd, "wb", buffering=1 << 16) as sink:
                header = _first_record(source)
                writer = PcapngWriter(sink, application=application,
                                      comment=f"serial session {log.name} of {port}, exported by {application}",
                                      if_name=port, if_description=_describe(log, header))
                return {**_copy(source, writer, end), "session_started": header.get("ts")}
        except BaseException:
            out.unlink(missing_ok=True)
            raise


def _first_record(source: Any) -> dict[str, Any]:
    line = source.readline()
    source.seek(0)
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) and record.get("event") == "session" else {}


def _describe(log: Path, header: dict[str, Any]) -> str:
    settings = header.get("settings") or {}
    line = "".join(str(settings.get(k, "?")) for k in ("bytesize", "parity", "stopbits"))
    return (f"diagd serial session {log.stem}: device {header.get('device', '?')}, "
            f"{settings.get('baudrate', '?')} baud {line}")


def _copy(source: Any, writer: PcapngWriter, end: int | None) -> dict[str, Any]:
    counts = {"tx": [0, 0], "rx": [0, 0]}  # packets, bytes
    events = 0
    unreadable = 0
    log_limit = False
    first = last = None
    pos = 0
    for line in source:
        pos += len(line)
        if (end is not None and pos > end) or not line.endswith(b"\n"):
            break  # past the snapshot of a live log, or a record still being written
        try:
            record = json.loads(line, parse_float=Decimal)
            direction = record["dir"]
            if direction not in counts:
                events += 1
                log_limit = log_limit or record.get("event") == "log_limit"
                continue
            data = bytes.fromhex(record["hex"])
            ts_us = int(Decimal(record["ts"]) * 1_000_000)
        except (ValueError, KeyError, TypeError, ArithmeticError):
            unreadable += 1
            continue
        writer.packet(ts_us, data, inbound=direction == "rx")
        counts[direction][0] += 1
        counts[direction][1] += len(data)
        first = record["ts"] if first is None else first
        last = record["ts"]
    return {"packets": writer.packets, "tx_packets": counts["tx"][0], "rx_packets": counts["rx"][0],
            "tx_bytes": counts["tx"][1], "rx_bytes": counts["rx"][1],
            "first_ts": None if first is None else float(first), "last_ts": None if last is None else float(last),
            "events": events, "unreadable_records": unreadable, "log_limit_reached": log_limit}


def find_session(log_dir: Path, key: str, session: str) -> Path:
    """The session log `session` names (its file name as get_log's log_file shows it, with or without
    the directory and .jsonl), among this port's kept sessions only: no other file can be named."""
    logs = session_logs(log_dir, key)
    wanted = os.path.basename(session.strip())
    for path in logs:
        if wanted in (path.name, path.stem):
            return path
    names = [path.name for path in reversed(logs)]
    raise DiagdError(ErrorCode.NOT_FOUND, f"no session {session!r} of {key}" if logs else f"no raw log for {key}",
                     port=key, sessions=names[:20], did_you_mean=difflib.get_close_matches(wanted, names, n=3))


def export_path(out_dir: Path, key: str, keep: int) -> Path:
    """A fresh name in the back end's exports dir; the oldest exports beyond `keep` are removed."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = sorted(out_dir.glob("*.pcapng"), key=lambda p: p.stat().st_mtime)
    for old in existing[: max(0, len(existing) - keep + 1)]:
        old.unlink(missing_ok=True)
    return out_dir / f"{port_slug(key)}-{utc.compact()}-{os.urandom(3).hex()}.pcapng"


def new_file_in(raw: str, allowed_dirs: Sequence[str], *, cwd: str | None) -> Path:
    """A caller-named output file: a new name in an existing directory inside [daemon] allowed_dirs
    (symlinks resolved). With no allowed_dirs the caller may not pick where the daemon writes."""
    if not allowed_dirs:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, "out_path needs [daemon] allowed_dirs (the directories "
                         "callers may name); without it exports go only to diagd's state dir",
                         argument="out_path", hint="omit out_path")
    if not raw or "\0" in raw:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "out_path is empty or contains NUL", argument="out_path")
    path = Path(os.path.expanduser(raw))
    if not path.is_absolute():
        if cwd is None or not os.path.isabs(cwd):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"out_path {raw!r} is relative and the caller's working "
                             "directory is unknown", argument="out_path", hint="pass an absolute path")
        path = Path(cwd) / path
    if path.name in ("", ".", "..") or raw.endswith("/"):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"out_path {raw!r} names no file", argument="out_path")
    try:
        parent = path.parent.resolve(strict=True)
    except (OSError, RuntimeError):
        raise DiagdError(ErrorCode.FILE_NOT_FOUND, f"out_path's directory {path.parent} does not exist",
                         argument="out_path") from None
    roots = [Path(d).expanduser().resolve() for d in allowed_dirs]
    if not any(parent == root or root in parent.parents for root in roots):
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{parent} is outside the allowed directories",
                         argument="out_path", allowed_dirs=[str(r) for r in roots])
    out = parent / path.name
    if os.path.lexists(out):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"out_path {out} exists: exports never overwrite a file",
                         argument="out_path", hint="name a new file")
    return out
