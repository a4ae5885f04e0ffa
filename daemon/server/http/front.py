"""MCP over Streamable HTTP: the SDK's session manager around the same low-level `Server` the Unix
socket serves, on hypercorn's Trio worker, behind a bearer-token check.

Imported only when `[http] listen` is set: starlette, hypercorn and h11/h2 stay out of a daemon
that does not serve HTTP (issue 12's idle RSS). Every request to /mcp must carry
`Authorization: Bearer <token>` naming a token of `diagd token add`; anything else gets 401 before
the SDK sees it (with what clients need to skip OAuth: auth.py), and sessions are bounded and
survive restarts (sessions.py). The SDK then checks Host/Origin (DNS rebinding: a web page that makes a browser
talk to 127.0.0.1 under its own host name is refused) and binds each MCP session to the token that
opened it: to its id, not its name, so after `diagd token revoke X` and `diagd token add X` the old
sessions answer only as unknown. Calls are identified as `http:<token name>` in the audit log and
statistics. The web view at /ui (ui/web.py) is routed before all that: its own login, the same tokens.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import structlog
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from hypercorn.typing import ASGIFramework  # its TypedDict scopes; App reads plain dicts
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from diagd.daemon.http_settings import HttpConfig, is_loopback, is_wildcard
from diagd.daemon.server.http import auth as http_auth
from diagd.daemon.server.http.inflight import InFlight
from diagd.daemon.server.http.sessions import SessionManager
from diagd.daemon.server.http.wire import StrictHttp
from diagd.daemon.server.mcp.front import HTTP_CLIENT_KEY
from diagd.daemon.server.ui.web import Shown, WebUi, is_ui
from diagd.daemon.tokens import Verifier
from diagd.daemon.tool_groups import Selection
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.http")

ENDPOINT = "/mcp"
NO_AUTH_CLIENT = "test-no-auth"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")

Scope = dict[str, Any]
Receive = Any
Send = Any


def security_settings(http: HttpConfig) -> TransportSecuritySettings:
    """Which Host and Origin headers a request may carry. Any port: a rebinding attack changes the
    name, not the port, and a port-0 bind learns its port only when bound."""
    host = http.host
    if is_wildcard(host) and not http.allowed_hosts:
        # Reachable under every name the machine has: the token is the only guard (logged at start).
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = list(LOOPBACK_HOSTS) if is_loopback(host) else [f"[{host}]" if ":" in host else host]
    hosts = [h for name in names for h in (name, f"{name}:*")] + list(http.allowed_hosts)
    origins = [f"{scheme}://{h}" for scheme in ("http", "https") for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


class App:
    """The ASGI application: the token check, then the SDK's session manager on /mcp (behind
    `wire.py`'s request checks)."""

    def __init__(self, manager: StreamableHTTPSessionManager, verifier: Verifier, *,
                 default_tools: Callable[[], Selection] = lambda: None, no_auth: bool = False,
                 in_flight: InFlight | None = None, ui: WebUi | None = None) -> None:
        self.manager = manager
        self.ui = ui  # the web view at /ui (ui/web.py): its own login, same tokens
        self.verifier = verifier
        self.no_auth = no_auth  # [http] test_no_auth: every request is the "test-no-auth" client
        self.strict = StrictHttp(manager.handle_request, default_tools, max_body_bytes=manager.max_request_body_size,
                                 live_sessions=lambda: getattr(manager, "_server_instances", None),
                                 in_flight=in_flight)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.ui is not None and is_ui(scope["path"]):
            await self.ui(scope, receive, send)
            return
        if await http_auth.public(scope, send, ENDPOINT):  # discovery documents, 404 off the endpoint
            return
        token = self._token(scope)
        if token is None:
            await http_auth.unauthorized(scope, send, ENDPOINT, presented=b"authorization" in dict(scope["headers"]))
            return
        name, token_id = token
        # Sessions belong to the token's id (sessions.py's book, and the SDK's owner check, which
        # compares client_id and subject): a name given to a new token does not inherit them.
        scope["user"] = AuthenticatedUser(AccessToken(token=token_id, client_id=f"http:{name}", scopes=[],
                                                      subject=token_id))
        scope[HTTP_CLIENT_KEY] = f"http:{name}"
        await self.strict(scope, receive, send)

    def _token(self, scope: Scope) -> tuple[str, str] | None:
        """(name, id) of the request's token, or None."""
        if self.no_auth:
            return NO_AUTH_CLIENT, NO_AUTH_CLIENT
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        kind, _, secret = header.partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            return None
        try:
            token = self.verifier.find(secret.strip())
        except DiagdError as exc:  # an unsafe or damaged token file accepts no one
            log.error("token file refused", error=exc.message)
            return None
        return None if token is None else (token.name, token.id)


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop per server: the daemon owns the session manager's lifetime."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def hypercorn_config(http: HttpConfig) -> HypercornConfig:
    cfg = HypercornConfig()
    cfg.bind = [http.listen]
    if http.tls:
        cfg.certfile, cfg.keyfile = http.tls_cert, http.tls_key
    cfg.accesslog = None  # every tool call is audited; the HTTP requests around it are noise
    cfg.errorlog = logging.getLogger("hypercorn.error")  # stdlib logging, as the SDK's: JSON lines on stderr
    cfg.include_server_header = False
    cfg.graceful_timeout = 1.0
    return cfg


async def serve(http: HttpConfig, server: Server[Any], verifier: Verifier, *, state_dir: Path | None = None,
                on_freed: Callable[[], None] = lambda: None,
                default_tools: Callable[[], Selection] = lambda: None, in_flight: InFlight | None = None,
                shown: Shown | None = None, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled; `started` with the endpoint's URL once the port is bound.

    A port or TLS file that cannot be used fails the start with a coded error naming it.
    """
    manager = SessionManager(server, http, state_dir=state_dir, on_freed=on_freed,
                             security_settings=security_settings(http))
    if http.test_no_auth:
        log.warning("TEST LISTENER: MCP over HTTP WITHOUT A TOKEN ([http] test_no_auth = true); for test suites "
                    "only, never for real use", listen=http.listen)
    if is_wildcard(http.host) and not http.allowed_hosts:
        log.warning("http listener accepts any Host header (wildcard bind without [http] allowed_hosts)",
                    listen=http.listen)
    cfg = hypercorn_config(http)
    try:
        cfg.create_ssl_context()  # fails here, with the file named, rather than inside hypercorn
    except (OSError, ssl.SSLError) as exc:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[http] tls_cert/tls_key cannot be used: {exc}",
                         tls_cert=http.tls_cert, tls_key=http.tls_key) from None
    failure: DiagdError | None = None
    ui = None if shown is None else WebUi(shown, verifier=verifier, security=security_settings(http), tls=http.tls)
    app = cast(ASGIFramework, App(manager, verifier, default_tools=default_tools, no_auth=http.test_no_auth,
                                  in_flight=in_flight, ui=ui))
    async with manager.run(), trio.open_nursery() as nursery:
        try:
            binds: list[str] = await nursery.start(partial(hypercorn_serve, app, cfg))
        except (OSError, BaseExceptionGroup) as exc:
            error = _find(exc, OSError)
            if error is None:
                raise
            # Raised below, outside the nurseries, so the caller gets the coded error itself, not a group.
            failure = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot listen on {http.listen}: "
                                 f"{error.strerror or error}", listen=http.listen)
        else:
            task_status.started(binds[0] + ENDPOINT)
    if failure is not None:
        raise failure


def _find(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first `kind` in `exc` or in the exception groups it nests (hypercorn's nurseries wrap)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _find(inner, kind)) is not None:
                return found
    return None
