"""The protocol eras diagd speaks are pinned (daemon/server/eras.py) and are exactly what the installed MCP SDK
serves: an SDK upgrade that adds or drops a version fails here, so the decision and docs/mcp-protocol.md
are revisited rather than inherited. The stdio screening lets a 2026-era request through without a
handshake and refuses a version outside them; the error codes are the 2026-07-28 draft's: over HTTP a
`MCP-Protocol-Version` header that is not the envelope's version is HeaderMismatch (-32020), checked
first, and an unsupported version is UnsupportedProtocolVersion (-32022) listing what `server/discover`
lists."""

from __future__ import annotations

import json
from typing import Any, cast

import mcp_types
from mcp.server.context import ServerRequestContext
from mcp.shared.message import SessionMessage
from mcp_types import version as sdk

from diagd.daemon.server import eras
from diagd.daemon.server.http.wire import StrictHttp
from diagd.daemon.server.mcp import front as mcp_front
from diagd.daemon.server.mcp import wire as mcp_wire
from diagd.daemon.server.tools import ToolRegistry


def test_the_pinned_eras_are_the_sdks() -> None:
    assert eras.HANDSHAKE == sdk.HANDSHAKE_PROTOCOL_VERSIONS
    assert eras.ENVELOPE == sdk.MODERN_PROTOCOL_VERSIONS
    assert eras.ADVERTISED == sdk.MODERN_PROTOCOL_VERSIONS  # what the SDK's own refusals list, too
    assert eras.LATEST_HANDSHAKE == sdk.LATEST_HANDSHAKE_VERSION
    assert eras.ENVELOPE_KEY == mcp_types.PROTOCOL_VERSION_META_KEY


def test_the_error_codes_are_the_drafts() -> None:
    assert (eras.HEADER_MISMATCH, eras.UNSUPPORTED_PROTOCOL_VERSION) == (-32020, -32022)
    assert eras.HEADER_MISMATCH == mcp_types.HEADER_MISMATCH
    assert eras.UNSUPPORTED_PROTOCOL_VERSION == mcp_types.UNSUPPORTED_PROTOCOL_VERSION


def request(meta: dict[str, object]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": meta}}).encode()


def refusal(line: SessionMessage | bytes) -> dict[str, Any]:
    assert isinstance(line, bytes), line
    answer: dict[str, Any] = json.loads(line)
    assert answer["id"] == 3
    return dict(answer["error"])


async def discovered() -> list[str]:
    """`supportedVersions` as diagd's server answers `server/discover`."""
    server = mcp_front.build_server(ToolRegistry(), version="0")
    entry = server.get_request_handler("server/discover")
    assert entry is not None
    ctx = ServerRequestContext(session=cast(Any, None), lifespan_context=None, protocol_version="2026-07-28",
                               method="server/discover")
    result = await entry.handler(ctx, mcp_types.RequestParams())
    return list(result.supported_versions)


def test_an_enveloped_request_needs_no_handshake() -> None:
    handshake = mcp_wire.Handshake(lambda method: True)
    parsed = mcp_wire.parse(request({eras.ENVELOPE_KEY: "2026-07-28"}))
    assert isinstance(parsed, SessionMessage) and handshake.screen(parsed) is None
    legacy = mcp_wire.parse(request({"progressToken": 1}))
    assert isinstance(legacy, SessionMessage) and b"session not initialized" in (handshake.screen(legacy) or b"")


async def test_an_unsupported_version_lists_what_server_discover_lists() -> None:
    listed = await discovered()
    assert listed == list(eras.ADVERTISED) == ["2026-07-28"]
    # Unknown, and a handshake-era version named in an envelope (reached by initialize, not there).
    for version in ("2099-01-01", "2025-11-25"):
        error = refusal(mcp_wire.parse(request({eras.ENVELOPE_KEY: version})))
        assert error["code"] == eras.UNSUPPORTED_PROTOCOL_VERSION == -32022
        assert error["data"] == {"code": "PROTOCOL_ERROR", "supported": listed, "requested": version}
        assert "2025-11-25 (initialize handshake)" in error["message"]  # the message still names every era
    # An unknown MCP-Protocol-Version header (answered by http/wire.py the same way).
    assert json.loads(mcp_wire.unsupported_version("1999-01-01", 3))["error"]["data"]["supported"] == listed


def test_over_http_a_header_that_is_not_the_envelopes_version_is_a_header_mismatch_checked_first() -> None:
    for header, body in (("2025-11-25", "2026-07-28"), ("1999-01-01", "2026-07-28"), ("2026-07-28", "1999-01-01"),
                         (None, "2026-07-28"), (None, "1999-01-01")):
        error = refusal(mcp_wire.parse(request({eras.ENVELOPE_KEY: body}), http=True, version_header=header))
        assert error["code"] == eras.HEADER_MISMATCH == -32020, (header, body)
        assert error["data"] == {"code": "PROTOCOL_ERROR", "header": "MCP-Protocol-Version"}
        assert "MCP-Protocol-Version" in error["message"]
    # The same version in both: unsupported is the version's own error; served is passed on.
    same = refusal(mcp_wire.parse(request({eras.ENVELOPE_KEY: "1999-01-01"}), http=True, version_header="1999-01-01"))
    assert same["code"] == -32022 and same["data"]["requested"] == "1999-01-01"
    served = mcp_wire.parse(request({eras.ENVELOPE_KEY: "2026-07-28"}), http=True, version_header="2026-07-28")
    assert isinstance(served, SessionMessage)
    # Not HTTP (stdio, the Unix socket): no header to compare.
    assert isinstance(mcp_wire.parse(request({eras.ENVELOPE_KEY: "2026-07-28"})), SessionMessage)


async def test_strict_http_compares_the_header_with_the_envelope_before_the_sdk_sees_the_request() -> None:
    seen: list[Any] = []

    async def sdk(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope)

    strict = StrictHttp(sdk, lambda: None, max_body_bytes=1 << 16)

    async def post(body: bytes, version: str) -> tuple[int, dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await strict({"type": "http", "method": "POST", "headers": [(b"mcp-protocol-version", version.encode())]},
                     receive, send)
        return sent[0]["status"], json.loads(sent[1]["body"])

    status, answer = await post(request({eras.ENVELOPE_KEY: "2026-07-28"}), "1999-01-01")
    assert (status, answer["id"], answer["error"]["code"]) == (400, 3, -32020)
    status, answer = await post(request({eras.ENVELOPE_KEY: "1999-01-01"}), "1999-01-01")
    assert (status, answer["error"]["code"], answer["error"]["data"]["supported"]) == (400, -32022, await discovered())
    assert not seen
