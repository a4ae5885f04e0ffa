"""The serial codec against models written here from its documented rules (docs/serial.md, the docstrings).

Each model is independent of the module: hex as pairs of digits between whitespace, the escape list of
docs/serial.md, UTF-8 well-formedness from the Unicode standard (Table 3-7), the idle slicer byte by byte,
and reply matching over the whole received stream (earliest-ending pattern, one line terminator from the
same read). They are compared on seeded streams, chunkings and texts (hypothesis, derandomized), plus the
edge cases the docs name. Error messages and hints are what a user reads, so they are spelled out.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagd.actors.serial.codec import Packet, ReplyCollector, Slicer, decode, iso, parse_hex, to_hex, unescape
from diagd.protocol.errors import DiagdError, ErrorCode

SEEDED = settings(derandomize=True, database=None, deadline=None, max_examples=300,
                  suppress_health_check=[HealthCheck.too_slow])
HEX = "0123456789abcdefABCDEF"
HEX_HINT = "write bytes as pairs of hex digits, e.g. '0A 0D FF' or '0A0DFF' (no 0x prefixes)"
ODD_HINT = "every byte is two hex digits, e.g. '0A' not 'A'"
ESCAPE_HINT = ("escapes: \\r \\n \\t, \\\\ for a backslash, \\xHH for any byte (\\x1a is Ctrl-Z); "
               "or escapes=false to send the text as it is")


# --- hex -------------------------------------------------------------------------------------------

def hex_model(data: bytes) -> str:
    return " ".join(f"{b:02X}" for b in data)


@SEEDED
@given(st.binary(max_size=40))
def test_to_hex_is_uppercase_pairs_separated_by_one_space(data: bytes) -> None:
    assert to_hex(data) == hex_model(data)


def test_to_hex_examples() -> None:
    assert to_hex(b"\n\r\xff") == "0A 0D FF" and to_hex(b"") == "" and to_hex(b"\xab") == "AB"


def parse_hex_model(text: str, what: str) -> bytes | tuple[int, str, str]:
    """bytes, or (position, character, kind) of the first error: tokens left to right, and within a
    token a non-hex character before an odd length."""
    out = b""
    i = 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        start = i
        while i < len(text) and not text[i].isspace():
            i += 1
        token = text[start:i]
        bad = [k for k, ch in enumerate(token) if ch not in HEX]
        if bad:
            return (start + bad[0], token[bad[0]], "not hex")
        if len(token) % 2:
            return (i - 1, token[-1], "odd")
        out += bytes(int(token[k:k + 2], 16) for k in range(0, len(token), 2))
    return out


@SEEDED
@given(st.text(alphabet="0123456789aAfF \t\n\u00a0gx:Ä", max_size=30), st.sampled_from(["payload", "stop_pattern"]))
def test_parse_hex_follows_the_model(text: str, what: str) -> None:
    expected = parse_hex_model(text, what)
    if isinstance(expected, bytes):
        assert parse_hex(text, what=what) == expected
        return
    with pytest.raises(DiagdError) as info:
        parse_hex(text, what=what)
    err = info.value
    position, character, kind = expected
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert err.details == {"argument": what, "position": position, "character": character,
                           "hint": HEX_HINT if kind == "not hex" else ODD_HINT}


@SEEDED
@given(st.binary(max_size=30), st.lists(st.sampled_from([" ", "\t", "\n", "  "]), max_size=30))
def test_parse_hex_reads_back_what_to_hex_writes_in_any_case_and_spacing(data: bytes, gaps: list[str]) -> None:
    pairs = [f"{b:02x}" if i % 2 else f"{b:02X}" for i, b in enumerate(data)]
    text = "".join(pair + (gaps[i] if i < len(gaps) else "") for i, pair in enumerate(pairs))
    assert parse_hex(text) == data


def test_parse_hex_messages_name_the_argument_position_and_character() -> None:
    with pytest.raises(DiagdError) as info:
        parse_hex("0A 0G")
    assert info.value.message == "payload is not hex: 'G' at position 4"
    assert info.value.details["argument"] == "payload"  # the default name
    with pytest.raises(DiagdError) as info:
        parse_hex("7E 0A0DF", what="stop_pattern")
    assert info.value.message == ("stop_pattern has an odd number of hex digits: '0A0DF' at position 3 leaves its "
                                  "last digit (position 7) unpaired")
    assert info.value.details == {"argument": "stop_pattern", "position": 7, "character": "F", "hint": ODD_HINT}


# --- escapes ---------------------------------------------------------------------------------------

def unescape_model(text: str) -> bytes | tuple[int, str, str]:
    """docs/serial.md: \\r \\n \\t, \\\\ one backslash, \\xHH any byte; anything else is refused at the
    position of its backslash (shown with the two hex places of \\x when it is one)."""
    named = {"r": 13, "n": 10, "t": 9, "\\": 92}
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = text[i + 1] if i + 1 < len(text) else ""
        digits = text[i + 2:i + 4]
        if nxt and nxt in named:
            out.append(named[nxt])
            i += 2
        elif nxt == "x" and len(digits) == 2 and all(c in HEX for c in digits):
            out.append(int(digits, 16))
            i += 4
        elif nxt == "x":
            return (i, text[i:i + 4], "\\x needs two hex digits")
        else:
            return (i, text[i:i + 2], "unknown escape")
    return bytes(out)


@SEEDED
@given(st.text(alphabet="\\\\\\rntx0aFgé A\r", max_size=24), st.sampled_from(["payload", "stop_pattern"]))
def test_unescape_follows_the_documented_escapes(text: str, what: str) -> None:
    expected = unescape_model(text)
    if isinstance(expected, bytes):
        assert unescape(text, what=what) == expected
        return
    with pytest.raises(DiagdError) as info:
        unescape(text, what=what)
    position, shown, problem = expected
    err = info.value
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert err.message == f"{what}: {problem} {shown!r} at position {position}"
    assert err.details == {"argument": what, "position": position, "escape": shown, "hint": ESCAPE_HINT}


@pytest.mark.parametrize(("text", "data"), [
    ("\\x41\\x4a\\x4F", b"AJO"), ("\\x1A", b"\x1a"), ("x\\x00x", b"x\x00x"), ("\\\\x41", b"\\x41"),
    ("\\t\\n\\r\\\\", b"\t\n\r\\"), ("€\\x80", "€".encode() + b"\x80"),
])
def test_escape_examples(text: str, data: bytes) -> None:
    assert unescape(text, what="payload") == data


@pytest.mark.parametrize(("text", "message"), [
    ("AT\\x4", "payload: \\x needs two hex digits '\\\\x4' at position 2"),
    ("\\x", "payload: \\x needs two hex digits '\\\\x' at position 0"),
    ("\\xg1\\r", "payload: \\x needs two hex digits '\\\\xg1' at position 0"),
    ("\\x4g", "payload: \\x needs two hex digits '\\\\x4g' at position 0"),
    ("ok\\a", "payload: unknown escape '\\\\a' at position 2"),
    ("\\X41", "payload: unknown escape '\\\\X' at position 0"),
])
def test_escape_errors_spelled_out(text: str, message: str) -> None:
    with pytest.raises(DiagdError) as info:
        unescape(text, what="payload")
    assert info.value.message == message


# --- decoding --------------------------------------------------------------------------------------

def well_formed_prefix(data: bytes) -> tuple[int, int]:
    """(length of the longest well-formed UTF-8 prefix, length of the incomplete character after it:
    0 unless the rest is a proper prefix of a well-formed sequence that the data ends in), by the
    Unicode standard's Table 3-7."""
    cont = range(0x80, 0xC0)
    table: list[tuple[range, list[range]]] = [
        (range(0x00, 0x80), []),
        (range(0xC2, 0xE0), [cont]),
        (range(0xE0, 0xE1), [range(0xA0, 0xC0), cont]),
        (range(0xE1, 0xED), [cont, cont]),
        (range(0xED, 0xEE), [range(0x80, 0xA0), cont]),
        (range(0xEE, 0xF0), [cont, cont]),
        (range(0xF0, 0xF1), [range(0x90, 0xC0), cont, cont]),
        (range(0xF1, 0xF4), [cont, cont, cont]),
        (range(0xF4, 0xF5), [range(0x80, 0x90), cont, cont]),
    ]
    i = 0
    while i < len(data):
        rest = next((r for lead, r in table if data[i] in lead), None)
        if rest is None:
            return i, 0
        got = 0
        while got < len(rest) and i + 1 + got < len(data) and data[i + 1 + got] in rest[got]:
            got += 1
        if got == len(rest):
            i += 1 + got
        elif i + 1 + got == len(data):  # the data ends inside this character
            return i, 1 + got
        else:
            return i, 0
    return i, 0


