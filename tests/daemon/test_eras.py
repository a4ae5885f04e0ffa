"""The protocol eras diagd speaks are pinned (daemon/server/eras.py) and are exactly what the installed MCP SDK
serves: an SDK upgrade that adds or drops a version fails here, so the decision and docs/mcp-protocol.md
are revisited rather than inherited. The stdio screening lets a 2026-era request through without a
handshake and refuses a version outside them, with the versions listed."""

from __future__ import annotations

import json

import mcp_types
from mcp.shared.message import SessionMessage
from mcp_types import version as sdk

from diagd.daemon.server import eras, mcp_wire


def test_the_pinned_eras_are_the_sdks() -> None:
    assert eras.HANDSHAKE == sdk.HANDSHAKE_PROTOCOL_VERSIONS
    assert eras.ENVELOPE == sdk.MODERN_PROTOCOL_VERSIONS
    assert eras.LATEST_HANDSHAKE == sdk.LATEST_HANDSHAKE_VERSION
    assert eras.ENVELOPE_KEY == mcp_types.PROTOCOL_VERSION_META_KEY
    assert eras.UNSUPPORTED_PROTOCOL_VERSION == mcp_types.UNSUPPORTED_PROTOCOL_VERSION


def request(meta: dict[str, object]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": meta}}).encode()


def test_an_enveloped_request_needs_no_handshake_and_an_unknown_version_is_refused_listing_the_eras() -> None:
    handshake = mcp_wire.Handshake(lambda method: True)
    parsed = mcp_wire.parse(request({eras.ENVELOPE_KEY: "2026-07-28"}))
    assert isinstance(parsed, SessionMessage) and handshake.screen(parsed) is None
    legacy = mcp_wire.parse(request({"progressToken": 1}))
    assert isinstance(legacy, SessionMessage) and b"session not initialized" in (handshake.screen(legacy) or b"")
    refused = json.loads(mcp_wire.parse(request({eras.ENVELOPE_KEY: "2099-01-01"})))  # type: ignore[arg-type]
    assert refused["id"] == 3 and refused["error"]["code"] == -32022
    assert refused["error"]["data"]["supported"] == list(eras.SUPPORTED)
    assert refused["error"]["data"]["requested"] == "2099-01-01"
