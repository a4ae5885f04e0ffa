"""JSON-RPC 2.0 edge cases, NUL bytes in tool arguments, call audit records and reloaded idle timeouts,
over the real MCP socket of a real daemon, with the exact responses expected."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.conftest import DaemonProcess
from tests.support.raw import INITIALIZE, RawMCP

pytestmark = pytest.mark.e2e

PROTOCOL = {"code": "PROTOCOL_ERROR"}


def session(daemon: DaemonProcess) -> RawMCP:
    raw = RawMCP(daemon.mcp_socket)
    raw.initialize()
    return raw


def echo_call(ident: Any, message: str = "hi") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": message}}}


def bad_id(ident: Any, shown: str, echoed: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": echoed, "error": {
        "code": -32600, "message": f"Invalid Request: id must be a string or an integer, not {shown}",
        "data": PROTOCOL}}


@pytest.mark.parametrize(("ident", "shown", "echoed"), [
    (None, "null", None),  # MCP forbids a null id; echoing it is also null
    (1.5, "1.5", 1.5),  # a number JSON-RPC can carry: echoed
    ({}, "{}", None),  # not a string or a number: the id cannot be detected, so null
    ([], "[]", None),
    (True, "true", None),
])
def test_requests_with_invalid_ids_get_invalid_request_with_the_id_where_readable(
        daemon: DaemonProcess, ident: Any, shown: str, echoed: Any) -> None:
    raw = session(daemon)
    raw.send(echo_call(ident))
    assert raw.read() == bad_id(ident, shown, echoed)
    raw.send(echo_call(7))  # the connection lives on
    assert raw.read()["result"]["structuredContent"] == {"message": "hi", "resource": "default"}  # type: ignore[index]
    raw.close()


def test_a_lone_surrogate_gets_a_coded_error_with_the_requests_id(daemon: DaemonProcess) -> None:
    raw = session(daemon)
    raw.send_bytes(b'{"jsonrpc":"2.0","id":41,"method":"tools/call",'
                   b'"params":{"name":"echo","arguments":{"message":"x\\ud800y"}}}\n')
    assert raw.read() == {"jsonrpc": "2.0", "id": 41, "error": {
        "code": -32602,
        "message": "$.params.arguments.message: a lone surrogate (\\ud800-\\udfff without its pair) is not "
                   "Unicode text",
        "data": {"code": "INVALID_ARGUMENT", "path": "$.params.arguments.message"}}}
    raw.send_bytes(b'{"jsonrpc":"2.0","id":"s-1","method":"\\udfff"}\n')
    assert raw.read() == {"jsonrpc": "2.0", "id": "s-1", "error": {
        "code": -32600, "message": "$.method: a lone surrogate (\\ud800-\\udfff without its pair) is not Unicode text",
        "data": {"code": "INVALID_ARGUMENT", "path": "$.method"}}}
    raw.send_bytes(b'{"jsonrpc":"2.0","id":42,"method":"tools/call",'
                   b'"params":{"name":"echo","arguments":{"message":"\\ud83d\\ude00"}}}\n')  # a proper pair is fine
    assert raw.read()["result"]["structuredContent"]["message"] == "\U0001F600"  # type: ignore[index]
    raw.close()


def test_malformed_messages_get_the_spec_error_and_the_id_when_readable(daemon: DaemonProcess) -> None:
    raw = session(daemon)
    cases: list[tuple[bytes, dict[str, Any]]] = [
        (b"{not json", {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: Expecting property name enclosed in double quotes: "
                                       "line 1 column 2 (char 1)", "data": PROTOCOL}}),
        (b"[]", {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Invalid Request: an empty batch", "data": PROTOCOL}}),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Invalid Request: batches are not supported, send one message at a time",
            "data": PROTOCOL}}),
        (b'{"jsonrpc":"2.0","id":12,"method":5}', {"jsonrpc": "2.0", "id": 12, "error": {
            "code": -32600, "message": "Invalid Request: method must be a string", "data": PROTOCOL}}),
        (b'{"id":13,"method":"ping"}', {"jsonrpc": "2.0", "id": 13, "error": {
            "code": -32600, "message": 'Invalid Request: jsonrpc must be "2.0"', "data": PROTOCOL}}),
        (b'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":[1]}', {"jsonrpc": "2.0", "id": 14, "error": {
            "code": -32602, "message": "Invalid params: params must be an object", "data": PROTOCOL}}),
    ]
    for line, expected in cases:
        raw.send_bytes(line + b"\n")
        assert raw.read() == expected, line
    raw.close()


def test_calls_before_initialize_get_a_clear_error_and_ping_and_unknown_methods_keep_theirs(
        daemon: DaemonProcess) -> None:
    raw = RawMCP(daemon.mcp_socket)
    raw.send(echo_call(3))
    assert raw.read() == {"jsonrpc": "2.0", "id": 3, "error": {
        "code": -32600, "message": "session not initialized: send initialize, wait for its result, then "
                                   "notifications/initialized, before tools/call",
        "data": {"code": "PROTOCOL_ERROR", "method": "tools/call"}}}
    raw.send({"jsonrpc": "2.0", "id": 4, "method": "ping"})
    assert raw.read() == {"jsonrpc": "2.0", "id": 4, "result": {}}
    raw.send({"jsonrpc": "2.0", "id": 5, "method": "no/such"})
    assert raw.read() == {"jsonrpc": "2.0", "id": 5, "error": {"code": -32601, "message": "Method not found",
                                                               "data": "no/such"}}
    raw.initialize()
    raw.send(echo_call(6))
    assert raw.read()["result"]["isError"] is False  # type: ignore[index]
    raw.close()


def test_initialize_then_an_immediate_call_is_served_without_waiting(daemon: DaemonProcess) -> None:
    raw = RawMCP(daemon.mcp_socket)
    raw.send_bytes(json.dumps(INITIALIZE).encode() + b"\n" + json.dumps(echo_call(1)).encode() + b"\n")
    assert "result" in raw.read()  # type: ignore[operator]
    assert raw.read()["result"]["isError"] is False  # type: ignore[index]
    raw.close()


@pytest.mark.parametrize(("tool", "arguments", "path", "offset"), [
    ("exec_program", {"program": "BEGIN { printf(\"hi\"); }\x00 tracepoint:syscalls:sys_enter_openat {}"},
     "$.program", 23),
    ("list_probes", {"filter": "tracepoint:sched:\x00*"}, "$.filter", 17),
    ("run_crash_command", {"command": "bt\x00; !id"}, "$.command", 2),
    ("pcap_info", {"pcap_path": "/tmp/x.pcap\x00.txt"}, "$.pcap_path", 11),
    ("pcap_packet_list", {"pcap_path": "/tmp/a.pcap", "extra_columns": [{"name": "c", "field": "ip.\x00src"}]},
     "$.extra_columns[0].field", 3),
])
def test_a_nul_byte_in_any_string_argument_is_invalid_argument_naming_it(
        daemon: DaemonProcess, tool: str, arguments: dict[str, Any], path: str, offset: int) -> None:
    raw = session(daemon)
    raw.send({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": tool, "arguments": arguments}})
    reply = raw.read()
    assert reply is not None
    result = reply["result"]
    error = {"code": "INVALID_ARGUMENT",
             "message": f"{path}: contains a NUL byte (\\u0000) at offset {offset}; no back end accepts one",
             "details": {"path": path}}
    assert result["isError"] is True and json.loads(result["content"][0]["text"]) == error
    assert set(result) == {"_meta", "content", "isError"}
    raw.close()


def audit(daemon: DaemonProcess) -> list[dict[str, Any]]:
    path = daemon.env.state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(predicate: Any, what: str, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def test_a_hanging_call_is_in_the_audit_log_and_diagd_calls_while_it_runs(daemon: DaemonProcess) -> None:
    hanging = session(daemon)
    hanging.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                  "params": {"name": "echo", "arguments": {"message": "stuck", "delay_s": 60}}})
    started = wait_for(lambda: [r for r in audit(daemon) if r["tool"] == "echo"], "the started record")
    assert [(r["outcome"], r["arguments"]) for r in started] == [("started", {"message": "stuck", "delay_s": 60})]
    call_id = started[0]["call_id"]
    logs = daemon.env.run("logs", "-n", "5")
    assert "echo" in logs.stdout and "started" in logs.stdout
    watcher = session(daemon)
    watcher.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                  "params": {"name": "diagd_calls", "arguments": {"tool": "echo"}}})
    calls = watcher.read()["result"]["structuredContent"]["calls"]  # type: ignore[index]
    assert [(c["outcome"], c["call_id"]) for c in calls] == [("running", call_id)]
    hanging.close()  # a hang-up cancels the call: its end is recorded under the same id
    ended = wait_for(lambda: [r for r in audit(daemon) if r.get("call_id") == call_id and r["outcome"] != "started"],
                     "the end record")
    assert [r["outcome"] for r in ended] == ["cancelled"]
    watcher.close()


def test_a_reloaded_idle_timeout_expires_an_actor_started_before_the_reload(daemon: DaemonProcess) -> None:
    raw = session(daemon)
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "echo", "arguments": {"message": "x", "resource": "before-reload"}}})
    assert raw.read()["result"]["isError"] is False  # type: ignore[index]

    def actors() -> list[dict[str, Any]]:
        return [a for a in json.loads(daemon.env.run("status", "--json").stdout)["actors"]
                if a["resource"] == "before-reload"]

    assert actors()[0]["idle_s_left"] > 500  # the fixture's idle_timeout_s = 600
    daemon.env.write_config('[daemon]\nextra_backends = ["echo_actor"]\nidle_timeout_s = 0.5\n')
    assert daemon.env.run("reload").returncode == 0
    wait_for(lambda: not actors(), "the actor to idle out under the reloaded timeout")
    raw.close()