def is_garbage(ch: str) -> bool:
    """C0 controls other than TAB, LF, CR and ESC; DEL; C1 controls."""
    o = ord(ch)
    return (o < 0x20 and o not in (0x09, 0x0A, 0x0D, 0x1B)) or 0x7F <= o <= 0x9F


def decode_model(data: bytes, as_hex: bool, cut: bool) -> tuple[str, str]:
    good, incomplete = well_formed_prefix(data)
    if cut and not as_hex and incomplete and good + incomplete == len(data):  # hex shows every byte
        data = data[:good]
        good, incomplete = len(data), 0
    if not as_hex and good == len(data):
        text = data.decode("utf-8")
        if not any(is_garbage(c) for c in text):
            return text, "text"
    return hex_model(data), "hex"


utf8_pieces = st.sampled_from([
    "a", "Z", " ", "\t", "\r", "\n", "\x1b", "\x00", "\x07", "\x0b", "\x0c", "\x1a", "\x1c", "\x1f", "\x7f",
    "\x80", "\x9f", "\xa0", "é", "€", "😀", "\u0800", "\uffff", "\U00010000", "\U0010ffff",
]).map(lambda s: s.encode())
raw_pieces = st.sampled_from([b"\xff", b"\xc0", b"\xc1", b"\x80", b"\xbf", b"\xe0\x80", b"\xed\xa0", b"\xf4\x90",
                              b"\xf5", b"\xe2", b"\xe2\x82", b"\xf0\x9f", b"\xf0\x9f\x98", b"\xc3", b"\xf4\x8f\xbf"])


