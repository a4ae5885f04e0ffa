"""Raw JSON-RPC probes on both transports of one real daemon: stdio through the real `diagd mcp` shim,
Streamable HTTP with raw requests. Each probe gets the same JSON-RPC answer on both, none is dropped
(no HTTP 202 for a request), none is a 500; HTTP-only probes (protocol header, Last-Event-ID, session
and Host/Origin refusals) get JSON-RPC-shaped bodies. Also: the protocol eras both transports speak,
and a tool list fixed for a session's life across a reload that changes `[mcp] tools`."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest

from tests.conftest import DIAGD, Env
from tests.e2e.test_http import ACCEPT, HttpDaemon, free_port, running

pytestmark = pytest.mark.e2e

PROTOCOL = {"code": "PROTOCOL_ERROR"}
INIT_PARAMS = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}


class Stdio:
    """`diagd mcp` (the real shim) as a raw line pipe."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.proc = subprocess.Popen([DIAGD, "mcp"], env=env.vars, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def ask(self, line: bytes) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the shim closed its output"
        return dict(json.loads(answer))

    def tell(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()

    def open_session(self) -> dict[str, Any]:
        answer = self.ask(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                      "params": INIT_PARAMS}).encode())
        self.tell({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=20)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@dataclass
class Http:
    url: str
    token: str
    session: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def post(self, body: bytes, **extra: str) -> httpx2.Response:
        headers = {**ACCEPT, "Authorization": f"Bearer {self.token}", **self.headers, **extra}
        if self.session is not None:
            headers["Mcp-Session-Id"] = self.session
        answer = httpx2.post(self.url, content=body, headers=headers, timeout=30)
        assert answer.status_code not in (202, 500), (answer.status_code, answer.text)
        return answer

    def ask(self, body: bytes, **extra: str) -> dict[str, Any]:
        return message(self.post(body, **extra))

    def open_session(self) -> dict[str, Any]:
        answer = self.post(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                                       "params": INIT_PARAMS}).encode())
        self.session = answer.headers["mcp-session-id"]
        self.headers["MCP-Protocol-Version"] = "2025-11-25"
        done = httpx2.post(self.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                           headers={**ACCEPT, **self.headers, "Authorization": f"Bearer {self.token}",
                                    "Mcp-Session-Id": self.session}, timeout=30)
        assert done.status_code == 202
        return message(answer)


