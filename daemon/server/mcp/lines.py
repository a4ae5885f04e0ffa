"""Newline-delimited MCP messages read off a socket under the same limits as control frames.

A line has no length header, so its cost is only known as it arrives. Once a connection's first
line is in (the accept loop's handshake deadline covers that one), every partial line must be
complete within `frame_timeout_s` of its first byte, and a partial line above
`SMALL_PARTIAL_BYTES` is read only with a growing `Share` of the daemon-wide `ByteBudget` that
large control frames draw on too. Waiting between lines is free, like waiting between frames.
"""

from __future__ import annotations

import math

import trio

from diagd.daemon.server.connections import ByteBudget, Connection, Share, State
from diagd.protocol.errors import DiagdError, ErrorCode

# A partial line up to this size is buffered without the budget (as control frames up to
# control_server.SMALL_FRAME_BYTES are): with the table full that is max_connections x 64 KiB.
SMALL_PARTIAL_BYTES = 64 * 1024
CHUNK_BYTES = 65536


class LineReader:
    """Complete lines from a byte stream; DiagdError TIMEOUT when a partial line misses its deadline,
    PROTOCOL_ERROR when it grows past `max_line_bytes`."""

    def __init__(self, stream: trio.abc.ReceiveStream, *, max_line_bytes: int,
                 frame_timeout_s: float = math.inf, budget: ByteBudget | None = None,
                 conn: Connection | None = None) -> None:
        self._stream = stream
        self.max_line_bytes = max_line_bytes
        self.frame_timeout_s = frame_timeout_s
        self._share: Share | None = budget.share() if budget is not None else None
        self._conn = conn
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._line_started = math.inf  # Trio time of the partial line's first byte

    def __repr__(self) -> str:
        return f"<LineReader [{len(self._buffer)} bytes partial, {self._share!r}]>"

    @property
    def partial_bytes(self) -> int:
        return len(self._buffer)

    async def next_lines(self) -> list[bytes] | None:
        """The complete lines received next (at least one), None at EOF (a partial line is dropped)."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0:
                return self._take_lines()
            self._scanned = len(self._buffer)
            if len(self._buffer) > self.max_line_bytes:
                raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"message exceeds {self.max_line_bytes} bytes",
                                 limit=self.max_line_bytes)
            if not await self._receive():
                return None

    def release(self) -> None:
        """Give the budget back (the connection ends)."""
        self._buffer = bytearray()
        if self._share is not None:
            self._share.shrink_to(0)

    def _take_lines(self) -> list[bytes]:
        end = self._buffer.rfind(b"\n")
        lines = bytes(self._buffer[:end]).split(b"\n")
        # A fresh buffer, so the capacity a long line needed is freed with it.
        self._buffer = self._buffer[end + 1:]
        self._scanned = 0
        # Whatever follows the last newline arrived in the last chunk: its deadline starts now.
        self._line_started = trio.current_time() if self._buffer else math.inf
        if self._share is not None:
            self._share.shrink_to(len(self._buffer) if len(self._buffer) > SMALL_PARTIAL_BYTES else 0)
        if self._conn is not None:
            self._conn.touch(State.READING if self._buffer else State.IDLE)
        return lines

    async def _receive(self) -> bool:
        """Buffer the next chunk; False at EOF."""
        want = min(CHUNK_BYTES, self.max_line_bytes + 1 - len(self._buffer))
        with trio.move_on_at(self._line_started + self.frame_timeout_s) as scope:
            if self._share is not None and len(self._buffer) + want > SMALL_PARTIAL_BYTES:
                await self._share.grow_to(len(self._buffer) + want)  # waits here, not reading, when others hold it
            try:
                chunk = await self._stream.receive_some(want)
            except trio.BrokenResourceError:
                return False
        if scope.cancelled_caught:
            raise DiagdError(ErrorCode.TIMEOUT, f"message not complete within {self.frame_timeout_s:g} s of its "
                             f"first byte ({len(self._buffer)} bytes received, no newline); closing",
                             received=len(self._buffer), setting="[daemon] frame_timeout_s")
        if not chunk:
            return False
        if not self._buffer:
            self._line_started = trio.current_time()
            if self._conn is not None:
                self._conn.touch(State.READING)
        self._buffer += chunk
        return True