@SEEDED
@given(st.lists(utf8_pieces, max_size=8), st.lists(st.one_of(utf8_pieces, raw_pieces), max_size=3),
       st.booleans(), st.booleans())
def test_decode_follows_the_model(head: list[bytes], tail: list[bytes], as_hex: bool, cut: bool) -> None:
    data = b"".join(head + tail)
    assert decode(data, as_hex=as_hex, cut=cut) == decode_model(data, as_hex, cut)


def test_decode_drops_only_an_incomplete_last_character_of_a_cut_prefix() -> None:
    emoji = "😀".encode()  # four bytes
    for k in (1, 2, 3):
        assert decode(b"ok" + emoji[:k], cut=True) == ("ok", "text")
        assert decode(b"ok" + emoji[:k]) == (hex_model(b"ok" + emoji[:k]), "hex")  # not cut: not dropped
    assert decode(b"ok\xff", cut=True) == ("6F 6B FF", "hex")  # invalid, not incomplete
    assert decode(b"\xff" + emoji[:2], cut=True) == ("FF F0 9F", "hex")  # an earlier invalid byte
    assert decode(b"\x00ok" + emoji[:3], cut=True) == ("00 6F 6B", "hex")  # dropped, then garbage
    assert decode(b"ok" + emoji[:3], as_hex=True, cut=True) == (hex_model(b"ok" + emoji[:3]), "hex")


@pytest.mark.parametrize("code", [*range(0x20), *range(0x7F, 0xA0)])
def test_every_control_but_tab_lf_cr_esc_makes_hex(code: int) -> None:
    _, fmt = decode(("ok" + chr(code)).encode())
    assert fmt == ("text" if code in (0x09, 0x0A, 0x0D, 0x1B) else "hex")


