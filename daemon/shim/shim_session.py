"""What the `diagd mcp` shim knows about the MCP session it carries, so it can outlive one connection.

Pure line logic, no I/O (the shim's threads call it under one lock): the client's `initialize` and
`notifications/initialized` lines, the requests in flight (sent by the client, not answered yet), the
lines that must go first on every connection (`prelude`), and the daemon's last words. When the
connection drops, `dropped()` answers the calls in flight with a coded DAEMON_RESTARTED error and
`replay()` gives the lines that rebuild the session on the next connection; the answer to the replayed
`initialize` (sent under a shim-owned id) is swallowed, the client never sees it.

Stdlib only: the shim must start fast (tests/daemon/test_light_imports.py).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

from diagd.daemon import jsonrpc
from diagd.protocol.errors import ErrorCode

REPLAY_ID_PREFIX = "diagd-shim-replay-"

# The daemon writes responses as `{"jsonrpc":"2.0","id":<id>,"result"|"error":...}` (pydantic field
# order, or jsonrpc.error_line): reading the id from the head spares parsing a 6 MB result.
_RESPONSE_HEAD = re.compile(
    rb'\A\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?[0-9]+|null)\s*,\s*"(result|error)"\s*:')


class Verdict(enum.Enum):
    """What a daemon line means to the shim."""

    FORWARD = "forward"  # give it to the client
    SWALLOW = "swallow"  # ours (the replayed initialize's answer, a restart notice): the client never sees it


class Closing(enum.Enum):
    """How a connection ended, from the daemon's side."""

    DROPPED = "dropped"  # EOF or reset with no notice: killed, crashed, restarted
    STOPPING = "stopping"  # the daemon said it stops (DAEMON_STOPPING): a restart or upgrade
    REFUSED = "refused"  # the daemon closed this client on purpose (BUSY, a too-long line, ...)


class ReplayFailed(Exception):
    """The restarted daemon answered the replayed `initialize` with an error."""


def _cancelled_id(msg: Any) -> tuple[Any] | None:
    """(the request id) of a `notifications/cancelled`, else None (a 1-tuple: an id may be 0)."""
    if not isinstance(msg, dict) or msg.get("method") != "notifications/cancelled" or "id" in msg:
        return None
    params = msg.get("params")
    return (params["requestId"],) if isinstance(params, dict) and "requestId" in params else None


def _key(ident: Any) -> str:
    """A dict key for a JSON-RPC id that keeps 1 and "1" apart."""
    return json.dumps(ident, separators=(",", ":"))


