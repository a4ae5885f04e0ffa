"""The web view at /ui on the HTTP listener: what the agent does, live, for the engineer beside it.

Routes (GET, and one POST):

- `/ui/login?once=<secret>`: a login link of `diagd ui` (auth.py): used up, it sets the session
  cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure under TLS) and answers a page that refreshes to
  /ui (not a 303: see `_login`); a wrong, used or expired one is 401.
- `/ui` (the page), `/ui/app.js`, `/ui/app.css`, `/ui/icon.svg`: the page's files (daemon/views/src/web/), no inline
  script or style, so the CSP allows scripts and styles from 'self' only;
- `/ui/api/status`: what `diagd status --json` shows (the daemon's status model), as JSON;
- `/ui/api/events`: the calls as Server-Sent Events, one record per event (feed.py), resumed
  after a reconnect from its Last-Event-ID;
- `/ui/host.js`: the MCP Apps host that shows a tool's view for a listed call (daemon/views/src/web-host);
  `/ui/api/view/<name>`: that view's document, under a CSP of its own (inline script and style, no
  network, framed by this origin only); the page frames it sandboxed without allow-same-origin;
- `POST /ui/api/call`: a tool call for the page, `{"call_id"}` (a listed call of a tool with a view, run
  again as it was made: its arguments and directory) or `{"tool", "arguments"}` (what a view asks: a
  frame's tree); read-only tools only, as client "web-ui", listed with the other calls. A POST must name
  its origin (this one), send JSON and stay under MAX_CALL_BYTES.

Every request but the login needs the session cookie or `Authorization: Bearer <token>` (a token of
`diagd token add`); without, 401 with a body that says how to log in and nothing else. Before that,
`Host` must name the listener (the DNS rebinding rule of /mcp: loopback names or `allowed_hosts`, 421
otherwise) and an `Origin`, when sent, must be this very origin (403), as must any request a browser
marks `Sec-Fetch-Site: cross-site` (but the login link, opened from anywhere). Every answer carries
the headers of `SECURITY_HEADERS`; none is cached, and nothing here logs a secret or a URL's query.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import structlog
import trio
from mcp.server.transport_security import TransportSecuritySettings

from diagd.daemon import app_views
from diagd.daemon.server.asgi_body import read_body
from diagd.daemon.server.ui.auth import COOKIE, SESSION_TTL_S, UiAuth
from diagd.daemon.server.ui.feed import CallFeed
from diagd.daemon.tokens import Verifier
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.ui")

PREFIX = "/ui"
PAGES = Path(__file__).resolve().parents[2] / "views" / "src" / "web"
FILES = {"/ui": ("index.html", b"text/html; charset=utf-8"),
         "/ui/app.js": ("app.js", b"text/javascript; charset=utf-8"),
         "/ui/app.css": ("app.css", b"text/css; charset=utf-8"),
         "/ui/icon.svg": ("icon.svg", b"image/svg+xml")}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
# A view's document: its own script and style inline, nothing fetched, framed only by this origin's page.
VIEW_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
            "font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'")
_FRAMED = {b"content-security-policy": VIEW_CSP.encode(), b"x-frame-options": b"SAMEORIGIN"}
VIEW_HEADERS: tuple[tuple[bytes, bytes], ...] = tuple(  # the page's, but its own CSP and framed by this origin
    (name, _FRAMED.get(name, value)) for name, value in SECURITY_HEADERS if name != b"cross-origin-opener-policy")
HOST_SCRIPT = "web-host.js"  # built beside the views (scripts/build-views.sh)
MAX_CALL_BYTES = 64 * 1024  # a POST /ui/api/call body: a tool name and its arguments
UNAUTHORIZED = b"401 Unauthorized: open the login link of `diagd ui` (or `diagd ui --print`)\n"
LANDING = (b'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=/ui">'
           b'<title>diagd</title><a href="/ui">diagd web view</a>\n')  # no script: the CSP allows none inline
MAX_STREAMS = 8  # event streams open at once (browser tabs); more get 503
KEEPALIVE_S = 15.0  # a comment on an idle stream, so a gone browser is noticed

Scope = dict[str, Any]
Receive = Any
Send = Any


@dataclass(frozen=True)
class Shown:
    """What the daemon gives the view: who is logged in, the calls, and its status (`diagd status`'s model)."""

    auth: UiAuth
    feed: CallFeed
    status: Callable[[], Any]
    # Runs a read-only tool for the page (tool, arguments, the directory relative paths are read from): a
    # CallToolResult as JSON; DiagdError for a tool it may not run. None: no calls from the page.
    call: Callable[[str, Any, str | None], Awaitable[dict[str, Any]]] | None = None


def is_ui(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class WebUi:
    """The /ui routes, given what the daemon shows and who may see it."""

    def __init__(self, shown: Shown, *, verifier: Verifier, security: TransportSecuritySettings, tls: bool = False,
                 pages: Path = PAGES) -> None:
        self.auth, self.feed, self.status, self.verifier = shown.auth, shown.feed, shown.status, verifier
        self.call = shown.call
        self.security = security
        self.tls = tls
        self.files: dict[str, tuple[bytes, bytes]] = {}
        for route, (name, kind) in FILES.items():
            try:
                self.files[route] = ((pages / name).read_bytes(), kind)
            except OSError as exc:  # an install without the page: the API still answers, the page is 404
                log.error("web view page file missing", file=str(pages / name), error=exc.strerror)
        try:  # without it (views not built) the page lists calls without their views
            self.files[PREFIX + "/host.js"] = ((app_views.place().directory / HOST_SCRIPT).read_bytes(),
                                               b"text/javascript; charset=utf-8")
        except OSError:
            pass
        self.streams = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"].rstrip("/") or "/"
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, path, headers)
        if refusal is not None:
            await respond(send, *refusal)
            return
        if scope["method"] == "POST" and path == PREFIX + "/api/call":
            if "origin" not in headers:  # a browser names it on every POST; a form or a page elsewhere is refused
                await respond(send, 403, b"403 Forbidden: a POST must name its origin\n")
            elif not self._authorized(headers):
                await respond(send, 401, UNAUTHORIZED)
            else:
                await self._call(receive, send, headers)
            return
        if scope["method"] != "GET":
            allow = b"GET, POST" if path == PREFIX + "/api/call" else b"GET"
            await respond(send, 405, b"405 Method Not Allowed\n", extra=((b"allow", allow),))
            return
        if path == PREFIX + "/login":
            await self._login(scope, send)
            return
        if not self._authorized(headers):
            await respond(send, 401, UNAUTHORIZED)
            return
        if path in self.files:
            body, kind = self.files[path]
            await respond(send, 200, body, kind)
        elif path == PREFIX + "/api/status":
            await respond(send, 200, json.dumps(self.status(), default=str).encode(), b"application/json")
        elif path == PREFIX + "/api/events":
            await self._events(receive, send, headers.get("last-event-id", ""))
        elif path.startswith(PREFIX + "/api/view/"):
            await self._view(send, path.removeprefix(PREFIX + "/api/view/"))
        else:
            await respond(send, 404, b"404 Not Found\n")

    def _refusal(self, scope: Scope, path: str, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """421 for a Host that does not name the listener, 403 for a request from another origin."""
        host = headers.get("host", "")
        settings = self.security
        if settings.enable_dns_rebinding_protection and not _matches(host, settings.allowed_hosts):
            return 421, b"421 Misdirected Request: Host does not name this listener\n"
        origin = headers.get("origin")
        if origin is not None:
            own = f"{scope.get('scheme', 'http')}://{host}"
            if origin != own or (settings.enable_dns_rebinding_protection
                                 and not _matches(origin, settings.allowed_origins)):
                return 403, b"403 Forbidden: another origin\n"
        if headers.get("sec-fetch-site") == "cross-site" and path != PREFIX + "/login":
            return 403, b"403 Forbidden: another origin\n"
        return None

    def _authorized(self, headers: dict[str, str]) -> bool:
        session = _cookie(headers.get("cookie", ""), COOKIE)
        if session and self.auth.session_ok(session):
            return True
        kind, _, secret = headers.get("authorization", "").partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            return False
        try:
            return self.verifier.find(secret.strip()) is not None
        except DiagdError as exc:  # an unsafe or damaged token file accepts no one
            log.error("token file refused", error=exc.message)
            return False

    async def _login(self, scope: Scope, send: Send) -> None:
        once = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("once", [""])[0]
        session = self.auth.redeem(once) if once else None
        if session is None:
            log.warning("web view login refused (a used, expired or wrong link)")
            await respond(send, 401, b"401 Unauthorized: this login link is used, expired or wrong; "
                                     b"run `diagd ui` for a new one\n")
            return
        cookie = f"{COOKIE}={session}; Path={PREFIX}; Max-Age={int(SESSION_TTL_S)}; HttpOnly; SameSite=Strict"
        if self.tls:
            cookie += "; Secure"
        log.info("web view login", sessions=self.auth.sessions())
        # Not a 303: a SameSite=Strict cookie is not sent along a redirect chain that began on another
        # site (`diagd ui`'s redirect file is one), but is on a navigation this page of ours starts.
        await respond(send, 200, LANDING, b"text/html; charset=utf-8", extra=((b"set-cookie", cookie.encode()),))

    async def _view(self, send: Send, name: str) -> None:
        found = app_views.path_of(app_views.uri_of(name))
        try:
            body = await trio.to_thread.run_sync(found.read_bytes) if found is not None else None
        except OSError:
            body = None
        if body is None:
            await respond(send, 404, b"404 Not Found: no such view (or not built: scripts/build-views.sh)\n")
            return
        await respond(send, 200, body, b"text/html; charset=utf-8", security=VIEW_HEADERS)

    async def _call(self, receive: Receive, send: Send, headers: dict[str, str]) -> None:
        if self.call is None:
            await respond(send, 404, b"404 Not Found: this daemon runs no calls for the page\n")
            return
        if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            await respond(send, 415, b"415 Unsupported Media Type: send application/json\n")
            return
        body = await read_body(receive, MAX_CALL_BYTES)
        if body is None:
            await respond(send, 413, b"413 Content Too Large: a call is a tool name and its arguments\n")
            return
        try:
            asked = json.loads(body)
        except ValueError:
            asked = None
        if not isinstance(asked, dict):
            await _error(send, 400, DiagdError(ErrorCode.INVALID_ARGUMENT,
                                               'send {"call_id": ...} or {"tool": ..., "arguments": {...}}'))
            return
        cwd: str | None = None
        tool: Any
        if "call_id" in asked:
            replay = self.feed.replay(str(asked["call_id"]))
            if replay is None:
                await _error(send, 404, DiagdError(ErrorCode.NOT_FOUND, "no such call of a tool with a view is kept "
                                                   "(the page keeps the latest 200)", call_id=str(asked["call_id"])))
                return
            tool, arguments, cwd = replay.tool, replay.arguments, replay.cwd
        else:
            tool, arguments = asked.get("tool"), asked.get("arguments", {})
            if not isinstance(tool, str) or not isinstance(arguments, dict):
                await _error(send, 400, DiagdError(ErrorCode.INVALID_ARGUMENT,
                                                   "tool must be a name and arguments an object"))
                return
        try:
            result = await self.call(tool, arguments, cwd)
        except DiagdError as exc:
            await _error(send, 403 if exc.code is ErrorCode.PERMISSION_DENIED else 404, exc)
            return
        await respond(send, 200, json.dumps({"tool": tool, "arguments": arguments, "result": result},
                                            default=str).encode(), b"application/json")

    async def _events(self, receive: Receive, send: Send, last_event_id: str) -> None:
        if self.streams >= MAX_STREAMS:
            await respond(send, 503, b"503 Service Unavailable: too many open views\n")
            return
        boot, _, number = last_event_id.partition(":")
        seq = int(number) if boot == self.feed.boot and number.isdigit() else 0
        self.streams += 1
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), *SECURITY_HEADERS]})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_gone, receive, nursery.cancel_scope)
                first = f"event: hello\ndata: {json.dumps({'boot': self.feed.boot, 'resumed': seq > 0})}\n\n"
                await send({"type": "http.response.body", "body": first.encode(), "more_body": True})
                while not self.feed.closed:
                    events = self.feed.since(seq)
                    if events:
                        seq = events[-1][0]
                        body = "".join(f"id: {self.feed.boot}:{n}\ndata: {text}\n\n" for n, text in events)
                    else:
                        body = ": idle\n\n"
                    await send({"type": "http.response.body", "body": body.encode(), "more_body": True})
                    with trio.move_on_after(KEEPALIVE_S):
                        await self.feed.wait(seq)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                nursery.cancel_scope.cancel()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the browser went away (the nursery groups what its body raised)
        finally:
            self.streams -= 1


async def _error(send: Send, status: int, error: DiagdError) -> None:
    await respond(send, status, json.dumps(error.to_wire(), default=str).encode(), b"application/json")


async def _until_gone(receive: Receive, scope: trio.CancelScope) -> None:
    """Cancel the stream once the client disconnects."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _matches(value: str, allowed: list[str] | None) -> bool:
    """Whether `value` is one of `allowed` (a "name:*" entry: that name with any port), as the SDK's check."""
    for entry in allowed or ():
        if value == entry or (entry.endswith(":*") and value.startswith(entry[:-1])
                              and value[len(entry) - 1:].isdigit()):
            return True
    return False


def _cookie(header: str, name: str) -> str:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


async def respond(send: Send, status: int, body: bytes, kind: bytes = b"text/plain; charset=utf-8", *,
                  extra: tuple[tuple[bytes, bytes], ...] = (),
                  security: tuple[tuple[bytes, bytes], ...] = SECURITY_HEADERS) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                            *security, *extra]})
    await send({"type": "http.response.body", "body": body})