def test_packet_json_rounds_its_time_to_microseconds_and_counts_bytes() -> None:
    packet = Packet(b"+CREG: 1\r\n", ts=1795635941.1234567, t_first=1.0, t_last=2.0, split=True)
    assert packet.to_json() == {"ts": 1795635941.123457, "data": "+CREG: 1\r\n", "format": "text", "bytes": 10,
                                "split": True}
    assert Packet(b"\xff\x00", ts=0.5, t_first=0.0, t_last=0.0).to_json() == {
        "ts": 0.5, "data": "FF 00", "format": "hex", "bytes": 2, "split": False}
    assert Packet(b"OK", ts=0.0, t_first=0.0, t_last=0.0).to_json(as_hex=True)["data"] == "4F 4B"


@pytest.mark.parametrize("ts", [0.0, 0.5, 1795635941.25, 1795635941.999, 86399.0625])
def test_iso_is_utc_with_milliseconds(ts: float) -> None:
    moment = datetime.fromtimestamp(ts, UTC)
    assert iso(ts) == moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond // 1000:03d}Z"
    assert iso(None) is None


# --- the idle slicer -------------------------------------------------------------------------------

class SlicerModel:
    """Byte by byte: a packet starts at the first byte after a cut (its wall time and Trio time), ends when
    it holds `max_bytes` (split) or when no byte came for `idle_s` (the caller flushes at the deadline)."""

    def __init__(self, idle_s: float, max_bytes: int) -> None:
        self.idle_s, self.max_bytes = idle_s, max_bytes
        self.buf = b""
        self.start = (0.0, 0.0)
        self.last = self.touched = 0.0
        self.packets: list[tuple[bytes, float, float, float, bool]] = []

    def read(self, data: bytes, now: float, wall: float) -> None:
        for b in data:
            self.byte(b, now, wall)
        self.touched = now  # every read restarts the idle timer of a pending packet

    def byte(self, b: int, now: float, wall: float) -> None:
        if not self.buf:
            self.start = (wall, now)
        self.buf += bytes([b])
        self.last = now
        if len(self.buf) == self.max_bytes:
            self.cut(True)

    def cut(self, split: bool) -> None:
        if self.buf:
            self.packets.append((self.buf, self.start[0], self.start[1], self.last, split))
        self.buf = b""


def as_tuple(p: Packet) -> tuple[bytes, float, float, float, bool]:
    return (p.data, p.ts, p.t_first, p.t_last, p.split)


@SEEDED
@given(idle_ticks=st.integers(1, 6), max_bytes=st.integers(1, 9),
       reads=st.lists(st.tuples(st.integers(0, 9), st.binary(min_size=0, max_size=20)), max_size=12))
def test_slicer_follows_the_byte_model_on_any_chunking(idle_ticks: int, max_bytes: int,
                                                      reads: list[tuple[int, bytes]]) -> None:
    """Times are multiples of 1/8 s (exact in binary); a read `gap` ticks after the previous one. The
    driver flushes once the deadline has come (`now >= deadline`), as the port's idle timer does."""
    idle = idle_ticks / 8
    slicer, model = Slicer(idle_s=idle, max_bytes=max_bytes), SlicerModel(idle, max_bytes)
    got: list[tuple[bytes, float, float, float, bool]] = []
    now = 10.0
    for gap, data in reads:
        now += gap / 8
        wall = 1000.0 + now * 2
        if now - model.touched >= idle:
            model.cut(False)
        if now >= slicer.deadline:
            flushed = slicer.flush()
            assert flushed is not None
            got.append(as_tuple(flushed))
        got += [as_tuple(p) for p in slicer.feed(data, now, wall)]
        model.read(data, now, wall)
        assert slicer.pending == len(model.buf)
        assert slicer.deadline == (now + idle if model.buf else math.inf)
        assert got == model.packets
    last = slicer.flush()
    model.cut(False)
    if last is not None:
        got.append(as_tuple(last))
    assert got == model.packets and slicer.pending == 0 and slicer.deadline == math.inf
    assert slicer.flush() is None


