"""A port session's raw log as pcapng (`export_serial_pcapng`): one packet per Tx/Rx record, streamed.

Blocking file I/O: the tool runs `export_session` in a thread. It reads the log line by line and
writes block by block, so memory stays bounded whatever the session's size.
"""

from __future__ import annotations

import difflib
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from diagd.actors import statefile
from diagd.actors._paths import create_new
from diagd.actors.serial.pcapng import PcapngWriter
from diagd.actors.serial.rawlog import session_logs
from diagd.actors.serial.replies import Copied, Exported
from diagd.actors.serial.settings import port_slug
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode


def export_session(log: Path, out: Path, *, end: int | None, port: str, application: str) -> Exported:
    """Write the Tx/Rx records of `log` (up to byte `end` of a live log) to the new file `out` (0600).

    Timestamps are exact: the log's decimal microseconds are read as decimals, never as floats.
    Records that are not data (session header, settings, signals, ...) are counted, not exported.
    """
    fd = create_new(out)  # a new file: never through a link, never over another file
    try:
        with os.fdopen(fd, "wb", buffering=1 << 16) as sink, \
                open(statefile.open_file(log, os.O_RDONLY), "rb") as source:  # the raw log, never through a link
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


def _copy(source: Any, writer: PcapngWriter, end: int | None) -> Copied:
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


EXTENSION = ".pcapng"


def export_path(out_dir: Path, key: str, keep: int, stem: str | None = None) -> Path:
    """A new name in the back end's exports dir: `<stem>.pcapng` when the caller chose a stem (checked
    by `caller_stem`), else diagd's own; the oldest exports beyond `keep` are removed."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = sorted(out_dir.glob(f"*{EXTENSION}"), key=lambda p: p.stat().st_mtime)
    for old in existing[: max(0, len(existing) - keep + 1)]:
        old.unlink(missing_ok=True)
    name = stem or f"{port_slug(key)}-{utc.compact()}-{os.urandom(3).hex()}"
    return out_dir / f"{name}{EXTENSION}"
