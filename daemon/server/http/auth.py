"""What the HTTP listener says to a client without a valid token, so MCP clients use a configured
header token instead of starting an OAuth flow diagd does not offer.

diagd is an OAuth 2.0 protected resource with no authorization server: tokens come from
`diagd token add`. Per RFC 9728 (which the MCP authorization spec builds on):

- a 401 carries `WWW-Authenticate: Bearer realm="diagd", resource_metadata="<base>/.well-known/
  oauth-protected-resource/mcp"` and a JSON-RPC error body saying how to get a token (the Python
  SDK shows that message; clients read the challenge);
- the protected resource metadata, served without a token, names the resource and the header
  bearer method and lists no `authorization_servers` (the member is optional in RFC 9728): a client
  finds no server to run an OAuth flow against;
- the authorization-server discovery paths (`/.well-known/oauth-authorization-server`,
  `/.well-known/openid-configuration`, with or without a path suffix) and every other path but the
  MCP endpoint answer 404 with or without a token, so a client's discovery ends at "none"; the 404's
  body says how to send a token (MCP Inspector 2.12, which registers a client at `/register` anyway,
  ends its attempt quoting it).
"""

from __future__ import annotations

import json
from typing import Any

Scope = dict[str, Any]
Send = Any

METADATA_PATH = "/.well-known/oauth-protected-resource"
UNAUTHORIZED = -32001  # a server-defined JSON-RPC error code: the request was not authorized
HOW = "diagd needs a bearer token: send `Authorization: Bearer <token>` with a token of `diagd token add NAME` " \
      "(diagd has no OAuth authorization server)"


def base_url(scope: Scope) -> str:
    """The origin the client used (its Host header), else the address the listener is bound to."""
    scheme = scope.get("scheme", "http")
    host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
    if not host and scope.get("server"):
        name, port = scope["server"]
        host = f"[{name}]:{port}" if ":" in str(name) else f"{name}:{port}"
    return f"{scheme}://{host}"


async def public(scope: Scope, send: Send, endpoint: str) -> bool:
    """Answer a request that needs no token (discovery, paths diagd does not serve); False for `endpoint`."""
    path = scope["path"].rstrip("/") or "/"
    if path == endpoint:
        return False
    if path in (METADATA_PATH, METADATA_PATH + endpoint) and scope["method"] == "GET":
        document = {"resource": base_url(scope) + endpoint, "bearer_methods_supported": ["header"],
                    "resource_name": "diagd"}
        await _respond(send, 200, json.dumps(document).encode(), b"application/json")
        return True
    # Clients that try OAuth anyway (MCP Inspector registering a client at /register) quote this body.
    await _respond(send, 404, f"diagd serves MCP at {endpoint} and has no OAuth authorization server: send "
                              "`Authorization: Bearer <token>` with a token of `diagd token add NAME`".encode())
    return True


async def unauthorized(scope: Scope, send: Send, endpoint: str, *, presented: bool) -> None:
    """401 for a missing (`presented` False) or unknown token, with the challenge and how to get one."""
    challenge = f'Bearer realm="diagd", resource_metadata="{base_url(scope)}{METADATA_PATH}{endpoint}"'
    if presented:
        challenge += ', error="invalid_token", error_description="unknown or revoked token"'
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": UNAUTHORIZED, "message": HOW}}).encode()
    await _respond(send, 401, body, b"application/json", ((b"www-authenticate", challenge.encode()),))


async def _respond(send: Send, status: int, body: bytes, kind: bytes = b"text/plain; charset=utf-8",
                   headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body += b"\n"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
