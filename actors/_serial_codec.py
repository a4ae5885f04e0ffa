"""Pure helpers of the serial actor: hex, packet decoding, the idle slicer, reply matching, the URC
buffer, the raw Tx/Rx log (format documented in `diagd.actors.serial`), settings and tool schemas.

Nothing here awaits or reads a clock: callers pass the Trio time (`now`) and the wall time
(`wall`), so every timer is testable on `MockClock` and every rule is testable without a port.
"""

from __future__ import annotations

import enum
import json
import math
import os
import posixpath
import re
import string
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagd.actors.settings import parse_table, setting
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

_HEX_DIGITS = frozenset(string.hexdigits)
# C0 controls except TAB, LF, CR and ESC (ANSI colours in boot logs), DEL, and C1 controls.
_CONTROL_GARBAGE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f]")


def to_hex(data: bytes) -> str:
    """`b"\\n\\r\\xff"` -> `"0A 0D FF"`."""
    return data.hex(" ").upper()


def parse_hex(text: str, *, what: str = "payload") -> bytes:
    """Hex digits in pairs, optionally separated by whitespace (`"0A 0D FF"`, `"0a0dff"`).

    Errors name the argument and the 0-based position of the offending character.
    """
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        j = i
        while j < n and not text[j].isspace():
            j += 1
        token = text[i:j]
        for k, ch in enumerate(token):
            if ch not in _HEX_DIGITS:
                raise DiagdError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"{what} is not hex: {ch!r} at position {i + k}",
                    argument=what, position=i + k, character=ch,
                    hint="write bytes as pairs of hex digits, e.g. '0A 0D FF' or '0A0DFF' (no 0x prefixes)")
        if len(token) % 2:
            raise DiagdError(
                ErrorCode.INVALID_ARGUMENT,
                f"{what} has an odd number of hex digits: {token!r} at position {i} leaves its last digit "
                f"(position {j - 1}) unpaired",
                argument=what, position=j - 1, character=token[-1],
                hint="every byte is two hex digits, e.g. '0A' not 'A'")
        out += bytes.fromhex(token)
        i = j
    return bytes(out)


# Backslash escapes in utf8 payloads and stop patterns. Interpreted here, by the tool, rather than by
# one client: the same spelling then works through MCP (an agent that writes "AT\\r" in JSON), on
# the `diagd call` command line (payload='AT\r' reaches the daemon with its backslash) and in a
# JSON value (a real CR, which has no backslash to interpret). Unknown escapes are refused, not
# passed through, so a typo never silently sends different bytes; escapes=false sends text as is.
_ESCAPES = {"r": b"\r", "n": b"\n", "t": b"\t", "\\": b"\\"}
ESCAPES_HELP = "\\r \\n \\t, \\\\ for a backslash, \\xHH for any byte (\\x1a is Ctrl-Z)"


def unescape(text: str, *, what: str) -> bytes:
    """UTF-8 bytes of `text` with the escapes of ESCAPES_HELP turned into the bytes they name.

    Errors name the argument and the 0-based position of the backslash.
    """
    out = bytearray()
    i = 0
    while (j := text.find("\\", i)) >= 0:
        out += text[i:j].encode()
        code = text[j + 1:j + 2]
        digits = text[j + 2:j + 4]
        if code in _ESCAPES:
            out += _ESCAPES[code]
            i = j + 2
        elif code == "x" and len(digits) == 2 and set(digits) <= _HEX_DIGITS:
            out.append(int(digits, 16))
            i = j + 4
        else:
            shown = text[j:j + 4] if code == "x" else text[j:j + 2]
            problem = "\\x needs two hex digits" if code == "x" else "unknown escape"
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{what}: {problem} {shown!r} at position {j}",
                             argument=what, position=j, escape=shown,
                             hint=f"escapes: {ESCAPES_HELP}; or escapes=false to send the text as it is")
    out += text[i:].encode()
    return bytes(out)