def test_slicer_an_empty_read_changes_nothing_pending() -> None:
    slicer = Slicer(idle_s=0.5, max_bytes=4)
    assert slicer.feed(b"", now=1.0, wall=5.0) == [] and slicer.deadline == math.inf and slicer.pending == 0
    slicer.feed(b"ab", now=1.0, wall=5.0)
    slicer.feed(b"", now=1.25, wall=5.25)  # keeps the packet; its deadline counts from this read
    assert slicer.deadline == 1.75 and slicer.pending == 2


def test_slicer_a_read_exactly_filling_the_cap_ends_the_packet_and_nothing_is_pending() -> None:
    slicer = Slicer(idle_s=0.5, max_bytes=4)
    slicer.feed(b"ab", now=1.0, wall=5.0)
    packets = slicer.feed(b"cd", now=1.25, wall=5.25)
    assert [as_tuple(p) for p in packets] == [(b"abcd", 5.0, 1.0, 1.25, True)]
    assert slicer.pending == 0 and slicer.deadline == math.inf and slicer.flush() is None
    more = slicer.feed(b"efghij", now=2.0, wall=6.0)  # a new packet starts with its own times
    assert [as_tuple(p) for p in more] == [(b"efgh", 6.0, 2.0, 2.0, True)]
    rest = slicer.flush()
    assert rest is not None and as_tuple(rest) == (b"ij", 6.0, 2.0, 2.0, False)


# --- reply matching --------------------------------------------------------------------------------

def line_end_model(pattern: bytes, rest: bytes) -> int:
    """docs: the one line terminator after the pattern (CRLF, LF or CR), none when the pattern ends the
    line itself; after a pattern ending in CR, only its LF."""
    if pattern[-1:] == b"\n":
        return 0
    if pattern[-1:] == b"\r":
        return 1 if rest[:1] == b"\n" else 0
    if rest[:2] == b"\r\n":
        return 2
    return 1 if rest[:1] in (b"\r", b"\n") else 0


def reply_model(patterns: list[bytes], chunks: list[bytes], cap: int, absorb: bool
                ) -> tuple[list[bytes], bytes | None, bytes, int]:
    """(what each feed returns, matched pattern, capped reply, reply length) over the whole stream: the
    reply ends at the earliest end of any pattern's occurrence (the first listed on a tie)."""
    stream = b"".join(chunks)
    best: tuple[int, bytes] | None = None
    for p in patterns:
        if p and p in stream:
            end = stream.index(p) + len(p)
            if best is None or end < best[0]:
                best = (end, p)
    if best is None:
        return [b""] * len(chunks), None, stream[:cap], len(stream)
    end, matched = best
    returns: list[bytes] = []
    reply_len = start = 0
    for chunk in chunks:
        stop = start + len(chunk)
        if reply_len:  # after the match: nothing more is the reply's
            returns.append(chunk)
        elif stop < end:
            returns.append(b"")
        else:  # the read in which the match completes
            at = end - start
            extra = line_end_model(matched, chunk[at:]) if absorb else 0
            reply_len = end + extra
            returns.append(chunk[at + extra:])
        start = stop
    reply = stream[:reply_len]
    return returns, matched, reply[:cap], reply_len


ALPHABET = b"OKER\r\n"
letters = st.lists(st.sampled_from(list(ALPHABET)), max_size=6).map(bytes)


@st.composite
def replies(draw: st.DrawFn) -> tuple[list[bytes], list[bytes]]:
    """Patterns (some empty) and a stream of filler and pattern occurrences, cut into reads at random
    places, so matches often span reads and patterns overlap or end together."""
    patterns = draw(st.lists(letters, max_size=4))
    pieces = draw(st.lists(st.one_of(letters, st.sampled_from(patterns) if patterns else letters), max_size=6))
    stream = b"".join(pieces)
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    bounds = [0, *cuts, len(stream)]
    return patterns, [stream[a:b] for a, b in pairwise(bounds)]


