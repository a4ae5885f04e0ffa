"""Which MCP protocol versions diagd speaks, the same on every transport (docs/mcp-protocol.md).

Two eras, as the MCP SDK serves them:
- the handshake era (2024-11-05 to 2025-11-25): `initialize`, then requests on that session. An
  `initialize` asking for a version diagd does not know (2026-07-28 included, which has no
  handshake) is answered with the newest handshake version, as the spec says; the client decides.
- the envelope era (2026-07-28): no handshake, every request names its version in
  `params._meta["io.modelcontextprotocol/protocolVersion"]` (over HTTP also in the
  `MCP-Protocol-Version` header). Over stdio the first request decides a connection's era.

Any other version named in an envelope or a header is refused with UNSUPPORTED_PROTOCOL_VERSION
listing these. Pinned here, not read from the SDK: tests/daemon/test_eras.py fails when an SDK
upgrade serves other versions, so the decision (and the doc) is revisited, not inherited.
"""

from __future__ import annotations

HANDSHAKE = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ENVELOPE = ("2026-07-28",)
SUPPORTED = HANDSHAKE + ENVELOPE
LATEST_HANDSHAKE = HANDSHAKE[-1]

ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"  # in params._meta
HEADER = "mcp-protocol-version"
UNSUPPORTED_PROTOCOL_VERSION = -32022  # the SDK's code (mcp_types.UNSUPPORTED_PROTOCOL_VERSION)


def describe() -> str:
    """The versions in one phrase, for error messages."""
    return f"{', '.join(HANDSHAKE)} (initialize handshake) and {', '.join(ENVELOPE)} (per-request envelope)"
