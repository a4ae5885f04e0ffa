"""dumpcap's child-mode messages (`-Z none`: its sync pipe on stderr) decoded into events, and the
interface statistics a finished pcapng file records.

Each message is one indicator byte, a 3-byte big-endian length and a NUL-terminated payload
(wireshark's sync_pipe.h): F a new file (its path), P packets written since the last P (dumpcap
flushes the file before it sends one, so the file is whole up to there), D drops at the end
(`<count>:<interface>`, pcap's ps_drop), E an error (two nested messages: primary, secondary),
B a filter the interface refused (`<index>:<message>`), S success.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import BinaryIO

MAX_MESSAGE = 1 << 16  # dumpcap's own limit is SP_MAX_MSG_LEN (512 KiB); ours bounds what we buffer


@dataclass(frozen=True)
class Event:
    kind: str  # "F", "P", "D", "E", "B", "S", or "text" (what is not a message: dumpcap's own prints)
    text: str


@dataclass
class SyncReader:
    """Turns stderr chunks into events; bytes that do not form a message come back as text."""

    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes | bytearray) -> list[Event]:
        self._buffer += data
        events: list[Event] = []
        while len(self._buffer) >= 4:
            kind = chr(self._buffer[0])
            length = int.from_bytes(self._buffer[1:4], "big")
            if kind not in "FPDEBSIW" or length > MAX_MESSAGE:
                text = bytes(self._buffer).decode(errors="replace")
                self._buffer.clear()
                events.append(Event("text", text))
                break
            if len(self._buffer) < 4 + length:
                break
            payload = bytes(self._buffer[4:4 + length])
            del self._buffer[:4 + length]
            events.append(Event(kind, _error_text(payload) if kind == "E" else _text(payload)))
        return events


def _text(payload: bytes) -> str:
    return payload.rstrip(b"\0").decode(errors="replace")


def _error_text(payload: bytes) -> str:
    """An E message holds two messages (primary, secondary): their texts, joined."""
    parts: list[str] = []
    while len(payload) >= 4:
        length = int.from_bytes(payload[1:4], "big")
        parts.append(_text(payload[4:4 + length]).strip())
        payload = payload[4 + length:]
    return " ".join(p for p in parts if p) or _text(payload)


def parse_drops(text: str) -> tuple[str, int]:
    """A D message's (interface, count)."""
    count, _, name = text.partition(":")
    try:
        return name, int(count)
    except ValueError:
        return name, 0


# -- the statistics a finished pcapng file records --------------------------------------------------

_IDB, _ISB = 1, 5
_IF_NAME = 2
_ISB_IFRECV, _ISB_IFDROP, _ISB_OSDROP = 4, 5, 7


def interface_statistics(f: BinaryIO) -> dict[str, dict[str, int]]:
    """Per interface name: the last Interface Statistics Block's received / interface-drop / OS-drop
    counts (dumpcap writes them when it closes a file). Empty when the file has none (killed)."""
    names: list[str] = []
    stats: dict[str, dict[str, int]] = {}
    order = "<"
    while head := f.read(8):
        if len(head) < 8:
            break
        block_type, length = struct.unpack(order + "II", head)
        if block_type == 0x0A0D0D0A:  # a section header: its byte-order magic decides the order
            magic = f.read(4)
            order = "<" if magic == b"\x4d\x3c\x2b\x1a" else ">"
            length = struct.unpack(order + "I", head[4:])[0]
            body = magic + f.read(length - 12)
            names = []
        else:
            body = f.read(length - 8) if length >= 12 else b""
        if len(body) < max(length - 8, 0):
            break  # cut short: a growing file
        if block_type == _IDB:
            names.append(_options(body[8:-4], order).get(_IF_NAME, b"").rstrip(b"\0").decode(errors="replace")
                         or f"#{len(names)}")
        elif block_type == _ISB and len(body) >= 16:
            (if_id,) = struct.unpack(order + "I", body[:4])
            options = _options(body[12:-4], order)
            name = names[if_id] if if_id < len(names) else f"#{if_id}"
            stats[name] = {key: struct.unpack(order + "Q", options[code])[0]
                           for key, code in (("received", _ISB_IFRECV), ("interface_drops", _ISB_IFDROP),
                                             ("os_drops", _ISB_OSDROP)) if len(options.get(code, b"")) == 8}
    return stats


def _options(data: bytes, order: str) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    while len(data) >= 4:
        code, length = struct.unpack(order + "HH", data[:4])
        if code == 0:
            break
        found[code] = data[4:4 + length]
        data = data[4 + (length + 3) // 4 * 4:]
    return found
