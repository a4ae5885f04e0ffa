"""Garbage on both sockets: random bytes, truncated and oversized frames, invalid msgpack and JSON,
odd JSON-RPC ids, half-open connections. Whatever arrives, the daemon answers with coded errors (or
closes that one connection) and keeps serving every other client."""

from __future__ import annotations

import json
import shutil
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagd.protocol import control
from tests.conftest import DaemonProcess, start_daemon
from tests.fault.conftest import fault_env
from tests.fault.helpers import CODES, ControlClient, assert_coded_error, frame
from tests.support.raw import INITIALIZE, RawMCP

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

GARBAGE = settings(deadline=None, database=None, max_examples=40)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("garbage")
    env = fault_env(root, "[daemon]\n", "garbage")  # the default configuration
    proc = start_daemon(env)
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


class Bystanders:
    """A control client and an MCP session opened before the garbage, asked after every piece of it."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.control = ControlClient(daemon.control_socket, client="bystander", timeout=15)
        self.mcp = RawMCP(daemon.mcp_socket, timeout=15)
        self.mcp.initialize()
        self.next_id = 100

    def assert_served(self) -> None:
        assert self.daemon.proc.poll() is None, f"the daemon died: {self.daemon.log()[-3000:]}"
        assert self.control.ok("diagd_status")["daemon"]["pid"] == self.daemon.proc.pid
        self.next_id += 1
        self.mcp.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                       "params": {"name": "diagd_status", "arguments": {}}})
        reply = self.mcp.read()
        assert reply is not None and reply["id"] == self.next_id and not reply["result"].get("isError"), reply
        with ControlClient(self.daemon.control_socket, client="newcomer", timeout=15) as fresh:
            assert fresh.status()["daemon"]["pid"] == self.daemon.proc.pid

    def close(self) -> None:
        self.control.close()
        self.mcp.close()


@pytest.fixture
def bystanders(daemon: DaemonProcess) -> Iterator[Bystanders]:
    b = Bystanders(daemon)
    yield b
    b.close()


def connect(path: Path, timeout: float = 15) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(path))
    return sock


def read_control_answers(sock: socket.socket) -> list[control.Message]:
    """Every frame the daemon sends until it closes (it must close: we half-closed our side)."""
    data = bytearray()
    while chunk := _recv(sock):
        data += chunk
    answers = []
    while len(data) >= control.HEADER_SIZE:
        (length,) = struct.unpack(">I", data[:control.HEADER_SIZE])
        body = bytes(data[control.HEADER_SIZE:control.HEADER_SIZE + length])
        assert len(body) == length, f"a truncated frame from the daemon: {bytes(data)[:200]!r}"
        answers.append(control.decode(body))
        del data[:control.HEADER_SIZE + length]
    assert not data, f"trailing bytes from the daemon: {bytes(data)!r}"
    return answers


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:  # closed on us with our garbage unread: also a refusal
        return b""


def assert_control_answers_are_coded(answers: list[control.Message]) -> None:
    for answer in answers:
        if isinstance(answer, control.ErrorReply):
            assert answer.code in CODES and answer.code != "INTERNAL_ERROR", answer
        else:
            assert isinstance(answer, control.Hello | control.Reply), answer


def send_control_garbage(daemon: DaemonProcess, data: bytes, *, hello_first: bool) -> list[control.Message]:
    sock = connect(daemon.control_socket)
    try:
        hello = control.Hello(version=control.PROTOCOL_VERSION, client="garbage")
        prefix = control.encode(hello) if hello_first else b""
        try:
            sock.sendall(prefix + data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon gave up on us mid-send (an oversized header): allowed
        return read_control_answers(sock)
    finally:
        sock.close()


@given(data=st.binary(max_size=4096), hello_first=st.booleans())
@GARBAGE
def test_random_bytes_on_the_control_socket_get_coded_errors_and_others_are_served(
        daemon: DaemonProcess, data: bytes, hello_first: bool) -> None:
    bystanders = Bystanders(daemon)
    try:
        assert_control_answers_are_coded(send_control_garbage(daemon, data, hello_first=hello_first))
        bystanders.assert_served()
    finally:
        bystanders.close()


HEADER = struct.Struct(">I")
BAD_FRAMES: dict[str, bytes] = {
    "header only": HEADER.pack(100),
    "half a body": HEADER.pack(100) + b"\x80" * 50,
    "three header bytes": b"\x00\x00\x01",
    "4 GiB header": HEADER.pack(0xFFFFFFFF),
    "header one past the limit": HEADER.pack(control.MAX_FRAME_BYTES + 1),
    "empty frame": HEADER.pack(0),
    "invalid msgpack": HEADER.pack(3) + b"\xc1\xc1\xc1",
    "msgpack list": frame([1, 2, 3]),
    "msgpack nil": frame(None),
    "msgpack bytes": frame(b"\x00" * 10),
    "non-string keys": HEADER.pack(3) + b"\x81\x01\x02",
    "unknown tag": frame({"t": "exec", "id": 1}),
    "tag not a string": frame({"t": 7, "id": 1}),
    "call without tool": frame({"t": "call", "id": 1}),
    "call with list arguments": frame({"t": "call", "id": 1, "tool": "diagd_status", "arguments": [1, 2]}),
    "call with a string id": frame({"t": "call", "id": "x", "tool": "diagd_status"}),
    "call with a huge id": frame({"t": "call", "id": 2**64 - 1, "tool": "diagd_status"}),
    "call of a non-string tool": frame({"t": "call", "id": 1, "tool": ["diagd_status"]}),
    "call with an extra field": frame({"t": "call", "id": 1, "tool": "diagd_status", "sneaky": True}),
    "call with NULs": frame({"t": "call", "id": 1, "tool": "diagd_status\x00", "arguments": {"\x00": "\x00"}}),
    "invalid UTF-8 string": HEADER.pack(9) + b"\x82\xa1t\xa4call\xa1\xff",
    "reply sent to the daemon": frame({"t": "reply", "id": 1, "result": None}),
    "error sent to the daemon": frame({"t": "error", "id": 1, "code": "X", "message": "y"}),
    "second hello": frame({"t": "hello", "version": control.PROTOCOL_VERSION}),
    "deeply nested": HEADER.pack(100_001) + b"\x91" * 100_000 + b"\xc0",
    "a million-entry map header": HEADER.pack(5) + b"\xdf\x00\x0f\x42\x40",
    "a 4 GiB string header": HEADER.pack(5) + b"\xdb\xff\xff\xff\xff",
}


@pytest.mark.parametrize("hello_first", [False, True], ids=["before hello", "after hello"])
@pytest.mark.parametrize("name", sorted(BAD_FRAMES))
def test_a_malformed_control_frame_gets_a_coded_error_and_others_are_served(
        bystanders: Bystanders, name: str, hello_first: bool) -> None:
    answers = send_control_garbage(bystanders.daemon, BAD_FRAMES[name], hello_first=hello_first)
    assert_control_answers_are_coded(answers)
    if hello_first and name not in ("header only", "half a body", "three header bytes"):
        # A complete frame after the handshake is answered (most with an error), never silently dropped.
        assert len(answers) >= 2, answers
    bystanders.assert_served()


def test_a_malformed_frame_after_hello_leaves_the_connection_usable(bystanders: Bystanders) -> None:
    with ControlClient(bystanders.daemon.control_socket, client="garbage") as client:
        client.sock.sendall(BAD_FRAMES["invalid msgpack"])
        error = client.receive()
        assert isinstance(error, control.ErrorReply) and error.code == "PROTOCOL_ERROR"
        client.sock.sendall(BAD_FRAMES["call with list arguments"])
        error = client.receive()
        assert isinstance(error, control.ErrorReply)
        assert_coded_error({"code": error.code, "message": error.message})
        assert client.ok("diagd_status")["daemon"]["pid"] == bystanders.daemon.proc.pid


# ---------------------------------------------------------------------------------------------
# MCP


def read_mcp_answers(sock: socket.socket) -> list[dict[str, Any]]:
    data = bytearray()
    while chunk := _recv(sock):
        data += chunk
    lines = [line for line in bytes(data).split(b"\n") if line.strip()]
    return [json.loads(line) for line in lines]


def send_mcp_garbage(daemon: DaemonProcess, data: bytes, *, initialize_first: bool) -> list[dict[str, Any]]:
    sock = connect(daemon.mcp_socket)
    try:
        prefix = json.dumps(INITIALIZE).encode() + b"\n" if initialize_first else b""
        try:
            sock.sendall(prefix + data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_mcp_answers(sock)
    finally:
        sock.close()


def assert_json_rpc(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        assert answer.get("jsonrpc") == "2.0", answer
        if "error" in answer:
            error = answer["error"]
            assert isinstance(error.get("code"), int) and isinstance(error.get("message"), str), answer
            assert error["code"] not in (0, -32603), answer
            assert "Traceback" not in json.dumps(answer), answer
        else:
            assert "result" in answer or "method" in answer, answer


@given(data=st.binary(max_size=4096), initialize_first=st.booleans())
@GARBAGE
def test_random_bytes_on_the_mcp_socket_get_json_rpc_errors_and_others_are_served(
        daemon: DaemonProcess, data: bytes, initialize_first: bool) -> None:
    # Always ended by a newline: a first line left unfinished is answered only when the daemon's
    # first-message deadline (10 s) passes, which test_half_open_connections covers once.
    bystanders = Bystanders(daemon)
    try:
        assert_json_rpc(send_mcp_garbage(daemon, data + b"\n", initialize_first=initialize_first))
        bystanders.assert_served()
    finally:
        bystanders.close()


BAD_LINES: dict[str, bytes] = {
    "invalid JSON": b"{not json",
    "truncated JSON": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"',
    "invalid UTF-8": b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}',
    "lone surrogate": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "\\udc80"}}',
    "NUL byte": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list\x00"}',
    "escaped NUL in an argument": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
                                  b'"params": {"name": "diagd_calls", "arguments": {"tool": "a\\u0000b"}}}',
    "JSON scalar": b"42",
    "JSON null": b"null",
    "empty batch": b"[]",
    "batch of junk": b"[1, 2, 3]",
    "no jsonrpc field": b'{"id": 1, "method": "tools/list"}',
    "method not a string": b'{"jsonrpc": "2.0", "id": 1, "method": 5}',
    "params not an object": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1]}',
    "arguments not an object": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", '
                               b'"params": {"name": "diagd_status", "arguments": "x"}}',
    "unknown method": b'{"jsonrpc": "2.0", "id": 1, "method": "no/such/method"}',
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "a megabyte string": b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"a" * 1_000_000 + b'"}',
    "a huge number": b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": 1' + b"0" * 5000 + b"}}",
    "a response sent to the daemon": b'{"jsonrpc": "2.0", "id": 1, "result": {}}',
}


@pytest.mark.parametrize("initialize_first", [False, True], ids=["before initialize", "after initialize"])
@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_malformed_mcp_line_gets_a_json_rpc_error_and_others_are_served(
        bystanders: Bystanders, name: str, initialize_first: bool) -> None:
    answers = send_mcp_garbage(bystanders.daemon, BAD_LINES[name] + b"\n", initialize_first=initialize_first)
    assert_json_rpc(answers)
    bystanders.assert_served()


def test_a_line_over_the_default_limit_gets_an_error_and_a_close_and_others_are_served(
        bystanders: Bystanders) -> None:
    answers = send_mcp_garbage(bystanders.daemon, b"[" * (9 * 1024 * 1024), initialize_first=False)
    assert answers and "error" in answers[-1], answers
    assert_json_rpc(answers)
    bystanders.assert_served()


@pytest.mark.parametrize("request_id", [None, 1.5, {}, [], True, "", 10**30, -1], ids=repr)
def test_a_request_with_an_odd_id_gets_exactly_one_answer_and_the_session_lives(
        daemon: DaemonProcess, request_id: Any) -> None:
    raw = RawMCP(daemon.mcp_socket, timeout=5)
    try:
        raw.initialize()
        raw.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                  "params": {"name": "diagd_status", "arguments": {}}})
        answer = raw.read()
        assert answer is not None, f"no answer to id {request_id!r}"
        assert_json_rpc([answer])
        valid = request_id is None or (isinstance(request_id, int | float | str) and not isinstance(request_id, bool))
        assert answer.get("id") == (request_id if valid else None), answer
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}})
        after = raw.read()
        assert after is not None and after["id"] == 7 and "result" in after, after
    finally:
        raw.close()


def test_half_open_connections_on_both_sockets_do_not_stop_other_clients(bystanders: Bystanders) -> None:
    """Connections that stop mid-frame, mid-line or before a byte, and never close."""
    daemon = bystanders.daemon
    stuck: list[socket.socket] = []
    try:
        partials = [b"", b"\x00", b"\x00\x00\x10", HEADER.pack(1000) + b"\x81",
                    control.encode(control.Hello(version=control.PROTOCOL_VERSION, client="stuck")) + HEADER.pack(50)]
        for data in partials:
            sock = connect(daemon.control_socket)
            sock.sendall(data)
            stuck.append(sock)
        for data in [b"", b"{", b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {',
                     json.dumps(INITIALIZE).encode() + b"\n" + b'{"jsonrpc":']:
            sock = connect(daemon.mcp_socket)
            sock.sendall(data)
            stuck.append(sock)
        for _ in range(3):
            bystanders.assert_served()
    finally:
        for sock in stuck:
            sock.close()
    bystanders.assert_served()


def test_msgpack_of_every_type_in_call_arguments_gets_an_answer(bystanders: Bystanders) -> None:
    """Types JSON has no word for (bytes, ext, timestamps, non-string keys) inside arguments."""
    odd = [b"\x00\xff", msgpack.ExtType(5, b"x"), {1: 2}, {b"k": 1}, [None] * 3, 2**64 - 1, -(2**63), 1e308]
    with ControlClient(bystanders.daemon.control_socket, client="garbage") as client:
        for value in odd:
            body = msgpack.packb({"t": "call", "id": 1, "tool": "diagd_calls", "arguments": {"tool": value}},
                                 use_bin_type=True, strict_types=False)
            client.sock.sendall(HEADER.pack(len(body)) + body)
            answer = client.receive()
            assert answer is not None
            if isinstance(answer, control.ErrorReply):
                assert_coded_error({"code": answer.code, "message": answer.message, "details": answer.details})
            else:
                assert isinstance(answer, control.Reply)
                if answer.result["is_error"]:
                    assert_coded_error(answer.result["result"])
    bystanders.assert_served()


def test_non_finite_numbers_sent_on_the_control_socket_never_make_mcp_text_invalid_json(
        bystanders: Bystanders) -> None:
    """msgpack carries NaN and infinities, JSON does not: what the daemon echoes of them (diagd_calls,
    the audit log) must stay JSON and say the same in text and structuredContent."""
    env = bystanders.daemon.env
    env.write_config(env.config.read_text() + "\n[mcp]\nshow_other_clients_arguments = true\n")
    with ControlClient(bystanders.daemon.control_socket, client="garbage") as client:
        # Another client's arguments reach diagd_calls only when the config says so: it says so here.
        assert not client.call("diagd_reload", {})[0]
        for value in (float("nan"), float("inf"), float("-inf")):
            is_error, payload = client.call("diagd_calls", {"limit": value, "tool": value})
            if is_error:
                assert_coded_error(payload)
    raw = RawMCP(bystanders.daemon.mcp_socket, timeout=15)
    try:
        raw.initialize()
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "diagd_calls", "arguments": {"limit": 50}}})
        reply = raw.read()
    finally:
        raw.close()
    assert reply is not None and "result" in reply, reply

    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} where JSON was due (the text content or an audit record)")

    text = reply["result"]["content"][0]["text"]
    assert "structuredContent" in reply["result"], reply["result"]
    assert json.loads(text, parse_constant=refuse) == reply["result"]["structuredContent"]
    assert any(c["arguments"].get("limit") == "nan" for c in reply["result"]["structuredContent"]["calls"]), text
    for line in (bystanders.daemon.env.state / "audit.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=refuse)
