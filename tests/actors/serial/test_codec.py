"""The serial actor's pure helpers: hex, decoding, slicing, reply matching, URC buffer, raw log."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import cast

import pytest

from diagd.actors.serial.backend import SerialBackend
from diagd.actors.serial.codec import ReplyCollector, Slicer, decode, parse_hex, unescape
from diagd.actors.serial.rawlog import LogView, RawLog, read_log_page
from diagd.actors.serial.settings import SerialConfig, port_key
from diagd.actors.serial.tools import tools
from diagd.actors.serial.urc import UrcBuffer
from diagd.protocol.errors import DiagdError, ErrorCode


@pytest.mark.parametrize("text", ["0A 0D FF", "0a0dff", " 0A0D\tff\n", "0A0D FF"])
def test_hex_accepts_pairs_with_optional_whitespace(text: str) -> None:
    assert parse_hex(text) == b"\x0a\x0d\xff"


def test_hex_of_nothing_is_no_bytes() -> None:
    assert parse_hex("") == b"" and parse_hex("   ") == b""


@pytest.mark.parametrize(("text", "position", "character"), [
    ("0A 0G", 4, "G"), ("0x0A", 1, "x"), ("0A:0D", 2, ":"), ("ÄA", 0, "Ä"),
])
def test_non_hex_characters_are_refused_with_their_position(text: str, position: int, character: str) -> None:
    with pytest.raises(DiagdError) as info:
        parse_hex(text)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    assert info.value.details["position"] == position and info.value.details["character"] == character
    assert f"position {position}" in info.value.message


@pytest.mark.parametrize(("text", "position"), [("0A0DF", 4), ("A 0D", 0), ("0A 0D F", 6)])
def test_an_odd_number_of_digits_names_the_unpaired_digit(text: str, position: int) -> None:
    with pytest.raises(DiagdError) as info:
        parse_hex(text, what="stop_pattern")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT and "odd number" in info.value.message
    assert info.value.details == {**info.value.details, "argument": "stop_pattern", "position": position}


def test_clean_text_decodes_as_text_and_anything_else_as_uppercase_hex() -> None:
    assert decode(b"\r\nOK\r\n") == ("\r\nOK\r\n", "text")
    assert decode("Grüße\t\x1b[32mok\x1b[0m".encode()) == ("Grüße\t\x1b[32mok\x1b[0m", "text")  # ANSI colours
    assert decode(b"\x0a\x0d\xff") == ("0A 0D FF", "hex")  # invalid UTF-8
    assert decode(b"OK\x00") == ("4F 4B 00", "hex")  # control garbage
    assert decode(b"\x7f") == ("7F", "hex")
    assert decode(b"OK", as_hex=True) == ("4F 4B", "hex")
    assert decode(b"") == ("", "text")


def test_a_prefix_cut_inside_a_character_still_decodes_as_text() -> None:
    cut = "ab€".encode()[:4]  # "ab" + 2 of the 3 bytes of "€"
    assert decode(cut) == ("61 62 E2 82", "hex")
    assert decode(cut, cut=True) == ("ab", "text")


def test_slicer_ends_a_packet_one_idle_gap_after_its_last_byte() -> None:
    slicer = Slicer(idle_s=0.25, max_bytes=100)
    assert slicer.deadline == math.inf
    assert slicer.feed(b"+CM", now=1.0, wall=1000.0) == []
    assert slicer.deadline == 1.25
    assert slicer.feed(b"TI\r\n", now=1.125, wall=1000.125) == []
    assert slicer.deadline == 1.375  # restarted by the new bytes
    packet = slicer.flush()
    assert packet is not None
    assert (packet.data, packet.t_first, packet.t_last, packet.ts, packet.split) == (
        b"+CMTI\r\n", 1.0, 1.125, 1000.0, False)
    assert slicer.deadline == math.inf and slicer.flush() is None


def test_slicer_cuts_at_the_size_cap_and_marks_the_cut() -> None:
    slicer = Slicer(idle_s=0.5, max_bytes=4)
    packets = slicer.feed(b"0123456789", now=2.0, wall=0.0)
    assert [(p.data, p.split) for p in packets] == [(b"0123", True), (b"4567", True)]
    assert slicer.pending == 2 and slicer.deadline == 2.5
    rest = slicer.flush()
    assert rest is not None and rest.data == b"89" and not rest.split


def test_reply_matches_a_pattern_split_across_reads_and_keeps_what_follows_out() -> None:
    reply = ReplyCollector([b"OK\r\n", b"ERROR\r\n"], cap=100)
    assert reply.feed(b"\r\n+CSQ: 1\r\n\r\nO") == b""
    assert reply.matched is None
    assert reply.feed(b"K\r\n+CMTI: 2\r\n") == b"+CMTI: 2\r\n"
    assert reply.matched == b"OK\r\n" and bytes(reply.data) == b"\r\n+CSQ: 1\r\n\r\nOK\r\n"
    assert reply.feed(b"later") == b"later"  # after the match nothing more belongs to the reply


def test_reply_takes_the_line_end_after_a_match_only_in_text_mode() -> None:
    text = ReplyCollector([b"OK"], cap=100)
    assert text.feed(b"OK\r\nrest") == b"rest" and bytes(text.data) == b"OK\r\n"
    binary = ReplyCollector([b"\x7e"], cap=100, absorb_line_end=False)
    assert binary.feed(b"\x01\x7e\x0d\x0a") == b"\x0d\x0a" and bytes(binary.data) == b"\x01\x7e"



def test_a_urc_right_behind_the_answer_keeps_its_leading_line_end() -> None:
    """Only the terminator of the matched line is the reply's: the next message's CRLF is not (a
    +CMTI arriving in the same read as OK lost its "\r\n" to the reply, which then ended in a blank line)."""
    ended = ReplyCollector([b"OK\r\n"], cap=100)
    assert ended.feed(b"\r\nOK\r\n\r\n+CMTI: 1\r\n") == b"\r\n+CMTI: 1\r\n"
    assert bytes(ended.data) == b"\r\nOK\r\n"
    bare = ReplyCollector([b"OK"], cap=100)
    assert bare.feed(b"\r\nOK\r\n\r\n+CMTI: 1") == b"\r\n+CMTI: 1" and bytes(bare.data) == b"\r\nOK\r\n"
    cr = ReplyCollector([b"OK\r"], cap=100)
    assert cr.feed(b"OK\r\n\r\nX") == b"\r\nX" and bytes(cr.data) == b"OK\r\n"
    lf_only = ReplyCollector([b"OK"], cap=100)
    assert lf_only.feed(b"OK\n\nX") == b"\nX" and bytes(lf_only.data) == b"OK\n"

def test_reply_ends_at_the_pattern_that_completes_first() -> None:
    reply = ReplyCollector([b"OK", b"ERROR"], cap=100)
    assert reply.feed(b"ERROR OK") == b" OK"
    assert reply.matched == b"ERROR"


def test_reply_keeps_a_capped_copy_but_counts_and_matches_every_byte() -> None:
    reply = ReplyCollector([b"END"], cap=8)
    reply.feed(b"0123456789")
    reply.feed(b"abcEN")
    assert reply.feed(b"Dtail") == b"tail"
    assert bytes(reply.data) == b"01234567" and reply.total == 16 and reply.truncated


def test_urc_buffer_drops_the_oldest_and_counts_what_it_dropped() -> None:
    from diagd.actors.serial.codec import Packet

    urc = UrcBuffer(max_packets=3, max_bytes=1000)
    for i in range(5):
        urc.push(Packet(b"p%d" % i, 0.0, 0.0, 0.0))
    peeked, dropped = urc.take(10, 1000, peek=True)
    assert [p.data for p in peeked] == [b"p2", b"p3", b"p4"] and dropped == 2
    taken, dropped = urc.take(2, 1000)
    assert [p.data for p in taken] == [b"p2", b"p3"] and dropped == 2
    assert len(urc) == 1 and urc.dropped == 0 and urc.dropped_total == 2
    urc.push(Packet(b"x" * 2000, 0.0, 0.0, 0.0))  # bigger than max_bytes: kept, the older one goes
    assert len(urc) == 1 and urc.dropped_total == 3
    big, _ = urc.take(10, 10)
    assert len(big) == 1  # one packet even past the byte budget


def test_raw_log_records_every_byte_and_pages_by_record_index(tmp_path: Path) -> None:
    log = RawLog(tmp_path / "s.jsonl", max_bytes=1 << 20, header={"port": "/dev/x"}, wall=100.0)
    for i in range(150):
        assert log.data("rx" if i % 2 else "tx", bytes([i, 0xFF]), wall=100.0 + i) == i + 1
    log.event("settings", 999.0, baudrate=9600)
    page = read_log_page(log.snapshot(), offset=130, limit=10, byte_budget=1 << 16)
    assert [r["i"] for r in page["records"]] == list(range(130, 140))
    assert page["total_records"] == 152 and page["next_offset"] == 140
    assert page["records"][0] == {"i": 130, "ts": 229.0, "dir": "rx", "data": "81 FF", "format": "hex", "bytes": 2}
    tail = read_log_page(log.snapshot(), offset=150, limit=10, byte_budget=1 << 16)
    assert [r.get("event") for r in tail["records"]] == [None, "settings"] and tail["next_offset"] is None
    assert tail["records"][1]["info"] == {"baudrate": 9600}
    log.close(1000.0, reason="done")
    closed = read_log_page(LogView(log.path, None, None, [], 64), offset=0, limit=2, byte_budget=1 << 16)
    assert closed["total_records"] == 153 and closed["next_offset"] == 2
    assert closed["records"][0]["event"] == "session" and closed["records"][0]["info"]["port"] == "/dev/x"
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert lines[1] == {"ts": 100.0, "dir": "tx", "hex": "00FF"} and lines[-1]["event"] == "closed"


def test_raw_log_pages_stop_at_the_byte_budget(tmp_path: Path) -> None:
    log = RawLog(tmp_path / "s.jsonl", max_bytes=1 << 20, header={}, wall=0.0)
    for _ in range(10):
        log.data("rx", b"x" * 100, wall=1.0)
    page = read_log_page(log.snapshot(), offset=1, limit=100, byte_budget=250)
    assert page["returned"] == 3 and page["next_offset"] == 4


def test_raw_log_past_its_size_limit_counts_the_unlogged_bytes(tmp_path: Path) -> None:
    log = RawLog(tmp_path / "s.jsonl", max_bytes=200, header={}, wall=0.0)
    while log.data("rx", b"abcdefgh", wall=1.0) >= 0:
        pass
    log.data("rx", b"12345678", wall=2.0)
    assert log.unlogged_bytes == 16
    events = [json.loads(line).get("event") for line in log.path.read_text().splitlines()]
    assert events.count("log_limit") == 1


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    assert SerialConfig.parse({"max_reply_bytes": 64, "allowed_ports": ["/dev/ttyUSB*"]}).max_reply_bytes == 64
    for raw in ({"max_reply": 1}, {"idle_ms": 0}, {"idle_ms": True}, {"allowed_ports": "/dev/x"}):
        with pytest.raises(DiagdError) as info:
            SerialConfig.parse(raw)
        assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_port_names_are_normalised_and_bare_names_mean_dev() -> None:
    assert port_key("ttyUSB0") == "/dev/ttyUSB0"
    assert port_key(" /dev//serial/../ttyS1 ") == "/dev/ttyS1"
    with pytest.raises(DiagdError):
        port_key(" ")


def test_every_tool_schema_is_a_valid_json_schema() -> None:
    import jsonschema

    specs = tools.specs(cast(SerialBackend, None))
    assert {spec.name for spec in specs} == {"list_ports", "configure_connection", "connection_status", "send_data",
                                             "read_urc", "set_signals", "get_log",
                                             "export_serial_pcapng"}
    for spec in specs:
        jsonschema.Draft202012Validator.check_schema(spec.input_schema)
        jsonschema.Draft202012Validator.check_schema(spec.output_schema)


@pytest.mark.parametrize(("text", "data"), [
    ("AT", b"AT"), ("", b""), ("AT\\r", b"AT\r"), ("OK\\r\\n", b"OK\r\n"), ("a\\tb", b"a\tb"),
    ("C:\\\\temp", b"C:\\temp"),  # a doubled backslash is one backslash
    ("\\\\r", b"\\r"),  # ... and it does not start an escape
    ("hi\\x1a", b"hi\x1a"), ("\\xfF\\x00", b"\xff\x00"),  # a byte, not a code point
    ("é\\r", "é".encode() + b"\r"), ("AT\r", b"AT\r"),  # a real CR has nothing to interpret
])
def test_escapes_in_text_become_the_bytes_they_name(text: str, data: bytes) -> None:
    assert unescape(text, what="payload") == data


@pytest.mark.parametrize(("text", "position", "escape"), [
    ("AT\\", 2, "\\"), ("a\\qb", 1, "\\q"), ("\\x1", 0, "\\x1"), ("ok\\xg0", 2, "\\xg0"), ("\\\\\\d", 2, "\\d"),
])
def test_unknown_or_incomplete_escapes_are_refused_with_their_position(text: str, position: int,
                                                                      escape: str) -> None:
    with pytest.raises(DiagdError) as info:
        unescape(text, what="stop_pattern")
    err = info.value
    assert err.code == ErrorCode.INVALID_ARGUMENT and err.details["argument"] == "stop_pattern"
    assert err.details["position"] == position and err.details["escape"] == escape
    assert "escapes=false" in err.details["hint"]
