"""Pure helpers of the serial actor: hex, escapes, packet decoding, the idle slicer and reply matching.

Nothing here awaits or reads a clock: callers pass the Trio time (`now`) and the wall time
(`wall`), so every timer is testable on `MockClock` and every rule is testable without a port.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from diagd.actors.serial.replies import Format, UrcPacket
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


def decode(data: bytes, *, as_hex: bool = False, cut: bool = False) -> tuple[str, Format]:
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

    def to_json(self, *, as_hex: bool = False) -> UrcPacket:
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
    one line terminator that follows it in the same read when `absorb_line_end`, so "OK" takes its
    "\r\n"); `feed` returns what follows, which is not part of the reply: a URC right behind the
    answer keeps its own leading "\r\n".
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
                    end += _line_end_after(best[1], chunk[end:])
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




def _line_end_after(pattern: bytes, rest: bytes) -> int:
    """How many bytes of `rest` end the line a matched `pattern` is on: none when the pattern ends
    the line itself, else one terminator (CRLF, LF or CR; after a CR-ending pattern its LF)."""
    if pattern.endswith(b"\n"):
        return 0
    if pattern.endswith(b"\r"):
        return 1 if rest.startswith(b"\n") else 0
    if rest.startswith(b"\r\n"):
        return 2
    return 1 if rest[:1] in (b"\r", b"\n") else 0


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return utc.iso(ts, digits=3)
