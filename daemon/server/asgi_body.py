"""A request body read whole within a limit, on ASGI: shared by the HTTP transport's sessions (http/) and
the web view's POST (ui/), so that the web view needs nothing of the transport it is served beside."""

from __future__ import annotations

from typing import Any

Receive = Any


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is over `limit` bytes (or the client went away)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
