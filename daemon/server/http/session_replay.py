"""ASGI plumbing for HTTP sessions: replay a request body (asgi_body.read_body reads it), answer a
JSON-RPC error, and make the internal requests that revive a session (its `initialize` and
`notifications/initialized`).
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import trio

Scope = dict[str, Any]
Receive = Any
Send = Any

INVALID_REQUEST = -32600
# Headers of the client's request that an internal request must not carry (it sets its own).
_OWN = {b"content-type", b"content-length", b"accept", b"mcp-session-id", b"mcp-protocol-version",
        b"last-event-id", b"transfer-encoding"}


def body_once(body: bytes) -> Receive:
    """A `receive` that gives `body` once and then never reports a disconnect: for requests diagd makes
    itself, whose response machinery stops listening when done."""
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    return receive


def replayed(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then whatever the client's connection says."""
    given = False

    async def again() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return again


def initialize_params(body: bytes) -> dict[str, Any] | None:
    """The params of `body` if it is one JSON-RPC `initialize` request, else None."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(message, dict) and message.get("method") == "initialize" and "id" in message):
        return None
    params = message.get("params")
    return params if isinstance(params, dict) else None


async def error_answer(send: Send, status: int, text: str) -> None:
    """A JSON-RPC error (no id) with HTTP `status`, and no session id."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": text}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def synthetic_post(scope: MutableMapping[str, Any], sid: str, message: dict[str, Any]) -> tuple[Scope, Receive, Send]:
    """An internal POST of `message` to session `sid`, made from the client's request `scope` (same
    Host/Origin, token and client name); its answer is dropped."""
    body = json.dumps(message).encode()
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _OWN]
    headers += [(b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
                (b"content-length", str(len(body)).encode()), (b"mcp-session-id", sid.encode())]
    inner = {**scope, "method": "POST", "headers": headers, "query_string": b""}
    receive = body_once(body)

    async def send(_message: dict[str, Any]) -> None:
        return None

    return inner, receive, send
