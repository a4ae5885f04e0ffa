"""HTTP requests waiting for their answer, so that a stopping daemon answers each one before it goes.

Over the Unix socket the shim answers a call in flight at a restart with a coded DAEMON_RESTARTED
error (daemon/shim/shim_session.py). An HTTP client has no shim: when the daemon's connection goes,
its request just ends, and SDK clients then wait out their own timeout (the TypeScript SDK: 60 s) or
lose the session (the Python SDK). So the daemon stops in two steps (`Daemon.request_shutdown`):
first every request in flight stops waiting for the SDK and gets the same error on its own stream,
then the listener is cancelled. The tool call itself is cancelled with the daemon, as over the socket:
"it may or may not have run".

How the answer is written depends on what the SDK had sent on that stream:
- nothing yet: a whole `200` response whose body is the JSON-RPC error (`application/json`, which
  every client accepts on a POST);
- the headers of an event stream (`text/event-stream`, the SDK's default for a request): one more
  `message` event holding the error, then the end of the stream;
- a whole answer: nothing (it was answered before the stop).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from diagd.daemon import jsonrpc

log = structlog.get_logger("diagd.http")

Send = Callable[[dict[str, Any]], Any]
Handler = Callable[[Send], Awaitable[None]]


class _Request:
    """One request's stream: what the SDK has sent on it so far."""

    def __init__(self, ident: Any, method: str, send: Send) -> None:
        self.ident, self.method, self._send = ident, method, send
        self.scope = trio.CancelScope()
        self.event_stream: bool | None = None  # None: no header sent yet
        self.finished = False
        self.reason = ""  # why the daemon stops, set when it cancels the request

    async def send(self, message: dict[str, Any]) -> None:
        if self.finished or self.reason:
            return  # the daemon answers (or answered) it: what the SDK sends as it is cancelled (the end
            # of its event stream) would close the stream before that answer
        if message["type"] == "http.response.start":
            content = dict(message.get("headers", [])).get(b"content-type", b"")
            self.event_stream = content.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.finished = True
        await self._send(message)

    async def answer_stopped(self) -> None:
        """The DAEMON_RESTARTED error on this stream, however far the SDK got, then its end."""
        line = jsonrpc.restart_error(self.ident, self.method, stopping=self.reason).rstrip(b"\n")
        self.finished = True
        if self.event_stream is None:
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(line)).encode())]})
            await self._send({"type": "http.response.body", "body": line})
        elif self.event_stream:
            await self._send({"type": "http.response.body", "body": b"event: message\r\ndata: " + line + b"\r\n\r\n",
                              "more_body": True})
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        else:  # a JSON answer cut in its body: only its end can still be sent
            await self._send({"type": "http.response.body", "body": b""})


class InFlight:
    """The requests being served; `answer_all` answers each with DAEMON_RESTARTED (the daemon stops)."""

    def __init__(self) -> None:
        self._open: set[_Request] = set()
        self._idle = trio.Event()
        self._idle.set()
        self.stopping: str | None = None  # why, once `answer_all` ran: later requests are answered at once

    @property
    def count(self) -> int:
        return len(self._open)

    async def serve(self, ident: Any, method: str, send: Send, handler: Handler) -> None:
        """Run `handler` (the SDK, writing through the `send` it is given) for the request `ident`."""
        request = _Request(ident, method, send)
        if self.stopping is not None:
            request.reason = self.stopping
            await request.answer_stopped()
            return
        self._open.add(request)
        self._idle = trio.Event() if len(self._open) == 1 else self._idle
        try:
            with request.scope:
                await handler(request.send)
            if request.scope.cancelled_caught and not request.finished:
                with trio.move_on_after(1):
                    await request.answer_stopped()
        finally:
            self._open.discard(request)
            if not self._open:
                self._idle.set()

    async def answer_all(self, reason: str, timeout_s: float = 2.0) -> int:
        """Stop waiting for the SDK on every open request and answer each; returns how many were open.
        Bounded: a client that reads nothing cannot hold the daemon's stop."""
        self.stopping = reason
        waiting = [r for r in self._open if not r.finished]
        for request in waiting:
            request.reason = reason
            request.scope.cancel()
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
        if waiting:
            log.info("answered requests in flight before stopping", requests=len(waiting), reason=reason)
        return len(waiting)
