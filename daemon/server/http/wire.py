"""MCP over HTTP held to the same request checks and answers as the Unix socket, in front of the SDK.

The SDK's Streamable HTTP transport dropped a request whose id is null, 1.5 or {} (HTTP 202: it
validates as a notification), answered a wrong `jsonrpc` or a batch with a 1.3 KB validation dump,
an unknown `MCP-Protocol-Version` with a message about envelope keys, `GET` with `Last-Event-ID`
with an empty 500, and Host/Origin refusals in plain text. `StrictHttp` wraps the session manager:
- a POST body goes through `mcp_wire.parse` (mcp/wire.py), the stdio screening, and gets its error the same
  (HTTP 400 with the JSON-RPC error as body), or is replayed to the SDK unchanged; a 2026-era
  request whose `MCP-Protocol-Version` is not its envelope's version gets HeaderMismatch (-32020);
- an `MCP-Protocol-Version` outside `eras.SUPPORTED` gets 400 and UnsupportedProtocolVersion (-32022);
- `Last-Event-ID` gets 400: diagd keeps no event store, streams are not resumable;
- every other error status the SDK answers without a JSON body gets a JSON-RPC-shaped one, and an
  error answering a request without a session never carries a fresh `Mcp-Session-Id`;
- a request is answered even when the daemon stops before the SDK answers it: the same
  DAEMON_RESTARTED error the shim gives over the socket (inflight.py);
- each session keeps the tool groups of `[mcp] tools` as they were when it opened (a reload
  applies to sessions opened after it), passed to the handlers on the request's scope.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import structlog

from diagd.daemon import jsonrpc
from diagd.daemon.server import eras
from diagd.daemon.server.http.inflight import InFlight
from diagd.daemon.server.mcp import wire as mcp_wire
from diagd.daemon.server.mcp.requests import SESSION_TOOLS_KEY
from diagd.daemon.tool_groups import Selection
from diagd.protocol.errors import ErrorCode

log = structlog.get_logger("diagd.http")

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
App = Callable[..., Awaitable[None]]  # an ASGI app (starlette's and hypercorn's typings differ)

SESSION_HEADER = b"mcp-session-id"
PROTOCOL = {"code": str(ErrorCode.PROTOCOL_ERROR)}
NOT_RESUMABLE = ("streams are not resumable: diagd keeps no event store, so Last-Event-ID cannot be honoured; "
                 "open a new stream without it and resend any request whose answer was lost")


def header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


class StrictHttp:
    """The ASGI app in front of the SDK's session manager (`sdk`: its `handle_request`)."""

    def __init__(self, sdk: App, default_tools: Callable[[], Selection], *, max_body_bytes: int,
                 live_sessions: Callable[[], Any] = lambda: None, in_flight: InFlight | None = None) -> None:
        self.sdk, self.default_tools, self.max_body_bytes = sdk, default_tools, max_body_bytes
        self.live_sessions = live_sessions  # the session ids the SDK still serves (None: unknown)
        self.session_tools: dict[str, Selection] = {}
        # The requests the daemon answers itself if it stops first (inflight.py).
        self.in_flight = InFlight() if in_flight is None else in_flight

    def __repr__(self) -> str:
        return f"<StrictHttp [{len(self.session_tools)} sessions]>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] == "GET" and header(scope, b"last-event-id") is not None:
            await respond(send, 400, jsonrpc.error_line(mcp_wire.INVALID_REQUEST, NOT_RESUMABLE, data=PROTOCOL))
            return
        ident, method = None, None
        if scope["method"] == "POST":
            body = await read_body(receive, self.max_body_bytes)
            if body is None:
                too_big = f"request body exceeds {self.max_body_bytes} bytes ([http] max_body_bytes)"
                await respond(send, 413, jsonrpc.error_line(mcp_wire.INVALID_REQUEST, too_big,
                                                             data={**PROTOCOL, "limit": self.max_body_bytes}))
                return
            # A 2026-era request whose header is not its envelope's version: HeaderMismatch (mcp/wire.py).
            parsed = mcp_wire.parse(body, http=True, version_header=header(scope, eras.HEADER.encode()))
            if isinstance(parsed, bytes):
                await respond(send, 400, parsed)
                return
            ident = getattr(parsed.message, "id", None)
            method = getattr(parsed.message, "method", None)
            receive = replay(body, receive)
        version = header(scope, eras.HEADER.encode())
        if version is not None and version not in eras.SUPPORTED:  # answered as stdio answers it in an envelope
            await respond(send, 400, mcp_wire.unsupported_version(version, ident))
            return
        session = header(scope, SESSION_HEADER)
        opening = session is None and version not in eras.ENVELOPE
        if session is not None:
            if session not in self.session_tools:  # opened before this daemon knew it (e.g. restored)
                self.session_tools[session] = self.default_tools()
            scope[SESSION_TOOLS_KEY] = self.session_tools[session]
        replies = self._replies(send, session, self.default_tools() if opening else None)
        if ident is not None and method is not None:  # a request: answered even if the daemon stops first
            await self.in_flight.serve(ident, method, replies, lambda sent: self.sdk(scope, receive, sent))
        else:
            await self.sdk(scope, receive, replies)
        if session is not None and scope["method"] == "DELETE":
            self.session_tools.pop(session, None)

    def _replies(self, send: Send, session: str | None, tools: Selection) -> Send:
        """`send`, seeing the answer: a new session's id is noted with its tools; an error answer
        loses a session id it should not carry and gets a JSON body when it has none."""
        held: dict[str, Any] = {}
        text = bytearray()

        async def replies(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status, headers = message["status"], list(message.get("headers", []))
                opened = next((v.decode("latin-1") for k, v in headers if k == SESSION_HEADER), None)
                if status >= 400 and session is None:
                    headers = [(k, v) for k, v in headers if k != SESSION_HEADER]
                elif opened is not None and session is None:
                    self._opened(opened, tools)
                message = {**message, "headers": headers}
                if status >= 400 and not _is_json(headers):
                    held.update(message)  # the body follows: replaced by a JSON-RPC error
                    return
            elif message["type"] == "http.response.body" and held:
                text.extend(message.get("body", b""))
                if message.get("more_body"):
                    return
                await respond(send, held["status"], _as_error(held["status"], bytes(text)), base=held["headers"])
                return
            await send(message)

        return replies

    def _opened(self, session: str, tools: Selection) -> None:
        live = self.live_sessions()
        if live is not None:  # forget the sessions the SDK ended (idle timeout, DELETE, a failure)
            for gone in [s for s in self.session_tools if s not in live]:
                del self.session_tools[gone]
        self.session_tools[session] = tools


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(k == b"content-type" and v.startswith(b"application/json") for k, v in headers)


def _as_error(status: int, body: bytes) -> bytes:
    text = body.decode("utf-8", "replace").strip() or HTTPStatus(status).phrase
    return jsonrpc.error_line(mcp_wire.INVALID_REQUEST, text[:300], data={**PROTOCOL, "http_status": status})


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None past `limit` bytes."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return bytes(body)  # disconnected: the SDK sees an empty body and answers it
        body.extend(message.get("body", b""))
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return bytes(body)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the SDK the body already read, then what the client sends next (its
    disconnect)."""
    given = False

    async def receive_again() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


async def respond(send: Send, status: int, line: bytes, *, base: list[tuple[bytes, bytes]] | None = None) -> None:
    """An answer whose body is one JSON-RPC error (`line`, as mcp/wire.py writes it)."""
    body = line.rstrip(b"\n")
    headers = [(k, v) for k, v in (base or []) if k not in (b"content-type", b"content-length")]
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
