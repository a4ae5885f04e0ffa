"""Which MCP protocol versions diagd speaks, the same on every transport (docs/mcp-protocol.md).

Two eras, as the MCP SDK serves them:
- the handshake era (2024-11-05 to 2025-11-25): `initialize`, then requests on that session. An
  `initialize` asking for a version diagd does not know (2026-07-28 included, which has no
  handshake) is answered with the newest handshake version, as the spec says; the client decides.
- the envelope era (2026-07-28): no handshake, every request names its version in
  `params._meta["io.modelcontextprotocol/protocolVersion"]` (over HTTP also in the
  `MCP-Protocol-Version` header). Over stdio the first request decides a connection's era.

An envelope naming a version outside ENVELOPE, or a header naming one diagd does not speak, is refused
with UNSUPPORTED_PROTOCOL_VERSION; over HTTP an envelope whose version the `MCP-Protocol-Version`
header does not repeat is refused first, with HEADER_MISMATCH. The versions a 2026-era client may pick
from (ADVERTISED) are the same list in `server/discover`'s `supportedVersions` and in that error's
`data.supported`. Pinned here, not read from the SDK: tests/daemon/test_eras.py fails when an SDK
upgrade serves other versions, so the decision (and the doc) is revisited, not inherited.
"""

from __future__ import annotations

HANDSHAKE = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
ENVELOPE = ("2026-07-28",)
SUPPORTED = HANDSHAKE + ENVELOPE
LATEST_HANDSHAKE = HANDSHAKE[-1]

# What `server/discover` answers as `supportedVersions` and what an UNSUPPORTED_PROTOCOL_VERSION error
# lists as `data.supported`: one list, so they cannot disagree. The draft gives both the same meaning
# ("Protocol versions the server supports. The client should choose a ... version from this list",
# schema.ts DiscoverResult and UnsupportedProtocolVersionError) and a client retries by naming the
# chosen version in the envelope, which serves ENVELOPE only (the SDK refuses a handshake-era version
# there); a handshake-era version is reached through `initialize`, whose answer names it.
ADVERTISED = ENVELOPE

ENVELOPE_KEY = "io.modelcontextprotocol/protocolVersion"  # in params._meta
HEADER = "mcp-protocol-version"

# JSON-RPC error codes of the 2026-07-28 draft, in the range it reserves for the spec (-32020..-32099,
# allocated from -32020; schema.ts "MCP error codes"). The SDK's are the same (mcp_types.jsonrpc).
# Draft basic/transports/streamable-http, "Protocol Version Header" and "Server Validation": the header
# MUST match `_meta`'s version, else 400 Bad Request and `HeaderMismatch` (HeaderMismatchError: `data` optional).
HEADER_MISMATCH = -32020
# Draft basic/versioning, "Protocol Version Negotiation": a version the server does not implement gets
# UnsupportedProtocolVersionError "listing the versions it does support", data {supported, requested}.
UNSUPPORTED_PROTOCOL_VERSION = -32022


def describe() -> str:
    """The versions in one phrase, for error messages."""
    return f"{', '.join(HANDSHAKE)} (initialize handshake) and {', '.join(ENVELOPE)} (per-request envelope)"
