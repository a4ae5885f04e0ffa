"""What an HTTP client without a valid token is told: a 401 with an RFC 9728 challenge and a JSON-RPC
error naming `diagd token add`, protected resource metadata with no authorization server, and 404 on
the OAuth authorization-server discovery paths; the real Python SDK client then fails with that
message instead of starting an OAuth flow."""

from __future__ import annotations

import re

import httpx2
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.e2e.test_http import HttpDaemon, http_daemon, mcp_over_http, post_initialize

pytestmark = pytest.mark.e2e
__all__ = ["http_daemon"]  # the fixture, shared with test_http.py


def test_a_401_points_at_protected_resource_metadata_that_names_no_authorization_server(
        http_daemon: HttpDaemon) -> None:
    for headers in ({}, {"Authorization": f"Bearer {http_daemon.token}x"}):
        answer = post_initialize(http_daemon.url, headers)
        assert answer.status_code == 401
        assert "diagd token add" in answer.json()["error"]["message"]
        found = re.search(r'resource_metadata="([^"]+)"', answer.headers["www-authenticate"])
        assert found, answer.headers["www-authenticate"]
        assert ('error="invalid_token"' in answer.headers["www-authenticate"]) == bool(headers)
        document = httpx2.get(found.group(1), timeout=30)  # no token needed
        assert document.status_code == 200
        assert document.json() == {"resource": http_daemon.url, "bearer_methods_supported": ["header"],
                                   "resource_name": "diagd"}


def test_the_authorization_server_discovery_paths_answer_404(http_daemon: HttpDaemon) -> None:
    base = http_daemon.url.removesuffix("/mcp")
    for path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration",
                 "/.well-known/oauth-authorization-server/mcp", "/.well-known/openid-configuration/mcp",
                 "/mcp/.well-known/openid-configuration", "/register", "/authorize", "/token"):
        for headers in ({}, {"Authorization": f"Bearer {http_daemon.token}"}):
            assert httpx2.get(base + path, headers=headers, timeout=30).status_code == 404, (path, headers)
    assert httpx2.post(base + "/register", json={}, timeout=30).status_code == 404


async def test_the_python_sdk_without_a_token_fails_with_the_reason_and_with_one_works(http_daemon: HttpDaemon) -> None:
    with trio.fail_after(60):
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            with pytest.raises(BaseExceptionGroup) as refused:  # the SDK raises from its task group
                async with (create_mcp_http_client(headers=headers) as http,
                            Client(streamable_http_client(http_daemon.url, http_client=http), mode="legacy")):
                    pass
            errors = [e for e in _leaves(refused.value) if isinstance(e, MCPError)]
            assert [e.error.code for e in errors] == [-32001], repr(refused.value)
            assert "diagd token add" in errors[0].error.message
        async with mcp_over_http(http_daemon.url, http_daemon.token) as client:
            assert not (await client.call_tool("echo", {"message": "with a token"})).is_error


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
