"""JSON-RPC 2.0 screening of MCP lines before the SDK sees them.

The SDK's parser (pydantic on jiter) turns some malformed requests into silence or a misleading
answer: a request whose id is null, 1.5, {}, [] or true validates as a *notification* (unknown
fields are dropped), so it was never answered; a lone surrogate escape (`"\\ud800"`, valid JSON
syntax, not Unicode) failed as a parse error with id null although the id was readable; a call
before `initialize` got -32602 "Invalid request parameters". Here each gets the error JSON-RPC 2.0
asks for, with the request's id whenever it can be read: null only for unparsable JSON, a batch,
or an id that is neither a string nor a number. `data.code` carries diagd's error code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.shared.message import SessionMessage

from diagd.daemon.jsonrpc import error_line
from diagd.daemon.server import eras
from diagd.protocol.errors import ErrorCode

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
INIT_EXEMPT = frozenset({"initialize", "ping"})  # what a client may send before the handshake (as the SDK)

_SURROGATE = re.compile("[\ud800-\udfff]")


def parse(line: bytes, *, http: bool = False, version_header: str | None = None) -> SessionMessage | bytes:
    """A message for the SDK, or the error line that answers it.

    Over HTTP (`http`: `version_header` is the request's `MCP-Protocol-Version`, None when absent) a
    request naming its version in the envelope must name the same in the header, else HEADER_MISMATCH,
    checked before the version itself as the draft's server validation and the SDK do: a client that
    disagrees with itself is told so, not that one of its two versions is unsupported.
    """
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:  # pydantic's ValidationError
        return _diagnose(line)
    if isinstance(message, types.JSONRPCNotification):
        # A request with an unusable id validates as a notification: look at what was sent.
        raw = _loads(line)
        if isinstance(raw, dict) and "id" in raw:
            return _bad_id(raw["id"])
    if isinstance(message, types.JSONRPCRequest):
        requested = envelope_version(message.params)
        if requested is not None and http and version_header != requested:
            return header_mismatch(version_header, requested, message.id)
        if requested is not None and requested not in eras.ENVELOPE:
            return unsupported_version(requested, message.id)
    return SessionMessage(message)


def envelope_version(params: dict[str, Any] | None) -> Any:
    """The protocol version a 2026-era request names in `params._meta`, None for a handshake-era one."""
    meta = (params or {}).get("_meta")
    return meta.get(eras.ENVELOPE_KEY) if isinstance(meta, dict) else None


def unsupported_version(requested: Any, ident: Any = None) -> bytes:
    """The answer to a protocol version diagd does not speak, named in an envelope or an HTTP header:
    `data.supported` is what `server/discover` lists (eras.ADVERTISED), the message names every era."""
    return error_line(eras.UNSUPPORTED_PROTOCOL_VERSION,
                      f"Unsupported protocol version {json.dumps(requested)[:60]}: diagd speaks {eras.describe()}",
                      ident, data={"code": str(ErrorCode.PROTOCOL_ERROR), "supported": list(eras.ADVERTISED),
                                   "requested": requested})


def header_mismatch(header: str | None, requested: Any, ident: Any = None) -> bytes:
    """The answer to an HTTP request whose `MCP-Protocol-Version` header (None: absent) is not the
    version its envelope names."""
    said = "is missing" if header is None else f"says {json.dumps(header)[:60]}"
    return error_line(eras.HEADER_MISMATCH,
                      f"Header mismatch: the MCP-Protocol-Version header {said}, the request's "
                      f"params._meta names {json.dumps(requested)[:60]}; send the same version in both",
                      ident, data={"code": str(ErrorCode.PROTOCOL_ERROR), "header": "MCP-Protocol-Version"})


def _loads(line: bytes) -> Any:
    """The stdlib parser: unlike jiter it accepts lone surrogates, so the id can still be read."""
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(line.decode("utf-8"), parse_constant=no_constants)


def _readable(ident: Any) -> bool:
    return isinstance(ident, str | int | float) and not isinstance(ident, bool)


def _bad_id(ident: Any) -> bytes:
    return error_line(INVALID_REQUEST, f"Invalid Request: id must be a string or an integer, not "
                                       f"{json.dumps(ident)[:100]}",
                      ident if _readable(ident) else None, data={"code": str(ErrorCode.PROTOCOL_ERROR)})


def _diagnose(line: bytes) -> bytes:
    protocol = {"code": str(ErrorCode.PROTOCOL_ERROR)}
    try:
        raw = _loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return error_line(PARSE_ERROR, f"Parse error: {exc}", data=protocol)
    if isinstance(raw, list):
        why = "an empty batch" if not raw else "batches are not supported, send one message at a time"
        return error_line(INVALID_REQUEST, f"Invalid Request: {why}", data=protocol)
    if not isinstance(raw, dict):
        return error_line(INVALID_REQUEST, "Invalid Request: a message is a JSON object", data=protocol)
    ident = raw.get("id")
    if "id" in raw and not (_readable(ident) and not isinstance(ident, float)):
        return _bad_id(ident)
    path = _surrogate_path(raw)
    if path is not None:
        return error_line(INVALID_PARAMS if path.startswith("$.params") else INVALID_REQUEST,
                          f"{path}: a lone surrogate (\\ud800-\\udfff without its pair) is not Unicode text",
                          ident, data={"code": str(ErrorCode.INVALID_ARGUMENT), "path": path})
    if raw.get("jsonrpc") != "2.0":
        return error_line(INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0"', ident, data=protocol)
    if "method" in raw and not isinstance(raw["method"], str):
        return error_line(INVALID_REQUEST, "Invalid Request: method must be a string", ident, data=protocol)
    if "method" in raw and "params" in raw and not isinstance(raw["params"], dict):
        return error_line(INVALID_PARAMS, "Invalid params: params must be an object", ident, data=protocol)
    return error_line(INVALID_REQUEST, "Invalid Request: not a JSON-RPC request, notification or response",
                      ident, data=protocol)


def _surrogate_path(value: Any) -> str | None:
    """Where the first string holding a lone surrogate is, as a JSON path (`$.params.arguments.x`)."""
    stack: list[tuple[str, Any]] = [("$", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return path
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                if _SURROGATE.search(key):
                    return path
                stack.append((f"{path}.{key}", item[key]))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


class Handshake:
    """Where one connection stands in MCP's initialize handshake, seen from its lines.

    Before `initialize` the SDK answers a served method with -32602 "Invalid request parameters";
    `screen` answers it instead, saying what to do. While an `initialize` is in flight the SDK
    decides (it handles `initialize` before reading the next line). A request that carries the
    2026-07-28 envelope (`params._meta` names its protocol version) has no handshake: it passes, and
    the SDK serves the connection in that era (see `eras`).
    """

    def __init__(self, serves: Callable[[str], bool]) -> None:
        self._serves = serves
        self._pending: set[types.RequestId] = set()
        self.ready = False

    def __repr__(self) -> str:
        return f"<Handshake [{'READY' if self.ready else 'PENDING' if self._pending else 'NEW'}]>"

    def screen(self, message: SessionMessage) -> bytes | None:
        """The error line for a request that comes before the handshake, else None (pass it on)."""
        msg = message.message
        if isinstance(msg, types.JSONRPCRequest):
            if msg.method == "initialize":
                self._pending.add(msg.id)
            elif (not (self.ready or self._pending) and msg.method not in INIT_EXEMPT and self._serves(msg.method)
                  and envelope_version(msg.params) is None):  # a 2026-era request needs no handshake
                return error_line(
                    INVALID_REQUEST, f"session not initialized: send initialize, wait for its result, then "
                                     f"notifications/initialized, before {msg.method}",
                    msg.id, data={"code": str(ErrorCode.PROTOCOL_ERROR), "method": msg.method})
        elif isinstance(msg, types.JSONRPCNotification) and msg.method == "notifications/initialized":
            self.ready = True
        return None

    def answered(self, message: SessionMessage) -> None:
        """Note the SDK's answer to an `initialize` (a result opens the session)."""
        msg = message.message
        if isinstance(msg, types.JSONRPCResponse | types.JSONRPCError) and msg.id in self._pending:
            self._pending.discard(msg.id)
            self.ready = self.ready or isinstance(msg, types.JSONRPCResponse)