def decode(data: bytes, *, as_hex: bool = False, cut: bool = False) -> tuple[str, str]:
    """(data, format): UTF-8 text when it is valid text without control garbage, else spaced hex.

    `cut`: `data` is a prefix cut at a size cap, so an incomplete last character is dropped.
    """
    if not as_hex:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if cut and exc.reason == "unexpected end of data" and exc.start >= len(data) - 3:
                return decode(data[:exc.start], as_hex=as_hex)
        else:
            if not _CONTROL_GARBAGE.search(text):
                return text, "text"
    return to_hex(data), "hex"


@dataclass(frozen=True)
class Packet:
    data: bytes
    ts: float  # wall-clock time of the first byte (Unix seconds)
    t_first: float  # Trio clock at the first byte
    t_last: float  # Trio clock at the last byte
    split: bool = False  # cut at the size cap: the next packet continues it

    def to_json(self, *, as_hex: bool = False) -> dict[str, Any]:
        text, fmt = decode(self.data, as_hex=as_hex)
        return {"ts": round(self.ts, 6), "data": text, "format": fmt, "bytes": len(self.data), "split": self.split}


class Slicer:
    """Cuts a byte stream into packets at idle gaps of at least `idle_s`, or at `max_bytes`.

    `deadline` is the Trio time at which the pending packet ends unless more bytes arrive; every
    `feed` moves it to `now + idle_s`. It is `inf` when nothing is pending.
    """

    def __init__(self, idle_s: float, max_bytes: int) -> None:
        self.idle_s = idle_s
        self.max_bytes = max_bytes
        self.deadline = math.inf
        self._buf = bytearray()
        self._ts = self._t_first = self._t_last = 0.0

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes, now: float, wall: float) -> list[Packet]:
        out: list[Packet] = []
        view = memoryview(data)
        while view:
            if not self._buf:
                self._ts, self._t_first = wall, now
            room = self.max_bytes - len(self._buf)
            self._buf += view[:room]
            view = view[room:]
            self._t_last = now
            if len(self._buf) >= self.max_bytes:
                out.append(self._take(split=True))
        self.deadline = now + self.idle_s if self._buf else math.inf
        return out

    def flush(self) -> Packet | None:
        self.deadline = math.inf
        return self._take(split=False) if self._buf else None

    def _take(self, *, split: bool) -> Packet:
        packet = Packet(bytes(self._buf), self._ts, self._t_first, self._t_last, split)
        self._buf.clear()
        return packet


