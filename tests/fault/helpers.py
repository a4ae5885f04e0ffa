"""What the fault suite needs besides the shared fixtures: a raw control-socket client that hands
back every answer (error frames included) instead of raising, the checks every answer must pass,
and /proc views of the daemon's children and file descriptors."""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from diagd.protocol import control
from diagd.protocol.control import BlockingClient
from diagd.protocol.errors import ErrorCode
from tests.support.raw import RawMCP

CODES = {str(c) for c in ErrorCode}


class ControlClient:
    """One control connection (hello done) that returns `(is_error, payload)` for every call.

    `BlockingClient` raises on error frames; the fault tests want to look at every answer, including a
    protocol-level `error` frame, so this keeps the frame in hand.
    """

    def __init__(self, path: Path, *, client: str = "fault", timeout: float = 60) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._next_id = 0
        self.send(control.Hello(version=control.PROTOCOL_VERSION, client=client))
        hello = self.receive()
        assert isinstance(hello, control.Hello), hello

    def send(self, msg: control.Message) -> None:
        self.sock.sendall(control.encode(msg))

    def receive(self) -> control.Message | None:
        header = self._exact(control.HEADER_SIZE)
        if header is None:
            return None
        body = self._exact(control.frame_length(header))
        return None if body is None else control.decode(body)

    def _exact(self, n: int) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        self._next_id += 1
        self.send(control.CallRequest(id=self._next_id, tool=tool, arguments=arguments))
        reply = self.receive()
        assert reply is not None, f"the daemon closed the connection during {tool}"
        assert getattr(reply, "id", None) == self._next_id, reply
        if isinstance(reply, control.ErrorReply):
            return True, {"code": reply.code, "message": reply.message, "details": reply.details}
        assert isinstance(reply, control.Reply), reply
        result = reply.result
        return bool(result["is_error"]), result["result"]

    def ok(self, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        is_error, payload = self.call(tool, arguments or {})
        assert not is_error, f"{tool} failed: {payload}"
        return payload

    def status(self) -> dict[str, Any]:
        self._next_id += 1
        self.send(control.StatusRequest(id=self._next_id))
        reply = self.receive()
        assert isinstance(reply, control.Reply), reply
        result: dict[str, Any] = reply.result
        return result

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def listed_tools(daemon: Any) -> dict[str, dict[str, Any]]:
    """Every tool as the running daemon lists it (tools/list over MCP), by name."""
    raw = RawMCP(daemon.mcp_socket, timeout=30)
    try:
        raw.initialize()
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
        reply = raw.read()
    finally:
        raw.close()
    assert reply is not None and "result" in reply, reply
    return {t["name"]: t for t in reply["result"]["tools"]}


def declared_tools(daemon: Any) -> dict[str, dict[str, Any]]:
    """Every tool with its schemas as declared (`diagd tools --json`): the whole output schemas results
    are checked against (tools/list gives the same ones)."""
    with BlockingClient(str(daemon.control_socket), client="schemas") as client:
        listed = client.request(control.ToolsRequest)
    return {t["name"]: t for t in listed["tools"]}


def input_schema(daemon: Any, tool: str) -> dict[str, Any]:
    """A tool's input schema as the running daemon lists it."""
    schema: dict[str, Any] = listed_tools(daemon)[tool]["inputSchema"]
    return schema


def assert_coded_error(payload: Any, *, context: str = "") -> str:
    """An error answer is {code, message[, details]} with a known code, never INTERNAL_ERROR or a traceback."""
    assert isinstance(payload, dict), f"{context}: error payload is not an object: {payload!r}"
    assert isinstance(payload.get("code"), str) and isinstance(payload.get("message"), str), \
        f"{context}: error without code/message: {payload!r}"
    code: str = payload["code"]
    assert code in CODES, f"{context}: unknown error code {code!r}: {payload!r}"
    assert code != "INTERNAL_ERROR", f"{context}: INTERNAL_ERROR: {payload['message'][:2000]}"
    assert "Traceback" not in payload["message"], f"{context}: traceback in the message: {payload['message']}"
    leak = next((s for s in strings(payload) if DIAGD_FRAME.search(s)), None)
    assert leak is None, f"{context}: diagd's own traceback on the wire: {leak}"
    return code


# A frame of diagd's own code in a traceback. drgn answers with the traceback of the user's code
# (`File "<drgn>"`, the stdlib): that is the tool's output, not a leak.
DIAGD_FRAME = re.compile(r'File "[^"]*/(?:actors|daemon|protocol|diagd)/[^"]*\.py"')


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


# ---------------------------------------------------------------------------------------------
# /proc views


def wait_for(predicate: Callable[[], bool], timeout: float, message: Callable[[], str] | str) -> None:
    """Poll external state (a process, a file) until `predicate` holds; fail with `message` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message() if callable(message) else message)
        time.sleep(0.05)


def frame(obj: object) -> bytes:
    """A control frame around any msgpack-able object (the daemon's codec would refuse to build junk)."""
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body