def message(answer: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC message of an answer, sent as JSON or as the last SSE event."""
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in answer.text.splitlines() if line.startswith("data:")]
        return dict(json.loads([d for d in data if d][-1]))
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    return dict(json.loads(answer.text))


@pytest.fixture
def both(env: Env) -> Iterator[tuple[Stdio, Http, HttpDaemon]]:
    port = free_port()
    with running(env, f'[daemon]\nextra_backends = ["echo_actor"]\n[http]\nlisten = "127.0.0.1:{port}"\n') as http:
        stdio = Stdio(env)
        try:
            yield stdio, Http(http.url, http.token), http
        finally:
            stdio.close()


def call(ident: Any, params: dict[str, Any], method: str = "tools/call") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params}).encode()


def error(ident: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": ident, "error": err}


def bad_id(shown: str, echoed: Any) -> dict[str, Any]:
    return error(echoed, -32600, f"Invalid Request: id must be a string or an integer, not {shown}", PROTOCOL)


# data.supported: what server/discover lists (the versions an envelope may name), as the 2026-07-28 draft's
# UnsupportedProtocolVersionError; the message names every era, for a handshake-era client.
UNSUPPORTED = {"code": "PROTOCOL_ERROR", "supported": ["2026-07-28"], "requested": "1999-01-01"}
UNSUPPORTED_MESSAGE = ('Unsupported protocol version "1999-01-01": diagd speaks 2024-11-05, 2025-03-26, 2025-06-18, '
                       "2025-11-25 (initialize handshake) and 2026-07-28 (per-request envelope)")

PROBES: list[tuple[str, bytes, dict[str, Any]]] = [
    ("null id", b'{"jsonrpc":"2.0","id":null,"method":"ping"}', bad_id("null", None)),
    ("float id", b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', bad_id("1.5", 1.5)),
    ("object id", b'{"jsonrpc":"2.0","id":{},"method":"ping"}', bad_id("{}", None)),
    ("wrong jsonrpc", b'{"jsonrpc":"1.0","id":4,"method":"ping"}',
     error(4, -32600, 'Invalid Request: jsonrpc must be "2.0"', PROTOCOL)),
    ("batch", b'[{"jsonrpc":"2.0","id":5,"method":"ping"}]',
     error(None, -32600, "Invalid Request: batches are not supported, send one message at a time", PROTOCOL)),
    ("unknown method", b'{"jsonrpc":"2.0","id":6,"method":"no/such"}', error(6, -32601, "Method not found", "no/such")),
    ("unknown tool", call(7, {"name": "ecoh", "arguments": {}}),
     error(7, -32602, "unknown tool 'ecoh' (did you mean echo?)",
           {"code": "INVALID_ARGUMENT", "tool": "ecoh", "did_you_mean": ["echo"]})),
    ("missing name", call(8, {"arguments": {}}),
     error(8, -32602, "Invalid params for tools/call: $.params.name: required, missing",
           {"code": "INVALID_ARGUMENT", "path": "$.params.name"})),
]


def test_each_probe_gets_the_same_json_rpc_answer_on_stdio_and_http(both: tuple[Stdio, Http, HttpDaemon]) -> None:
    stdio, http, _ = both
    stdio.open_session()
    http.open_session()
    for name, body, expected in PROBES:
        assert stdio.ask(body) == expected, name
        assert http.ask(body) == expected, name
    # Both connections live on.
    assert stdio.ask(call(10, {}, "ping")) == http.ask(call(10, {}, "ping")) == {"jsonrpc": "2.0", "id": 10,
                                                                                  "result": {}}


def test_http_refusals_are_short_json_rpc_errors_and_never_a_500(both: tuple[Stdio, Http, HttpDaemon]) -> None:
    _, http, daemon = both
    http.open_session()
    ping = call(11, {}, "ping")
    # An unsupported MCP-Protocol-Version header: as the same version in a stdio envelope.
    answer = http.post(ping, **{"MCP-Protocol-Version": "1999-01-01"})
    assert (answer.status_code, message(answer)) == (400, error(11, -32022, UNSUPPORTED_MESSAGE, UNSUPPORTED))
    # Streams are not resumable: a clean 400 saying so.
    resume = httpx2.get(http.url, headers={**ACCEPT, "Authorization": f"Bearer {http.token}",
                                           "Mcp-Session-Id": str(http.session), "Last-Event-ID": "5"}, timeout=30)
    assert resume.status_code == 400
    assert "not resumable" in message(resume)["error"]["message"]
    # No session: 400, JSON-RPC-shaped, and no fresh session id handed out.
    bare = Http(http.url, http.token)
    answer = bare.post(call(12, {}, "tools/list"))
    assert answer.status_code == 400 and "mcp-session-id" not in answer.headers
    assert message(answer)["error"]["code"] == -32600
    # DNS rebinding refusals (421 Host, 403 Origin) carry JSON-RPC errors, not plain text.
    for status, extra in ((421, {"Host": "evil.example"}), (403, {"Origin": "http://evil.example"})):
        answer = bare.post(json.dumps({"jsonrpc": "2.0", "id": 13, "method": "initialize",
                                       "params": INIT_PARAMS}).encode(), **extra)
        assert answer.status_code == status and "mcp-session-id" not in answer.headers
        refused = message(answer)
        assert refused["error"]["code"] == -32600 and refused["error"]["data"]["http_status"] == status, refused
        assert len(answer.content) < 400
    assert daemon.daemon.proc.poll() is None


def test_an_unsupported_version_lists_what_server_discover_lists_and_over_http_a_header_mismatch_comes_first(
        both: tuple[Stdio, Http, HttpDaemon]) -> None:
    stdio, http, _ = both
    unknown = call(9, {"_meta": {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "1999-01-01"}}, "tools/list")
    refused = error(9, -32022, UNSUPPORTED_MESSAGE, UNSUPPORTED)
    assert stdio.ask(unknown) == refused
    bare = Http(http.url, http.token)
    answer = bare.post(unknown, **{"MCP-Protocol-Version": "1999-01-01", "Mcp-Method": "tools/list"})
    assert (answer.status_code, message(answer)) == (400, refused)
    # The header is not the envelope's version, either way round: HeaderMismatch (-32020), never -32022.
    served = call(9, {"_meta": ENVELOPE}, "tools/list")
    for body, version in ((unknown, "2026-07-28"), (served, "1999-01-01"), (served, "2025-11-25")):
        answer = bare.post(body, **{"MCP-Protocol-Version": version, "Mcp-Method": "tools/list"})
        mismatch = message(answer)
        assert (answer.status_code, mismatch["id"], mismatch["error"]["code"]) == (400, 9, -32020), mismatch
        assert mismatch["error"]["data"] == {**PROTOCOL, "header": "MCP-Protocol-Version"}
    # server/discover lists exactly what the refusal lists, on both transports.
    discover = call(10, {"_meta": ENVELOPE}, "server/discover")
    over_http = bare.ask(discover, **{"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"})
    fresh = Stdio(stdio.env)
    try:
        over_stdio = fresh.ask(discover)
    finally:
        fresh.close()
    assert over_http["result"]["supportedVersions"] == over_stdio["result"]["supportedVersions"] == \
        UNSUPPORTED["supported"]


def test_both_transports_speak_the_same_eras(both: tuple[Stdio, Http, HttpDaemon]) -> None:
    stdio, http, _ = both
    # initialize asking for 2026-07-28 (which has no handshake): the newest handshake version on both.
    init = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {**INIT_PARAMS, "protocolVersion": "2026-07-28"}}).encode()
    assert stdio.ask(init)["result"]["protocolVersion"] == "2025-11-25"
    assert Http(http.url, http.token).ask(init)["result"]["protocolVersion"] == "2025-11-25"
    # A 2026-07-28 request (per-request envelope, no handshake) is served on both.
    fresh = Stdio(stdio.env)
    try:
        listed = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": ENVELOPE}})
        over_stdio = fresh.ask(listed.encode())
    finally:
        fresh.close()
    over_http = Http(http.url, http.token).ask(listed.encode(), **{"MCP-Protocol-Version": "2026-07-28",
                                                                   "Mcp-Method": "tools/list"})
    assert "result" in over_http, over_http
    names = [t["name"] for t in over_stdio["result"]["tools"]]
    assert "echo" in names and names == [t["name"] for t in over_http["result"]["tools"]]


def test_an_unknown_tool_is_a_protocol_error_and_still_audited_and_counted_on_both_transports(
        both: tuple[Stdio, Http, HttpDaemon], env: Env) -> None:
    stdio, http, _ = both
    stdio.open_session()
    http.open_session()
    probe = call(30, {"name": "ecoh", "arguments": {"message": "hi"}})
    expected = error(30, -32602, "unknown tool 'ecoh' (did you mean echo?)",
                     {"code": "INVALID_ARGUMENT", "tool": "ecoh", "did_you_mean": ["echo"]})
    assert stdio.ask(probe) == expected  # the answer as before: recording it changes nothing the client sees
    assert http.ask(probe) == expected
    records = [json.loads(line) for line in (env.state / "audit.jsonl").read_text().splitlines()]
    asked = [r for r in records if r["tool"] == "ecoh"]
    ended = [r for r in asked if r["outcome"] != "started"]
    assert len(asked) == 4 and len(ended) == 2  # each call's start and end, one call_id each
    assert {r["call_id"] for r in asked} == {r["call_id"] for r in ended}
    assert sorted(r["client"].split(":")[0] for r in ended) == ["http", "mcp"]
    for record in ended:
        assert record["outcome"] == "error" and record["code"] == "INVALID_ARGUMENT"
        assert record["details"] == {"jsonrpc_code": -32602, "did_you_mean": ["echo"]}
        assert record["arguments"] == {"message": "hi"}
    status = json.loads(env.run("status", "--json").stdout)
    assert (status["tools"]["ecoh"]["count"], status["tools"]["ecoh"]["failures"]) == (2, 2)
    # And diagd_calls shows them to an agent.
    shown = stdio.ask(call(31, {"name": "diagd_calls", "arguments": {"tool": "ecoh"}}))
    assert [c["code"] for c in shown["result"]["structuredContent"]["calls"]] == ["INVALID_ARGUMENT"] * 2



def listed_names(answer: dict[str, Any]) -> list[str]:
    return [t["name"] for t in answer["result"]["tools"]]


def test_a_reload_that_changes_the_tool_groups_leaves_live_sessions_lists_unchanged(
        both: tuple[Stdio, Http, HttpDaemon], env: Env) -> None:
    """Fixed for a session's life on both transports (listChanged: false, so no notification is owed);
    sessions opened after the reload get the new list, and the reload answer says so."""
    stdio, http, daemon = both
    assert stdio.open_session()["result"]["capabilities"]["tools"].get("listChanged") in (None, False)
    assert http.open_session()["result"]["capabilities"]["tools"].get("listChanged") in (None, False)
    tools_list = call(20, {}, "tools/list")
    before = listed_names(stdio.ask(tools_list))
    assert "pcap_info" in before and listed_names(http.ask(tools_list)) == before
    env.write_config(env.config.read_text() + '[mcp]\ntools = ["echo_actor"]\n')
    reloaded = env.run("reload")
    assert reloaded.returncode == 0, reloaded.stderr
    note = next(n for n in json.loads(reloaded.stdout)["not_yet_applied"] if n["setting"] == "[mcp] tools")
    assert note["applies_to"].startswith("MCP sessions opened after the reload (stdio connections and HTTP sessions")
    assert "listChanged: false" in note["why"]
    assert listed_names(stdio.ask(tools_list)) == before
    assert listed_names(http.ask(tools_list)) == before
    # Calls are held to the session's list as well: a pcap tool still answers, as a tool.
    called = http.ask(call(21, {"name": "pcap_list_fields", "arguments": {"search": "ngap.procedureCode"}}))
    assert "result" in called, called
    # New sessions get the new groups, on both transports.
    fresh_http = Http(daemon.url, daemon.token)
    fresh_http.open_session()
    after = listed_names(fresh_http.ask(tools_list))
    assert "echo" in after and "pcap_info" not in after
    fresh = Stdio(env)
    try:
        fresh.open_session()
        assert listed_names(fresh.ask(tools_list)) == after
    finally:
        fresh.close()