class ReplyCollector:
    """The bytes of one send_data reply: capped copy, total count, and stop-pattern matching.

    A match may span reads. The reply ends right after the earliest-completing pattern (plus the
    CR/LF bytes that follow it in the same read when `absorb_line_end`); `feed` returns what
    follows, which is not part of the reply.
    """

    def __init__(self, patterns: Sequence[bytes], cap: int, *, absorb_line_end: bool = True) -> None:
        self.patterns = [p for p in patterns if p]
        self.cap = cap
        self.absorb_line_end = absorb_line_end
        self.data = bytearray()
        self.total = 0
        self.matched: bytes | None = None
        self._keep = max((len(p) for p in self.patterns), default=1) - 1
        self._tail = b""

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def feed(self, chunk: bytes) -> bytes:
        if self.matched is not None:
            return chunk
        if self.patterns:
            window = self._tail + chunk
            best: tuple[int, bytes] | None = None
            for pattern in self.patterns:
                at = window.find(pattern)
                if at >= 0 and (best is None or at + len(pattern) < best[0]):
                    best = (at + len(pattern), pattern)
            if best is not None:
                end = best[0] - len(self._tail)  # >= 1: the tail alone never holds a whole match
                if self.absorb_line_end:
                    while end < len(chunk) and chunk[end] in b"\r\n":
                        end += 1
                self._take(chunk[:end])
                self.matched = best[1]
                return chunk[end:]
            self._tail = window[-self._keep:] if self._keep else b""
        self._take(chunk)
        return b""

    def _take(self, part: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += part[:room]
        self.total += len(part)


class UrcBuffer:
    """Unsolicited packets, oldest first, bounded in packets and bytes; overflow drops the oldest
    and counts it (reported by read_urc and connection_status, never silent)."""

    def __init__(self, max_packets: int, max_bytes: int) -> None:
        self.max_packets = max_packets
        self.max_bytes = max_bytes
        self._queue: deque[Packet] = deque()
        self._bytes = 0
        self.dropped = 0  # since the last consuming read
        self.dropped_total = 0
        self.received_total = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        return self._bytes

    def push(self, packet: Packet) -> None:
        self._queue.append(packet)
        self._bytes += len(packet.data)
        self.received_total += 1
        while len(self._queue) > 1 and (len(self._queue) > self.max_packets or self._bytes > self.max_bytes):
            old = self._queue.popleft()
            self._bytes -= len(old.data)
            self.dropped += 1
            self.dropped_total += 1

    def take(self, max_packets: int, max_bytes: int, *, peek: bool = False) -> tuple[list[Packet], int]:
        """Up to `max_packets` oldest packets within `max_bytes` (always at least one if any), and
        the drop count since the last consuming read (reset unless `peek`)."""
        out: list[Packet] = []
        size = 0
        for packet in self._queue:
            if len(out) >= max_packets or (out and size + len(packet.data) > max_bytes):
                break
            out.append(packet)
            size += len(packet.data)
        dropped = self.dropped
        if not peek:
            for _ in out:
                self._bytes -= len(self._queue.popleft().data)
            self.dropped = 0
        return out, dropped


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
                  *, as_hex: bool = False) -> dict[str, Any]:
    """Records [offset, offset+limit) of a log, stopping early past `byte_budget` data bytes.

    Blocking file I/O: run it in a thread.
    """
    slot = min(offset // view.every, len(view.index) - 1) if view.index else -1
    pos, rec = (view.index[slot], slot * view.every) if slot >= 0 else (0, 0)
    out: list[dict[str, Any]] = []
    budget = byte_budget
    next_offset: int | None = None
    with open(view.path, "rb") as f:
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


def _render(index: int, record: dict[str, Any], *, as_hex: bool) -> dict[str, Any]:
    if record.get("dir") in ("tx", "rx"):
        raw = bytes.fromhex(record.get("hex", ""))
        text, fmt = decode(raw, as_hex=as_hex)
        return {"i": index, "ts": record.get("ts"), "dir": record["dir"], "data": text, "format": fmt,
                "bytes": len(raw)}
    info = {k: v for k, v in record.items() if k not in ("ts", "dir", "event")}
    return {"i": index, "ts": record.get("ts"), "dir": "event", "event": record.get("event"), "info": info}


# -- settings, names and tool schemas (pure data) ----------------------------------------------

LINE_ENDINGS = {"none": b"", "cr": b"\r", "lf": b"\n", "crlf": b"\r\n"}
SETTING_KEYS = ("baudrate", "bytesize", "parity", "stopbits", "rtscts", "xonxoff", "dsrdtr", "idle_ms", "line_ending")


class PortState(enum.StrEnum):
    OPENING = "Opening"
    CONNECTED = "Connected"
    DISCONNECTED = "Disconnected"
    OCCUPIED = "Occupied"
    CLOSED = "Closed"


@dataclass(frozen=True)
class SerialConfig:
    """The [serial] config table."""

    allowed_ports: tuple[str, ...] = ()
    baudrate: int = setting(115200, positive=True)
    idle_ms: int = setting(50, positive=True)
    max_reply_bytes: int = setting(4096, positive=True)
    urc_max_packets: int = setting(1000, positive=True)
    urc_max_bytes: int = setting(1 << 20, positive=True)
    write_timeout_ms: int = setting(5000, positive=True)
    log_max_bytes: int = setting(1 << 30, positive=True)
    log_keep: int = setting(20, positive=True)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SerialConfig:
        return parse_table(cls, "serial", raw)


@dataclass(frozen=True)
class PortSettings:
    baudrate: int = 115200
    bytesize: int = 8
    parity: str = "N"
    stopbits: float = 1
    rtscts: bool = False
    xonxoff: bool = False
    dsrdtr: bool = False
    idle_ms: int = 50
    line_ending: str = "none"  # appended to utf8 payloads unless send_data says otherwise

    def pyserial(self) -> dict[str, Any]:
        return {"baudrate": self.baudrate, "bytesize": self.bytesize, "parity": self.parity,
                "stopbits": self.stopbits, "rtscts": self.rtscts, "xonxoff": self.xonxoff, "dsrdtr": self.dsrdtr}


def port_key(raw: str) -> str:
    """The name a port is known by: as given (links kept), `ttyUSB0` meaning `/dev/ttyUSB0`."""
    raw = raw.strip()
    if not raw or "\0" in raw:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "port is empty or contains NUL", argument="port")
    return posixpath.normpath(raw if raw.startswith("/") else f"/dev/{raw}")


