"""HTTP MCP sessions in process, as docs/http.md describes them (Sessions, Caps, Idle expiry, Restarts),
on Trio's MockClock with the SDK's own server and transports driven by ASGI requests (no socket):

- a session is bound to the id of the token that opened it (`AccessToken.token`), never to the token's
  name (`client_id`, "http:<name>"): another id with the same name gets 404, as an unknown id;
- a stop and start keeps every established session revivable: `http_sessions.json` (0600) lists it with
  the token's id and the client's `initialize` params, and the next manager revives it under the same id,
  the original params replayed (the server sees the client's own `clientInfo`);
- the file is written within a second of a change while the daemon runs;
- refusals (400, 413, 503) carry JSON-RPC errors and no session id; the daemon log names what happened
  ("http session refused/evicted/freed while idle/revived", the events tests/e2e/test_http_sessions.py
  waits for) with short prefixes of the ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from mcp import types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server

from diagd.daemon.http_settings import HttpConfig
from diagd.daemon.server.http import sessions as http_sessions
from diagd.daemon.server.http.front import security_settings
from diagd.daemon.server.http.session_replay import body_once
from diagd.daemon.server.http.sessions import SessionManager

ID_A = "a1b2c3d4e5f6a7b8c9d0e1f2"  # token ids as tokens.py makes them (24 hex digits)
ID_B = "0f1e2d3c4b5a69788796a5b4"


def init(client: str = "probe") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": client, "version": "1.0"}}}


PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
LIST = {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {}}


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    """One tool named after the client the session was initialized by: shows which params it holds."""
    cp = ctx.session.client_params
    name = cp.client_info.name if cp is not None else "nobody"
    return types.ListToolsResult(tools=[types.Tool(name=f"for-{name}", input_schema={"type": "object"})])


class Answer:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    @property
    def sid(self) -> str | None:
        value = self.headers.get(b"mcp-session-id")
        return None if value is None else value.decode()

    def json(self) -> Any:
        text = self.body.decode()
        if text.startswith("event:"):  # one SSE message
            text = next(line[len("data: "):] for line in text.splitlines() if line.startswith("data: "))
        return json.loads(text)


async def request(m: SessionManager, token_id: str, message: Any, sid: str = "", *, method: str = "POST",
                  name: str = "laptop", version: str = "2025-06-18", body: bytes | None = None) -> Answer:
    raw = json.dumps(message).encode() if body is None else body
    headers = [(b"host", b"127.0.0.1:8765"), (b"content-type", b"application/json"),
               (b"accept", b"application/json, text/event-stream")]
    if sid:
        headers.append((b"mcp-session-id", sid.encode()))
    if sid or version != "2025-06-18":
        headers.append((b"mcp-protocol-version", version.encode()))
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers, "query_string": b"",
             "scheme": "http", "server": ("127.0.0.1", 8765), "client": ("127.0.0.1", 1),
             # as http/front.py makes it: the token's id is also the subject the SDK's owner check compares
             "user": AuthenticatedUser(AccessToken(token=token_id, client_id=f"http:{name}", scopes=[],
                                                   subject=token_id))}
    answer: dict[str, Any] = {"body": b"", "headers": {}}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"], answer["headers"] = message["status"], dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await m.handle_request(scope, body_once(raw), send)
    return Answer(answer["status"], answer["headers"], answer["body"])


def server(initialized: list[str] | None = None) -> Server[Any]:
    """A server with `list_tools`, noting each session's `notifications/initialized` (by client name)."""
    made: Server[Any] = Server("t", on_list_tools=list_tools)
    seen = initialized if initialized is not None else []

    async def on_initialized(ctx: Any, params: Any) -> None:
        seen.append(ctx.session.client_params.client_info.name)

    made.add_notification_handler("notifications/initialized", types.NotificationParams, on_initialized)
    return made


def manager(state: Path | None = None, freed: list[int] | None = None, initialized: list[str] | None = None,
            options: dict[str, Any] | None = None, **http: Any) -> SessionManager:
    config = HttpConfig(listen="127.0.0.1:8765", **http)
    done = freed if freed is not None else []
    return SessionManager(server(initialized), config, state_dir=state, on_freed=lambda: done.append(1),
                          **(options or {}))


INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def tools_of(answer: Answer) -> list[str]:
    return [t["name"] for t in answer.json()["result"]["tools"]]


def events(logged: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logged if e["event"] == name]


def stored(state: Path) -> list[dict[str, Any]]:
    data: dict[str, Any] = json.loads((state / "http_sessions.json").read_text())
    assert data["version"] == 2
    return list(data["sessions"])


async def test_a_session_survives_a_stop_and_start_with_its_own_initialize_replayed(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    state = tmp_path / "state"
    initialized: list[str] = []
    first = manager(state, initialized=initialized, session_idle_s=600)
    async with first.run():
        opened = await request(first, ID_A, init("probe-1"))
        sid = opened.sid
        assert (await request(first, ID_A, INITIALIZED, sid or "")).status == 202
        await trio.sleep(0.01)
        assert initialized == ["probe-1"]
        assert opened.status == 200 and sid is not None and tools_of(await request(first, ID_A, LIST, sid)) == [
            "for-probe-1"]
        other = await request(first, ID_B, init("probe-2"), name="ci")
        assert other.status == 200 and other.sid not in (None, sid)
        await trio.sleep(5)
    files = stored(state)
    assert os.stat(state / "http_sessions.json").st_mode & 0o777 == 0o600
    assert {(s["id"], s["token_id"], s["initialize"]["clientInfo"]["name"]) for s in files} == {
        (sid, ID_A, "probe-1"), (other.sid, ID_B, "probe-2")}
    assert all(s["initialize"] == init(s["initialize"]["clientInfo"]["name"])["params"] for s in files)
    second = manager(state, initialized=initialized, session_idle_s=600)
    with structlog.testing.capture_logs() as logged:
        async with second.run():
            assert second.book.live_count() == 0 and len(second.book) == 2
            refused = await request(second, ID_B, LIST, sid, name="laptop")  # the same name, another token id
            assert refused.status == 404 and refused.sid is None and sid not in second._server_instances
            assert not events(logged, "http session revived")
            again = await request(second, ID_A, LIST, sid)
            assert again.status == 200 and again.sid == sid and tools_of(again) == ["for-probe-1"]
            assert second.book.live_count() == 1 and sid in second._server_instances
            assert initialized == ["probe-1", "probe-1"]  # the client's notification replayed too
            assert (await request(second, ID_A, PING, sid)).status == 200  # no second revival
    (revived,) = events(logged, "http session revived")
    assert sid is not None and revived["client"] == "http:laptop"
    assert ID_A.startswith(revived["token_id"]) and len(revived["token_id"]) == 8
    assert sid.startswith(revived["session"]) and len(revived["session"]) == 8


async def test_the_file_follows_changes_within_a_second_while_running(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    state = tmp_path / "state"
    freed: list[int] = []
    m = manager(state, freed)
    async with m.run():
        await trio.sleep(0.1)
        assert not (state / "http_sessions.json").exists()  # nothing to write yet
        s1 = (await request(m, ID_A, init())).sid
        await trio.sleep(0.1)
        assert [s["id"] for s in stored(state)] == [s1]
        s2 = (await request(m, ID_A, init())).sid
        await trio.sleep(0.5)
        assert [s["id"] for s in stored(state)] == [s1]  # at most one write a second
        await trio.sleep(0.5)
        assert [s["id"] for s in stored(state)] == [s1, s2]
        await trio.sleep(5)
        deleted = await request(m, ID_A, None, s1, method="DELETE", body=b"")
        assert deleted.status == 200 and m.book.get(s1 or "") is None and freed
        await trio.sleep(0.1)
        assert [s["id"] for s in stored(state)] == [s2]
        assert (await request(m, ID_A, PING, s1)).status == 404
    assert [s["id"] for s in stored(state)] == [s2]


async def test_a_session_is_bound_to_the_token_id_not_its_name(autojump_clock: trio.testing.MockClock) -> None:
    m = manager()
    async with m.run():
        sid = (await request(m, ID_A, init(), name="laptop")).sid
        assert sid is not None
        record = m.book.get(sid)
        assert record is not None and record.token == ID_A and record.live
        used = record.last_used
        await trio.sleep(3)
        same_name = await request(m, ID_B, PING, sid, name="laptop")  # revoked and added again: a new id
        unknown = await request(m, ID_B, PING, "f" * 32, name="laptop")
        assert (same_name.status, same_name.json()) == (404, unknown.json()) and same_name.sid is None
        assert record.last_used == used and record.in_flight == 0  # not counted as a use
        assert (await request(m, ID_A, PING, sid)).status == 200
        assert record.last_used == used + 3 and record.in_flight == 0


async def test_the_session_in_use_is_not_the_one_a_token_at_its_cap_gives_up(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager(max_sessions_per_token=2, max_sessions=4)
    async with m.run():
        s1 = (await request(m, ID_A, init())).sid
        await trio.sleep(1)
        s2 = (await request(m, ID_A, init())).sid
        await trio.sleep(1)
        assert (await request(m, ID_A, PING, s1)).status == 200
        await trio.sleep(1)
        with structlog.testing.capture_logs() as logged:
            s3 = (await request(m, ID_A, init())).sid
        assert s3 is not None and s2 is not None
        assert [(await request(m, ID_A, PING, s)).status for s in (s1, s2, s3)] == [200, 404, 200]
        (evicted,) = events(logged, "http session evicted")
        assert ID_A.startswith(evicted["token_id"]) and len(evicted["token_id"]) == 8
        assert s2.startswith(evicted["session"]) and len(evicted["session"]) == 8
        assert s2 not in m._server_instances and s2 not in m._session_owners


async def test_a_refused_session_is_logged_with_its_reason_and_gets_no_id(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager(max_sessions_per_token=1, max_sessions=1)
    async with m.run():
        assert (await request(m, ID_A, init())).status == 200
        with structlog.testing.capture_logs() as logged:
            refused = await request(m, ID_B, init(), name="ci")
        assert refused.status == 503 and refused.sid is None and len(m.book) == 1
        assert all(k.lower() != b"mcp-session-id" for k in refused.headers)
        (event,) = events(logged, "http session refused")
        assert event["log_level"] == "warning" and event["client"] == "http:ci"
        assert event["token_id"] == ID_B[:8] and "max_sessions = 1" in event["reason"]


async def test_an_idle_session_is_freed_logged_and_revived_then_freed_again(
        autojump_clock: trio.testing.MockClock) -> None:
    freed: list[int] = []
    m = manager(None, freed, session_idle_s=60)
    async with m.run():
        sid = (await request(m, ID_A, init("idle"))).sid
        assert sid is not None
        with structlog.testing.capture_logs() as logged:
            await trio.sleep(61)
        (event,) = events(logged, "http session freed while idle")
        assert sid.startswith(event["session"]) and len(event["session"]) == 8 and freed == [1]
        record = m.book.get(sid)
        assert record is not None and not record.live
        again = await request(m, ID_A, LIST, sid)
        assert again.status == 200 and tools_of(again) == ["for-idle"] and record.live
        await trio.sleep(61)  # the revived session expires like any other
        assert sid not in m._server_instances and not record.live and freed == [1, 1]


async def test_requests_without_a_session_id_are_refused_with_json_rpc_errors_and_no_id(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager(max_body_bytes=2000)
    async with m.run():
        for method, body, status, text in [
                ("GET", b"", 400, "Bad Request: Mcp-Session-Id header is required"),
                ("DELETE", b"", 400, "Bad Request: Mcp-Session-Id header is required"),
                ("POST", json.dumps(PING).encode(), 400,
                 "Bad Request: Mcp-Session-Id header is required (only an initialize request opens a session)"),
                ("POST", json.dumps({**init(), "pad": "x" * 2000}).encode(), 413,
                 "Payload Too Large: over 2000 bytes")]:
            answer = await request(m, ID_A, None, method=method, body=body)
            assert (answer.status, answer.sid) == (status, None)
            error = json.loads(answer.body)
            assert error == {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": text}}
        assert len(m.book) == 0 and not m._server_instances
        fits = await request(m, ID_A, None, body=json.dumps({**init(), "pad": "x" * 1800}).encode())
        assert fits.status == 200 and fits.sid is not None


async def test_the_sessionless_protocol_era_goes_to_the_sdk_and_keeps_nothing(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager()
    async with m.run():
        answer = await request(m, ID_A, LIST, version="2026-07-28")
        assert b"Mcp-Session-Id" not in answer.body and answer.sid is None
        assert len(m.book) == 0 and not m._server_instances


async def test_an_unusable_file_is_logged_and_the_daemon_starts_without_sessions(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    (state / "http_sessions.json").symlink_to(target)
    with structlog.testing.capture_logs() as logged:
        m = manager(state)
        async with m.run():
            assert len(m.book) == 0
            sid = (await request(m, ID_A, init())).sid
            await trio.sleep(0.1)
    (event,) = events(logged, "http sessions of the last run not restored")
    assert event["log_level"] == "error" and "it is a symlink" in event["error"]
    assert target.read_text() == "untouched\n" and not (state / "http_sessions.json").is_symlink()
    assert [s["id"] for s in stored(state)] == [sid]


async def test_a_file_that_cannot_be_written_is_logged(tmp_path: Path,
                                                      autojump_clock: trio.testing.MockClock) -> None:
    state = tmp_path / "state"
    (state / "http_sessions.json").mkdir(parents=True, mode=0o700)  # a directory in its place
    (state / "http_sessions.json" / "x").write_text("")
    with structlog.testing.capture_logs() as logged:
        m = manager(state)
        async with m.run():
            await request(m, ID_A, init())
            await trio.sleep(0.1)
    assert events(logged, "http sessions of the last run not restored")
    saves = events(logged, "http sessions not saved")
    assert len(saves) == 2 and all(e["log_level"] == "error" and e["error"] for e in saves)  # the flush, the stop
    assert all("Errno" in e["error"] for e in saves)  # the OSError's own text
    (tmp_path / "afile").write_text("")
    with structlog.testing.capture_logs() as logged:
        m = manager(tmp_path / "afile" / "state")  # its state directory cannot be made: a coded error
        async with m.run():
            await request(m, ID_A, init())
    saves = events(logged, "http sessions not saved")
    assert saves and all("cannot create its parent" in e["error"] for e in saves)
    assert "Errno" not in saves[-1]["error"]


async def test_a_manager_without_a_state_dir_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           autojump_clock: trio.testing.MockClock) -> None:
    calls: list[str] = []
    monkeypatch.setattr(http_sessions.http_session_file, "save", lambda *a: calls.append("save"))
    monkeypatch.setattr(http_sessions.http_session_file, "load", lambda *a: calls.append("load") or [])
    m = manager(None)
    async with m.run():
        await request(m, ID_A, init())
        await trio.sleep(2)
    assert calls == []


async def test_at_the_overall_cap_another_tokens_freed_session_gives_way(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager(max_sessions_per_token=2, max_sessions=2, session_idle_s=60)
    async with m.run():
        dormant = (await request(m, ID_A, init())).sid
        await trio.sleep(61)  # freed: only its record is left
        b1 = (await request(m, ID_B, init(), name="ci")).sid
        assert b1 is not None and len(m.book) == 2
        with structlog.testing.capture_logs() as logged:
            b2 = await request(m, ID_B, init(), name="ci")
        assert b2.status == 200 and b2.sid is not None and dormant is not None
        (evicted,) = events(logged, "http session evicted")
        assert dormant.startswith(evicted["session"]) and evicted["token_id"] == ID_A[:8]
        assert (await request(m, ID_A, PING, dormant)).status == 404
        assert [(await request(m, ID_B, PING, s, name="ci")).status for s in (b1, b2.sid)] == [200, 200]


def raw_request(headers: list[tuple[bytes, bytes]], sid: str = "") -> tuple[dict[str, Any], Any]:
    if sid:
        headers = [*headers, (b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-06-18")]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "query_string": b"",
             "scheme": "http", "server": ("127.0.0.1", 8765), "client": ("127.0.0.1", 1),
             "user": AuthenticatedUser(AccessToken(token=ID_A, client_id="http:laptop", scopes=[], subject=ID_A))}
    return scope, body_once(json.dumps(PING if sid else init()).encode())


async def answer_of(m: SessionManager, headers: list[tuple[bytes, bytes]],
                    sid: str = "") -> tuple[int, dict[bytes, bytes]]:
    scope, receive = raw_request(headers, sid)
    got: dict[str, Any] = {}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"], got["headers"] = int(message["status"]), dict(message.get("headers", []))

    await m.handle_request(scope, receive, send)
    return got["status"], got["headers"]


GOOD = [(b"host", b"127.0.0.1:8765"), (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream")]


async def test_an_opening_the_transport_refuses_gets_no_id_and_keeps_its_other_headers(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager()
    async with m.run():
        for headers, status in [([GOOD[0], GOOD[1], (b"accept", b"text/html")], 406),
                                ([GOOD[0], (b"content-type", b"text/plain"), GOOD[2]], 400)]:
            got_status, got_headers = await answer_of(m, headers)
            assert got_status == status and b"mcp-session-id" not in got_headers
            assert b"content-length" in got_headers
            assert len(m.book) == 0 and not m._server_instances


async def test_the_host_check_holds_for_live_and_revived_sessions(autojump_clock: trio.testing.MockClock) -> None:
    config = HttpConfig(listen="127.0.0.1:8765", session_idle_s=60)
    m = SessionManager(Server("t", on_list_tools=list_tools), config, state_dir=None,
                       security_settings=security_settings(config))
    evil = [(b"host", b"evil.example"), *GOOD[1:]]
    async with m.run():
        status, headers = await answer_of(m, GOOD)
        sid = headers[b"mcp-session-id"].decode()
        assert status == 200 and (await answer_of(m, GOOD, sid))[0] == 200
        assert (await answer_of(m, evil, sid))[0] == 421
        await trio.sleep(61)
        assert (await answer_of(m, GOOD, sid))[0] == 200  # revived
        assert (await answer_of(m, evil, sid))[0] == 421


async def slow_tool(ctx: Any, params: Any) -> types.CallToolResult:
    await trio.sleep(100)
    return types.CallToolResult(content=[types.TextContent(type="text", text="done")])


async def test_a_session_with_a_request_in_flight_is_never_the_one_given_up(
        autojump_clock: trio.testing.MockClock) -> None:
    config = HttpConfig(listen="127.0.0.1:8765", max_sessions_per_token=1, max_sessions=4)
    m = SessionManager(Server("t", on_call_tool=slow_tool), config, state_dir=None)
    call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "slow", "arguments": {}}}
    async with m.run():
        sid = (await request(m, ID_A, init())).sid
        assert sid is not None
        record = m.book.get(sid)
        assert record is not None
        results: list[Answer] = []

        async def slow() -> None:
            results.append(await request(m, ID_A, call, sid))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(10)
            assert record.in_flight == 1 and record.last_used == trio.current_time() - 10  # counted from its start
            busy = await request(m, ID_A, init())
            assert busy.status == 503 and busy.sid is None and m.book.get(sid) is record
        assert results[0].status == 200 and "done" in results[0].body.decode()
        assert record.in_flight == 0 and record.last_used == trio.current_time()
        fresh = await request(m, ID_A, init())  # idle now: it gives way
        assert fresh.status == 200 and m.book.get(sid) is None


async def test_two_requests_at_once_revive_a_session_once(autojump_clock: trio.testing.MockClock) -> None:
    initialized: list[str] = []
    m = manager(initialized=initialized, session_idle_s=60)
    async with m.run():
        sid = (await request(m, ID_A, init("twice"))).sid
        assert sid is not None
        await trio.sleep(61)
        statuses: list[int] = []

        async def ping(request_id: int) -> None:
            statuses.append((await request(m, ID_A, {**PING, "id": request_id}, sid)).status)

        with structlog.testing.capture_logs() as logged:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ping, 11)
                nursery.start_soon(ping, 12)
        assert statuses == [200, 200] and len(events(logged, "http session revived")) == 1
        assert initialized == ["twice"] and m.book.live_count() == 1


async def test_a_revived_session_answers_as_the_manager_is_configured(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager(options={"json_response": True}, session_idle_s=60)
    async with m.run():
        opened = await request(m, ID_A, init())
        sid = opened.sid
        assert sid is not None and opened.headers[b"content-type"] == b"application/json"
        await trio.sleep(61)
        revived = await request(m, ID_A, LIST, sid)
        assert revived.status == 200 and revived.headers[b"content-type"] == b"application/json"
        assert tools_of(revived) == ["for-probe"]
