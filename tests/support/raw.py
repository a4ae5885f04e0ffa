"""Raw socket helpers for tests that speak to the daemon below the SDK (garbage, disconnects)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

INITIALIZE = {
    "jsonrpc": "2.0", "id": 0, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}


class RawMCP:
    """Newline-delimited JSON-RPC on the MCP socket, with a blocking line reader."""

    def __init__(self, path: Path, timeout: float = 10) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.buffer = b""

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: dict[str, Any]) -> None:
        self.send_bytes(json.dumps(message).encode() + b"\n")

    def read_line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def read(self) -> dict[str, Any] | None:
        line = self.read_line()
        return None if line is None else json.loads(line)

    def initialize(self) -> dict[str, Any]:
        self.send(INITIALIZE)
        reply = self.read()
        assert reply is not None and "result" in reply, reply
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def close(self) -> None:
        self.sock.close()
