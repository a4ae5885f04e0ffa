"""The HTTP session manager in process, on Trio's MockClock: the SDK's own server and transports driven
by ASGI requests, no socket. A session idle for `session_idle_s` is freed (its transport gone, its
record dormant, the heap trim poked) and revived under its id by its next request; a token at its
cap loses its longest-idle session, whose transport ends."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server

from diagd.daemon.http_settings import HttpConfig
from diagd.daemon.server.http.session_replay import body_once
from diagd.daemon.server.http.sessions import SessionManager

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
PING = {"jsonrpc": "2.0", "id": 2, "method": "ping"}


async def request(manager: SessionManager, token: str, message: dict[str, Any], sid: str = "",
                  method: str = "POST") -> tuple[int, dict[bytes, bytes], bytes]:
    body = json.dumps(message).encode()
    headers = [(b"host", b"127.0.0.1:8765"), (b"content-type", b"application/json"),
               (b"accept", b"application/json, text/event-stream")]
    if sid:
        headers += [(b"mcp-session-id", sid.encode()), (b"mcp-protocol-version", b"2025-06-18")]
    scope = {"type": "http", "method": method, "path": "/mcp", "headers": headers, "query_string": b"",
             "scheme": "http", "server": ("127.0.0.1", 8765), "client": ("127.0.0.1", 1),
             "user": AuthenticatedUser(AccessToken(token=token, client_id=f"http:{token}", scopes=[]))}
    answer: dict[str, Any] = {"body": b""}
    receive = body_once(body)

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"], answer["headers"] = message["status"], dict(message.get("headers", []))
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await manager.handle_request(scope, receive, send)
    return answer["status"], answer["headers"], answer["body"]


def manager(freed: list[int], **http: Any) -> SessionManager:
    config = HttpConfig(listen="127.0.0.1:8765", **http)
    return SessionManager(Server("t"), config, state_dir=None, on_freed=lambda: freed.append(1))


async def test_an_idle_session_is_freed_then_revived_under_its_id(autojump_clock: trio.testing.MockClock) -> None:
    freed: list[int] = []
    m = manager(freed, session_idle_s=60)
    async with m.run():
        status, headers, _ = await request(m, "a", INIT)
        sid = headers[b"mcp-session-id"].decode()
        assert status == 200 and sid in m._server_instances
        await trio.sleep(59)
        assert (await request(m, "a", PING, sid))[0] == 200  # used: the countdown starts again
        await trio.sleep(59)
        assert sid in m._server_instances and not freed
        await trio.sleep(2)
        record = m.book.get(sid)
        assert sid not in m._server_instances and record is not None and not record.live and freed
        status, headers, body = await request(m, "a", PING, sid)
        assert status == 200 and b'"result"' in body and headers.get(b"mcp-session-id") == sid.encode()
        assert sid in m._server_instances and m.book.live_count() == 1
        assert (await request(m, "b", PING, sid))[0] == 404  # another token: unknown, and nothing revived


async def test_at_its_cap_a_token_loses_its_longest_idle_session(autojump_clock: trio.testing.MockClock) -> None:
    freed: list[int] = []
    m = manager(freed, max_sessions_per_token=2, max_sessions=2)
    async with m.run():
        sids = []
        for _ in range(3):
            sids.append((await request(m, "a", INIT))[1][b"mcp-session-id"].decode())
            await trio.sleep(1)
        assert sids[0] not in m._server_instances and m.book.get(sids[0]) is None
        assert freed  # its transport and server task ended
        assert [(await request(m, "a", PING, sid))[0] for sid in sids] == [404, 200, 200]
        status, headers, _ = await request(m, "b", INIT)  # overall cap, nothing dormant: refused
        assert status == 503 and b"mcp-session-id" not in headers and len(m._server_instances) == 2


async def test_no_request_without_a_session_id_but_initialize_makes_one(
        autojump_clock: trio.testing.MockClock) -> None:
    m = manager([])
    async with m.run():
        for method, message in (("GET", {}), ("DELETE", {}), ("POST", PING)):
            status, headers, body = await request(m, "a", message, method=method)
            assert status == 400 and b"mcp-session-id" not in headers, body
        assert not m._server_instances and len(m.book) == 0