def _loads(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # not JSON: the daemon answers it, nothing to track
        return None


def _is_request(msg: Any) -> bool:
    return (isinstance(msg, dict) and isinstance(msg.get("method"), str) and "id" in msg
            and isinstance(msg["id"], str | int) and not isinstance(msg["id"], bool))


@dataclass
class ShimSession:
    """One MCP session as the shim sees it, across connections."""

    # Lines sent first on every connection, before any MCP line (e.g. an options line).
    prelude: list[bytes] = field(default_factory=list)
    initialize: bytes | None = None  # the client's initialize request line, as sent
    initialize_key: str | None = None
    initialized: bytes | None = None  # the client's notifications/initialized line
    in_flight: dict[str, str] = field(default_factory=dict)  # id key -> method
    replay_key: str | None = None  # our replayed initialize, until its answer is swallowed
    replays: int = 0
    notice: dict[str, Any] | None = None  # the current connection's closing notice (`data.closing`), if any

    def __repr__(self) -> str:
        return (f"<ShimSession [{'READY' if self.initialized else 'INIT' if self.initialize else 'NEW'}, "
                f"{len(self.in_flight)} in flight, {self.replays} replays]>")

    # -- client -> daemon ---------------------------------------------------------------------------

    def from_client(self, line: bytes) -> None:
        """Note a complete line the client sends (its newline included) before it goes to the daemon."""
        msg = _loads(line)
        if _is_request(msg):
            key = _key(msg["id"])
            self.in_flight[key] = msg["method"]
            if msg["method"] == "initialize":
                self.initialize, self.initialize_key = line, key
        elif isinstance(msg, dict) and msg.get("method") == "notifications/initialized" and "id" not in msg:
            self.initialized = line
        elif cancelled := _cancelled_id(msg):  # MCP: a cancelled request is not answered
            self.in_flight.pop(_key(cancelled[0]), None)

    # -- daemon -> client ---------------------------------------------------------------------------

    def from_daemon(self, line: bytes) -> Verdict:
        """What to do with a complete line from the daemon (its newline included).

        Raises ReplayFailed when it is an error answering our replayed initialize.
        """
        head = _RESPONSE_HEAD.match(line)
        if head is not None and head[2] == b"result":
            key = _key(json.loads(head[1]))
        else:  # errors and anything else are small, or not a response: read it all
            msg = _loads(line)
            if not (isinstance(msg, dict) and "method" not in msg and ("result" in msg or "error" in msg)):
                return Verdict.FORWARD
            key = _key(msg.get("id"))
            if msg.get("id") is None:
                return self._null_id_error(msg)
            if key == self.replay_key and "error" in msg:
                raise ReplayFailed(str(msg["error"].get("message") if isinstance(msg["error"], dict) else msg))
        if key == self.replay_key:
            self.replay_key = None
            return Verdict.SWALLOW
        self.in_flight.pop(key, None)
        return Verdict.FORWARD

    def _null_id_error(self, msg: dict[str, Any]) -> Verdict:
        error = msg.get("error")
        data = error.get("data") if isinstance(error, dict) else None
        if isinstance(data, dict) and data.get("closing"):
            self.notice = error
            if data.get("code") == ErrorCode.DAEMON_STOPPING:
                return Verdict.SWALLOW  # the session goes on with the next daemon: nothing to tell the client
        return Verdict.FORWARD

    # -- the connection ends ------------------------------------------------------------------------

    def closing(self) -> Closing:
        """How the current connection ended (call at its EOF)."""
        if self.notice is None:
            return Closing.DROPPED
        data = self.notice.get("data") or {}
        return Closing.STOPPING if data.get("code") == ErrorCode.DAEMON_STOPPING else Closing.REFUSED

    def notice_message(self) -> str | None:
        return None if self.notice is None else str(self.notice.get("message"))

    def dropped(self) -> list[bytes]:
        """The connection is gone: an error line for each call that was in flight (they may or may not
        have run), and none in flight any more. An `initialize` still unanswered is replayed instead."""
        failed = []
        for key, method in list(self.in_flight.items()):
            if key == self.initialize_key and self.initialized is None:
                continue  # replayed under the client's own id: its answer is the client's
            failed.append(jsonrpc.restart_error(json.loads(key), method))
            del self.in_flight[key]
        self.replay_key = None
        self.notice = None
        return failed

    def replay(self) -> list[bytes]:
        """The lines that open the session again on a new connection: the prelude, then the client's
        initialize (under a shim-owned id once the client has its answer) and initialized."""
        lines = list(self.prelude)
        if self.initialize is None:
            return lines
        self.replays += 1
        if self.initialized is None and self.initialize_key in self.in_flight:
            return [*lines, self.initialize]  # the client still waits for this answer: it gets it
        msg = json.loads(self.initialize)
        msg["id"] = f"{REPLAY_ID_PREFIX}{self.replays}"
        self.replay_key = _key(msg["id"])
        lines.append(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        if self.initialized is not None:
            lines.append(self.initialized)
        return lines


class Lines:
    """Complete lines out of a byte stream, each with its newline; `partial` holds the rest."""

    def __init__(self) -> None:
        self.partial = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        newline = data.rfind(b"\n")
        if newline < 0:
            self.partial += data
            return []
        self.partial += data[:newline + 1]
        lines = [line + b"\n" for line in bytes(self.partial).split(b"\n")[:-1]]
        self.partial = bytearray(data[newline + 1:])
        return lines