@SEEDED
@given(case=replies(), cap=st.integers(0, 30), absorb=st.booleans())
def test_reply_collector_follows_the_stream_model(case: tuple[list[bytes], list[bytes]], cap: int,
                                                 absorb: bool) -> None:
    patterns, chunks = case
    reply = ReplyCollector(patterns, cap, absorb_line_end=absorb)
    returns = [reply.feed(chunk) for chunk in chunks]
    want_returns, matched, data, total = reply_model(patterns, chunks, cap, absorb)
    assert (returns, reply.matched, bytes(reply.data), reply.total) == (want_returns, matched, data, total)
    assert reply.truncated == (total > cap)
    assert reply.patterns == [p for p in patterns if p]


@pytest.mark.parametrize(("pattern", "rest", "taken"), [
    (b"OK", b"\r\nX", b"\r\n"), (b"OK", b"\rX", b"\r"), (b"OK", b"\nX", b"\n"), (b"OK", b"\n\r", b"\n"),
    (b"OK", b"\r\r", b"\r"), (b"OK", b"X\r\n", b""), (b"OK", b"", b""),
    (b"OK\r", b"\nX", b"\n"), (b"OK\r", b"\r\nX", b""), (b"OK\r", b"X", b""),
    (b"OK\r\n", b"\r\n", b""), (b"OK\n", b"\n", b""), (b"\n", b"\r\n", b""),
])
def test_the_one_line_end_after_a_match(pattern: bytes, rest: bytes, taken: bytes) -> None:
    reply = ReplyCollector([pattern], cap=100)
    assert reply.feed(b"AT" + pattern + rest) == rest[len(taken):]
    assert bytes(reply.data) == b"AT" + pattern + taken and reply.matched == pattern


def test_the_line_end_is_taken_only_from_the_same_read() -> None:
    reply = ReplyCollector([b"OK"], cap=100)
    assert reply.feed(b"O") == b"" and reply.feed(b"K") == b""
    assert reply.matched == b"OK" and reply.feed(b"\r\n") == b"\r\n" and bytes(reply.data) == b"OK"


def test_single_byte_patterns_match_across_reads_and_never_from_a_stale_tail() -> None:
    reply = ReplyCollector([b"X", b"\x7e"], cap=100, absorb_line_end=False)
    assert reply.feed(b"ab") == b"" and reply.feed(b"cd") == b"" and reply.matched is None
    assert reply.feed(b"e\x7eX") == b"X" and reply.matched == b"\x7e"
    assert bytes(reply.data) == b"abcde\x7e" and reply.total == 6 and not reply.truncated


def test_a_long_pattern_matches_across_many_short_reads() -> None:
    reply = ReplyCollector([b"ERROR\r\n", b"OK\r\n"], cap=3)
    for byte in b"xxERRO":
        assert reply.feed(bytes([byte])) == b""
    assert reply.feed(b"R\r\nrest") == b"rest" and reply.matched == b"ERROR\r\n"
    assert bytes(reply.data) == b"xxE" and reply.total == 9 and reply.truncated


def test_the_earliest_ending_pattern_wins_and_a_tie_goes_to_the_first_listed() -> None:
    later_start = ReplyCollector([b"ABCDE", b"CD"], cap=100)
    assert later_start.feed(b"ABCDEF") == b"EF" and later_start.matched == b"CD"
    tie = ReplyCollector([b"OK\r\n", b"\r\n"], cap=100)
    assert tie.feed(b"OK\r\n") == b"" and tie.matched == b"OK\r\n"
    tie2 = ReplyCollector([b"\r\n", b"OK\r\n"], cap=100)
    assert tie2.feed(b"OK\r\n") == b"" and tie2.matched == b"\r\n"


def test_no_patterns_or_only_empty_ones_collect_everything() -> None:
    for patterns in ([], [b""]):
        reply = ReplyCollector(patterns, cap=4)
        assert reply.feed(b"OK\r\n") == b"" and reply.feed(b"more") == b""
        assert reply.matched is None and bytes(reply.data) == b"OK\r\n" and reply.total == 8 and reply.truncated
    exact = ReplyCollector([], cap=4)
    exact.feed(b"1234")
    assert not exact.truncated and exact.total == 4