def port_slug(key: str) -> str:
    return key.strip("/").replace("/", "_") or "port"


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return utc.iso(ts, digits=3)


_PORT = {"type": "string", "minLength": 1,
         "description": "Device path, e.g. /dev/ttyUSB0 or a /dev/serial/by-id link (a bare name means /dev/<name>)."}
_AS_HEX = {"type": "boolean", "default": False,
           "description": "Always return data as hex, even when it would decode as text."}
_NULLABLE_STR = {"type": ["string", "null"]}
_STATES = [str(s) for s in PortState]
_PORT_STATUS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "port": {"type": "string"}, "device": _NULLABLE_STR, "state": {"enum": _STATES}, "owner": _NULLABLE_STR,
        "you_own": {"type": "boolean"}, "settings": {"type": "object"}, "bytes_in": {"type": "integer"},
        "bytes_out": {"type": "integer"}, "pending_urc_count": {"type": "integer"},
        "urc_dropped": {"type": "integer"}, "log_file": _NULLABLE_STR, "holders": {"type": "array"},
    },
    "required": ["port", "state"],
}
_PACKET = {
    "type": "object",
    "properties": {"ts": {"type": "number"}, "data": {"type": "string"}, "format": {"enum": ["text", "hex"]},
                   "bytes": {"type": "integer"}, "split": {"type": "boolean"}},
    "required": ["ts", "data", "format", "bytes"],
}


def _tool(description: str, properties: dict[str, Any], output: dict[str, Any], *, required: tuple[str, ...] = (),
          title: str, read_only: bool = True, idempotent: bool = True, destructive: bool = False,
          timeout_s: float | None = None) -> dict[str, Any]:
    return {"description": description, "title": title, "read_only": read_only, "idempotent": idempotent,
            "destructive": destructive, "timeout_s": timeout_s,
            "input_schema": {"type": "object", "properties": properties, "required": list(required),
                             "additionalProperties": False},
            "output_schema": output}


