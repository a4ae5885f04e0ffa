"""HTTP MCP sessions kept bounded and carried across restarts: the SDK's session manager with a book.

`SessionManager` is the SDK's `StreamableHTTPSessionManager` with four changes (rules in
session_book.py, user-facing text in docs/http.md):

- a request without `Mcp-Session-Id` opens a session only if it is a POST of `initialize`; anything
  else is refused before the SDK mints an id, and no refused request carries one back;
- the caps per token and overall, enforced when a session opens (the longest-idle record of the
  token gives way, or the request is refused with 503);
- idle sessions are freed after `session_idle_s` (the SDK's idle timeout), their records kept;
- a known but not live session id (freed when idle, or from before a daemon restart) of the token
  that opened it is revived on its request: `initialize` is replayed inside with the client's
  original params, then the request is served as if nothing happened.

"The token" is always the token's id (`scope['user'].access_token.token`, set by front.py), never
its name: a token revoked and added again under the same name is a new token, with no session.

The SDK's private hooks used (`_admit_session`, `_discard_session`, `_serve_opening_request`,
`_server_instances`, `_session_owners`) are pinned by tests/e2e/test_http_sessions.py.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, MutableMapping
from pathlib import Path
from typing import Any

import structlog
import trio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext, authorization_context
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from diagd.daemon.http_settings import HttpConfig
from diagd.daemon.server.asgi_body import read_body
from diagd.daemon.server.http import session_file as http_session_file
from diagd.daemon.server.http.session_book import SessionBook
from diagd.daemon.server.http.session_replay import (
    Receive,
    Send,
    error_answer,
    initialize_params,
    replayed,
    synthetic_post,
)
from diagd.protocol.errors import DiagdError

log = structlog.get_logger("diagd.http")

_SID = MCP_SESSION_ID_HEADER.encode()
_VERSION = MCP_PROTOCOL_VERSION_HEADER.encode()
FLUSH_INTERVAL_S = 1.0
_token: contextvars.ContextVar[str] = contextvars.ContextVar("http_token", default="")  # the token's id
_client: contextvars.ContextVar[str] = contextvars.ContextVar("http_client", default="")  # http:<token name>


class SessionManager(StreamableHTTPSessionManager):
    def __init__(self, server: Server[Any], http: HttpConfig, *, state_dir: Path | None,
                 on_freed: Callable[[], None] = lambda: None, **options: Any) -> None:
        super().__init__(server, session_idle_timeout=http.session_idle_s, max_sessions=http.max_sessions,
                         max_request_body_size=http.max_body_bytes, **options)
        self.book = SessionBook(per_token=http.max_sessions_per_token, overall=http.max_sessions,
                                keep_s=http.session_keep_s)
        self.state_dir = state_dir
        self.on_freed = on_freed
        self._closing = False
        self._reviving: dict[str, trio.Event] = {}  # sessions being revived: set once they answer

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        self._load()
        async with super().run():
            assert self._task_group is not None
            self._task_group.start_soon(self._flush_loop)
            try:
                yield
            finally:
                self._closing = True  # the SDK discards every session next: they stay revivable
        self._save()

    async def handle_request(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """One request on /mcp of token `scope['user']` (the front checked it)."""
        token = scope["user"].access_token.token
        _token.set(token)
        _client.set(scope["user"].access_token.client_id)
        headers = dict(scope["headers"])
        era = headers.get(_VERSION)
        if era is not None and era.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
            await super().handle_request(scope, receive, send)  # the sessionless protocol era: nothing to keep
            return
        sid = headers.get(_SID, b"").decode("latin-1")
        if not sid:
            await self._opening(scope, receive, send)
            return
        record = self.book.get(sid)
        if record is not None and record.token != token:
            record = None  # another token's session (a revoked one's too) is answered as unknown, by the SDK
        if record is not None and (sid not in self._server_instances or sid in self._reviving):
            await self._revive(sid, scope)
        if record is None:
            await super().handle_request(scope, receive, send)
            return
        self.book.begin(record)
        try:
            await super().handle_request(scope, receive, send)
        finally:
            self.book.end(record)

    async def _opening(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        """A request without a session id: only a POST of `initialize` opens one."""
        if scope["method"] != "POST":
            await error_answer(send, 400, "Bad Request: Mcp-Session-Id header is required")
            return
        body = await read_body(receive, self.max_request_body_size)
        if body is None:
            await error_answer(send, 413, f"Payload Too Large: over {self.max_request_body_size} bytes")
            return
        params = initialize_params(body)
        if params is None:
            await error_answer(send, 400, "Bad Request: Mcp-Session-Id header is required "
                                          "(only an initialize request opens a session)")
            return
        minted = ""

        async def watch(message: MutableMapping[str, Any]) -> None:
            nonlocal minted
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != _SID]
                if message["status"] < 400:
                    minted = dict(message.get("headers", [])).get(_SID, b"").decode("latin-1")
                else:  # refused: the id the SDK minted for it is already gone, so never shown
                    message = {**message, "headers": headers}
            await send(message)

        await super().handle_request(scope, replayed(body, receive), watch)
        if minted:
            self.book.established(minted, params)

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        """The SDK's admission, behind the book's caps (called under the SDK's creation lock)."""
        admission = self.book.admit(_token.get())
        if not admission.admitted:
            log.warning("http session refused", client=_client.get(), token_id=_token.get()[:8],
                        reason=admission.reason)
            return None  # the SDK answers 503
        for record in admission.evict:
            transport = self._server_instances.pop(record.sid, None)
            self._session_owners.pop(record.sid, None)
            if transport is not None and transport.idle_scope is not None:
                transport.idle_scope.cancel()  # its server task ends and terminates the transport
            log.info("http session evicted", token_id=record.token[:8], session=record.sid[:8])
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            self.book.add(transport.mcp_session_id, _token.get())
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        # Idle: its deadline passed (a request that raced the deadline may have terminated it already).
        expired = transport.idle_scope is not None and transport.idle_scope.cancel_called
        record = self.book.get(session_id)
        current = self._server_instances.get(session_id) is transport
        # Closing: the SDK has already cleared its table when the server tasks end, so no transport is
        # current any more; every session still in the book stays revivable.
        if record is not None and (self._closing or (expired and current)):
            self.book.went_dormant(session_id)
            if expired:
                log.info("http session freed while idle", session=session_id[:8])
        elif record is not None and record.live and self._server_instances.get(session_id) in (transport, None):
            self.book.drop(session_id)  # DELETE, a failed opening, a failure
        await super()._discard_session(session_id, transport)
        if not self._closing:
            self.on_freed()

    async def _revive(self, sid: str, scope: MutableMapping[str, Any]) -> None:
        """Bring a dormant session back; a request for it meanwhile waits until it is back (its transport
        is listed before it is connected and initialized, and answers nothing until then)."""
        pending = self._reviving.get(sid)
        if pending is not None:
            await pending.wait()
            return
        self._reviving[sid] = done = trio.Event()
        try:
            await self._bring_back(sid, scope)
        finally:
            del self._reviving[sid]
            done.set()

    async def _bring_back(self, sid: str, scope: MutableMapping[str, Any]) -> None:
        """A dormant session's transport under the old id, then `initialize` replayed."""
        async with self._session_creation_lock:
            record = self.book.get(sid)
            if sid in self._server_instances or record is None or not record.revivable:
                return
            transport = StreamableHTTPServerTransport(
                mcp_session_id=sid, is_json_response_enabled=self.json_response, event_store=self.event_store,
                security_settings=self.security_settings, retry_interval=self.retry_interval,
                idle_timeout=self.session_idle_timeout)
            self._server_instances[sid] = transport
            user = scope.get("user")
            if isinstance(user, AuthenticatedUser):
                self._session_owners[sid] = authorization_context(user)
            record.live = True
        request = {"jsonrpc": "2.0", "id": "diagd-revive", "method": "initialize", "params": record.initialize}
        await self._serve_opening_request(transport, *synthetic_post(scope, sid, request))
        if sid in self._server_instances:
            note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await transport.handle_request(*synthetic_post(scope, sid, note))
            log.info("http session revived", client=_client.get(), token_id=record.token[:8], session=sid[:8])

    def _load(self) -> None:
        if self.state_dir is None:
            return
        try:
            self.book.restore(http_session_file.load(self.state_dir))
        except DiagdError as exc:
            log.error("http sessions of the last run not restored", error=exc.message)

    def _save(self) -> None:
        if self.state_dir is None:
            return
        try:
            http_session_file.save(self.state_dir, self.book.stored())
        except DiagdError as exc:
            log.error("http sessions not saved", error=exc.message)
        except OSError as exc:
            log.error("http sessions not saved", error=str(exc))

    async def _flush_loop(self) -> None:
        """Write the file after changes, at most once per FLUSH_INTERVAL_S (and at the end of run())."""
        while True:
            await self.book.changed.wait()
            self.book.changed = trio.Event()
            self._save()
            await trio.sleep(FLUSH_INTERVAL_S)
