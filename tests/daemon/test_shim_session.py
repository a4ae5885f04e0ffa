"""The shim's session logic without processes: what it remembers, replays, swallows and fails."""

from __future__ import annotations

import json
from typing import Any

import pytest

from diagd.daemon.shim.shim_session import Closing, ReplayFailed, ShimSession, Verdict

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def line(msg: dict[str, Any], *, compact: bool = True) -> bytes:
    return json.dumps(msg, separators=(",", ":") if compact else None).encode() + b"\n"


def call(ident: Any, tool: str = "echo") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def result(ident: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": {"content": []}}


def opened() -> ShimSession:
    s = ShimSession()
    s.from_client(line(INIT))
    assert s.from_daemon(line(result(0))) is Verdict.FORWARD
    s.from_client(line(INITIALIZED))
    return s


def test_answered_requests_leave_the_in_flight_set_and_only_unanswered_ones_are_failed() -> None:
    s = opened()
    s.from_client(line(call(1)))
    s.from_client(line(call("a")))
    s.from_client(line(call(2)))
    assert s.from_daemon(line(result(1))) is Verdict.FORWARD
    assert s.from_daemon(line({"jsonrpc": "2.0", "id": 2, "error": {"code": -32602, "message": "x"}})) \
        is Verdict.FORWARD
    failed = [json.loads(x) for x in s.dropped()]
    assert failed == [{"jsonrpc": "2.0", "id": "a", "error": {
        "code": -32000, "message": "DAEMON_RESTARTED: the daemon restarted while tools/call was in flight; it may or "
                                   "may not have run. The session goes on: the call may be retried",
        "data": {"code": "DAEMON_RESTARTED", "method": "tools/call"}}}]
    assert s.in_flight == {} and s.dropped() == []


def test_ids_1_and_string_1_are_different_requests() -> None:
    s = opened()
    s.from_client(line(call(1)))
    s.from_client(line(call("1")))
    s.from_daemon(line(result("1")))
    assert [json.loads(x)["id"] for x in s.dropped()] == [1]


def test_the_replay_is_the_prelude_then_initialize_under_a_shim_id_then_initialized() -> None:
    s = opened()
    s.prelude.append(b'{"diagd":{"v":1,"tools":["pcap"]}}\n')
    s.dropped()
    replay = s.replay()
    assert replay[0] == b'{"diagd":{"v":1,"tools":["pcap"]}}\n'
    assert json.loads(replay[1]) == {**INIT, "id": "diagd-shim-replay-1"}
    assert replay[2] == line(INITIALIZED)
    # The answer to the replayed initialize is ours; the next one with that id would be the client's.
    assert s.from_daemon(line(result("diagd-shim-replay-1"), compact=False)) is Verdict.SWALLOW
    assert s.from_daemon(line(result("diagd-shim-replay-1"))) is Verdict.FORWARD
    s.dropped()
    assert json.loads(s.replay()[1])["id"] == "diagd-shim-replay-2"


def test_an_error_answering_the_replayed_initialize_is_a_replay_failure() -> None:
    s = opened()
    s.dropped()
    s.replay()
    with pytest.raises(ReplayFailed, match="unsupported protocol"):
        s.from_daemon(line({"jsonrpc": "2.0", "id": "diagd-shim-replay-1",
                            "error": {"code": -32602, "message": "unsupported protocol"}}))


def test_an_initialize_still_unanswered_is_replayed_under_the_clients_own_id() -> None:
    s = ShimSession()
    s.from_client(line(INIT))
    assert s.dropped() == []  # not failed: the client gets the answer of the replay
    assert s.replay() == [line(INIT)]
    assert s.from_daemon(line(result(0))) is Verdict.FORWARD
    assert s.in_flight == {}


def test_nothing_is_replayed_before_the_client_initialized_anything_but_the_prelude() -> None:
    s = ShimSession(prelude=[b'{"diagd":{"v":1}}\n'])
    assert s.replay() == [b'{"diagd":{"v":1}}\n']


def notice(code: str) -> bytes:
    return line({"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": f"{code}: bye",
                                                        "data": {"code": code, "closing": True}}}, compact=False)


def test_a_stopping_notice_is_swallowed_and_means_reconnect_a_refusal_is_forwarded_and_means_stop() -> None:
    s = opened()
    assert s.closing() is Closing.DROPPED
    assert s.from_daemon(notice("DAEMON_STOPPING")) is Verdict.SWALLOW
    assert s.closing() is Closing.STOPPING
    s.dropped()
    assert s.closing() is Closing.DROPPED  # a new connection starts without last words
    assert s.from_daemon(notice("BUSY")) is Verdict.FORWARD
    assert s.closing() is Closing.REFUSED and s.notice_message() == "BUSY: bye"


def test_other_lines_pass_untouched_and_untracked() -> None:
    s = opened()
    progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}
    assert s.from_daemon(line(progress)) is Verdict.FORWARD
    assert s.from_daemon(b"not json\n") is Verdict.FORWARD
    for garbage in (b"not json\n", b"[1,2]\n", line({"jsonrpc": "2.0", "id": None, "method": "x"}),
                    line({"jsonrpc": "2.0", "id": True, "method": "x"})):
        s.from_client(garbage)
    assert s.in_flight == {}


def test_a_big_result_is_matched_by_its_head_without_parsing_the_rest() -> None:
    s = opened()
    s.from_client(line(call(7)))
    big = b'{"jsonrpc":"2.0","id":7,"result":{"x":"' + b"a" * 1_000_000 + b'"'  # not even valid JSON
    assert s.from_daemon(big + b"\n") is Verdict.FORWARD
    assert s.in_flight == {}


def test_a_cancelled_request_is_no_longer_in_flight() -> None:
    """MCP: a request the client cancelled gets no answer, so a drop must not answer it either."""
    session = ShimSession()
    session.from_client(b'{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"x"}}\n')
    session.from_client(b'{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"y"}}\n')
    session.from_client(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":0}}\n')
    assert [json.loads(line)["id"] for line in session.dropped()] == ["a"]