TOOLS: dict[str, dict[str, Any]] = {
    "list_ports": _tool(
        "Every serial port with its description and hardware id (e.g. '/dev/ttyUSB0 - CP2102'), whether "
        "[serial] allowed_ports permits it, its state in diagd, and the ports added/removed since your last call "
        "(hot-plug).",
        {},
        {"type": "object", "properties": {
            "ports": {"type": "array", "items": {"type": "object", "properties": {
                "port": {"type": "string"}, "description": {"type": "string"}, "hwid": {"type": "string"},
                "label": {"type": "string"}, "allowed": {"type": "boolean"}, "state": {"enum": _STATES}},
                "required": ["port", "description", "hwid", "label", "allowed", "state"]}},
            "count": {"type": "integer"}, "added": {"type": "array", "items": {"type": "string"}},
            "removed": {"type": "array", "items": {"type": "string"}}, "first_call": {"type": "boolean"}},
         "required": ["ports", "count", "added", "removed", "first_call"]},
        title="List serial ports"),
    "configure_connection": _tool(
        "Open a serial port (action=open, the default) and keep it open in the daemon: its output is read "
        "continuously, sliced into packets at idle gaps of idle_ms, and kept in the URC buffer between calls. "
        "Calling open again on an open port changes its settings; on a Disconnected port it reopens it. "
        "action=close releases it. The port belongs to the client that opened it; force=true takes over a "
        "port held by another connected client. dtr/rts set the lines (at open: before the port is opened, so "
        "dtr=false avoids the reset pulse many boards get).",
        {"port": _PORT,
         "action": {"enum": ["open", "close"], "default": "open"},
         "baudrate": {"type": "integer", "minimum": 50, "maximum": 16000000},
         "bytesize": {"type": "integer", "enum": [5, 6, 7, 8]},
         "parity": {"enum": ["N", "E", "O", "M", "S"], "description": "none, even, odd, mark, space"},
         "stopbits": {"type": "number", "enum": [1, 1.5, 2]},
         "rtscts": {"type": "boolean", "description": "RTS/CTS hardware flow control"},
         "xonxoff": {"type": "boolean", "description": "XON/XOFF software flow control"},
         "dsrdtr": {"type": "boolean", "description": "DSR/DTR hardware flow control"},
         "idle_ms": {"type": "integer", "minimum": 1, "maximum": 10000,
                     "description": "an idle gap this long ends a packet (default [serial] idle_ms, 50)"},
         "line_ending": {"enum": list(LINE_ENDINGS),
                         "description": "appended to utf8 payloads of send_data by default (default none)"},
         "dtr": {"type": "boolean"}, "rts": {"type": "boolean"},
         "force": {"type": "boolean", "default": False}},
        {"type": "object", "properties": {
            **_PORT_STATUS["properties"], "success": {"type": "boolean"}, "action": {"enum": ["open", "close"]},
            "outcome": {"enum": ["opened", "reconfigured", "reopened", "closed"]},
            "took_over_from": _NULLABLE_STR, "discarded_urc_packets": {"type": "integer"}},
         "required": ["success", "action", "outcome", "port", "state"]},
        required=("port",), title="Open, reconfigure or close a serial port", read_only=False, idempotent=False,
        timeout_s=60),
    "connection_status": _tool(
        "State of one port (Connected, Disconnected, Occupied: held by another client or program, Closed) or, "
        "without port, of every port open in diagd: owner, settings, bytes in/out, pending and dropped URC "
        "packets, raw log file. For a port diagd has not opened it lists the processes holding it.",
        {"port": _PORT},
        {"type": "object", "properties": {"ports": {"type": "array", "items": _PORT_STATUS}}, "required": ["ports"]},
        title="Serial connection status"),
    "send_data": _tool(
        "Write payload to an open port and collect the reply. wait_policy=keyword: read until one of "
        "stop_pattern appears (e.g. ['OK\\r\\n', 'ERROR\\r\\n'], or '> ' for a prompt); on timeout return what "
        "arrived with timed_out=true. timeout: wait timeout_ms and return everything received in it. none: return "
        "once written; later output goes to the URC buffer. Default: keyword if stop_pattern is given, else "
        "timeout. The reply is the bytes received after the write, up to the end of the matched pattern (and "
        "the CR/LF right after it); what follows goes to the URC buffer. In utf8 payload and stop_pattern the "
        f"tool reads backslash escapes: {ESCAPES_HELP}; a backslash and r, or a real CR, send the same byte "
        "(escapes=false sends backslashes as they are). encoding=hex: payload (and stop_pattern, "
        "unless stop_pattern_encoding says otherwise) are hex ('0A 0D FF'). data is UTF-8 text when it is clean "
        "text, else uppercase hex (format says which). "
        "Replies past [serial] max_reply_bytes are cut (truncated=true); the raw log keeps every byte "
        "(get_log from log_offset). The tool never interprets the reply: success means written and waited.",
        {"port": _PORT,
         "payload": {"type": "string",
                     "description": f"text (utf8, escapes: {ESCAPES_HELP}) or hex bytes; empty: write nothing, "
                                    "just listen"},
         "encoding": {"enum": ["utf8", "hex"], "default": "utf8"},
         "wait_policy": {"enum": ["keyword", "timeout", "none"]},
         "stop_pattern": {"type": ["string", "array"], "items": {"type": "string", "minLength": 1},
                          "minLength": 1, "minItems": 1, "maxItems": 8,
                          "description": "one pattern or a list (the first to complete ends the wait); utf8 "
                                         "patterns take the payload's escapes, e.g. 'OK\\r\\n'"},
         "stop_pattern_encoding": {"enum": ["utf8", "hex"],
                                   "description": "how stop_pattern is written (default: encoding), e.g. hex "
                                                  "for a binary terminator after a text command"},
         "timeout_ms": {"type": "integer", "minimum": 0, "maximum": 300000, "default": 1000},
         "line_ending": {"enum": list(LINE_ENDINGS),
                         "description": "appended to a utf8 payload (default: the port's line_ending)"},
         "escapes": {"type": "boolean", "default": True,
                     "description": "read backslash escapes in utf8 payload and stop_pattern; false sends "
                                    "backslashes as they are (e.g. a shell command for a board's console)"},
         "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "wait_policy": {"type": "string"},
            "data": {"type": "string"}, "format": {"enum": ["text", "hex"]}, "is_hex": {"type": "boolean"},
            "bytes_sent": {"type": "integer"}, "bytes_received": {"type": "integer"},
            "found_keyword": {"type": "boolean"}, "stop_pattern_matched": _NULLABLE_STR,
            "timed_out": {"type": "boolean"}, "truncated": {"type": "boolean"},
            "pending_urc_count": {"type": "integer"}, "urc_dropped": {"type": "integer"},
            "elapsed_ms": {"type": "number"}, "log_offset": {"type": ["integer", "null"]}, "note": {"type": "string"}},
         "required": ["success", "port", "data", "format", "is_hex", "bytes_sent", "bytes_received", "found_keyword",
                      "timed_out", "truncated", "pending_urc_count", "elapsed_ms"]},
        required=("port", "payload"), title="Send data to a serial port", read_only=False, idempotent=False,
        timeout_s=330),
    "read_urc": _tool(
        "Unsolicited packets (URCs, heartbeats, logs) that arrived while no send_data call was waiting, oldest "
        "first, each with its wall-clock timestamp and format. Consumes them unless peek=true. dropped counts "
        "packets lost to URC buffer overflow since the last read (the raw log still has their bytes).",
        {"port": _PORT, "max_packets": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 50},
         "peek": {"type": "boolean", "default": False}, "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "port": {"type": "string"}, "state": {"enum": _STATES}, "packets": {"type": "array", "items": _PACKET},
            "returned": {"type": "integer"},
            "pending_urc_count": {"type": "integer",
                                  "description": "packets in the buffer after this call (a peek leaves them there)"},
            "has_more": {"type": "boolean", "description": "packets past those returned are waiting"},
            "dropped": {"type": "integer"}, "dropped_total": {"type": "integer"}},
         "required": ["port", "state", "packets", "returned", "pending_urc_count", "has_more", "dropped"]},
        required=("port",), title="Read unsolicited serial output", read_only=False, idempotent=False),
    "set_signals": _tool(
        "Line control on an open port, e.g. to reset or boot-strap a board: set DTR and/or RTS, and/or hold a "
        "break condition for break_ms. Ports without modem lines (ptys, some adapters) give BACKEND_UNAVAILABLE.",
        {"port": _PORT, "dtr": {"type": "boolean"}, "rts": {"type": "boolean"},
         "break_ms": {"type": "integer", "minimum": 1, "maximum": 10000}},
        {"type": "object", "properties": {
            "success": {"type": "boolean"}, "port": {"type": "string"}, "dtr": {"type": ["boolean", "null"]},
            "rts": {"type": ["boolean", "null"]}, "break_ms": {"type": ["integer", "null"]},
            "modem_lines": {"type": ["object", "null"]}},
         "required": ["success", "port"]},
        required=("port",), title="Set serial control lines", read_only=False, idempotent=False),
    "get_log": _tool(
        "Page through the raw Tx/Rx log of a port's current (or last) session: every byte written and read, "
        "with wall-clock timestamps and direction, plus session events. Records are numbered from 0 (the "
        "session header); follow next_offset.",
        {"port": _PORT, "offset": {"type": "integer", "minimum": 0, "default": 0},
         "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "as_hex": _AS_HEX},
        {"type": "object", "properties": {
            "port": {"type": "string"}, "log_file": {"type": "string"}, "live": {"type": "boolean"},
            "offset": {"type": "integer"}, "returned": {"type": "integer"}, "total_records": {"type": "integer"},
            "next_offset": {"type": ["integer", "null"]}, "records": {"type": "array", "items": {
                "type": "object", "properties": {"i": {"type": "integer"}, "dir": {"enum": ["tx", "rx", "event"]}},
                "required": ["i", "dir"]}}},
         "required": ["port", "log_file", "offset", "returned", "total_records", "next_offset", "records"]},
        required=("port",), title="Read the raw serial log"),
}
