"""The connection table: who is connected, what each connection is doing, who makes room.

Every accepted connection (MCP or control) gets a `Connection` with an explicit state and the
Trio time of its last activity. When the table is full, a newcomer does not get refused while
some connection just sits there: the connection that has never said anything, else the one idle
the longest, is dropped to make room. Only when every connection is mid-request is the newcomer
refused (with a coded BUSY error, sent by the accept loop).

Large control frames and long partial MCP lines draw on one daemon-wide `ByteBudget`, so memory
held by half-sent messages is bounded by the budget (plus one message), not by connections x
message limit.
"""

from __future__ import annotations

import contextvars
import enum
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio


class State(enum.Enum):
    HANDSHAKE = "handshake"  # accepted, first message (hello / first line) not complete yet
    IDLE = "idle"  # between requests, nothing in flight
    READING = "reading"  # part of a frame received, under the frame deadline
    BUSY = "busy"  # a request or tool call is being served


# Dropped first when the table is full: never-greeted connections, then the longest idle.
_DROPPABLE = {State.HANDSHAKE: 0, State.IDLE: 1}


@dataclass(eq=False)
class Connection:
    id: int
    kind: str  # "mcp" | "control"
    pid: int
    connected_wall: float = field(default_factory=time.time)
    connected_at: float = field(default_factory=trio.current_time)
    last_activity: float = field(default_factory=trio.current_time)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    in_flight: int = 0
    drop_reason: str | None = None
    on_drop: Callable[[str], None] | None = None  # tells the peer why, in its socket's protocol
    # The peer's working directory at connect time (see `peer_cwd`): relative paths in its tool
    # arguments mean this directory, not the daemon's. None when it cannot be known.
    cwd: str | None = None
    _state: State = State.HANDSHAKE

    @property
    def client(self) -> str:
        return f"{self.kind}:{self.pid}"

    @property
    def state(self) -> State:
        return State.BUSY if self.in_flight else self._state

    def touch(self, state: State) -> None:
        """Record activity and what the connection does now."""
        self._state = state
        self.last_activity = trio.current_time()

    @contextmanager
    def busy(self) -> Iterator[None]:
        """A request or tool call in flight: the connection is not idle, whatever its byte state."""
        self.in_flight += 1
        self.last_activity = trio.current_time()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_activity = trio.current_time()

    def drop(self, reason: str) -> None:
        self.drop_reason = reason
        if self.on_drop is not None:
            self.on_drop(reason)
        self.scope.cancel(reason=reason)

    def statistics(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "pid": self.pid, "state": self.state.value,
                "connected_at": time.strftime("%H:%M:%S", time.localtime(self.connected_wall)),
                "idle_s": round(trio.current_time() - self.last_activity, 3) if self.state is State.IDLE else 0.0}

    def __repr__(self) -> str:
        return (f"<Connection #{self.id} {self.client} [{self.state.name}, "
                f"last activity {trio.current_time() - self.last_activity:.1f}s ago]>")


def peer_cwd(pid: int) -> str | None:
    """The working directory of the process `pid` (a connected client), as a path valid here.

    Clients of both sockets run where their user is: `diagd call` in the caller's shell, the shim
    `diagd mcp` in the directory its MCP client started it in. SO_PEERCRED gives their pid and
    the daemon only admits its own uid, so /proc/<pid>/cwd is readable. None (relative paths then
    refused) when the process is gone, lives in another mount namespace (its paths mean other
    files here), or its directory was removed.
    """
    link = f"/proc/{pid}/cwd"
    try:
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
            return None
        path = os.readlink(link)
        here, there = os.stat(path), os.stat(link)
    except OSError:
        return None
    # A removed directory reads as "<path> (deleted)"; a path that now names another directory
    # (renamed, replaced) is not where the client is.
    if not os.path.isabs(path) or (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        return None
    return path


# The connection a task serves: set by the accept loop, inherited by the tasks it starts (MCP
# handlers), read where tool calls start.
current: contextvars.ContextVar[Connection | None] = contextvars.ContextVar("diagd_connection", default=None)


class ConnectionTable:
    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self._by_id: dict[int, Connection] = {}
        self._ids = itertools.count(1)
        self.dropped = 0
        self.refused = 0

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._by_id.values()))

    def admit(self, kind: str, pid: int) -> tuple[Connection | None, Connection | None]:
        """(the new connection, the one dropped for it); (None, None) when all are busy."""
        dropped = None
        if len(self._by_id) >= self.max_connections:
            dropped = self.oldest_idle()
            if dropped is None:
                self.refused += 1
                return None, None
            self.remove(dropped)
            self.dropped += 1
            dropped.drop(f"dropped to make room: {self.max_connections} connections and this one was "
                         f"{dropped.state.value} the longest")
        conn = Connection(next(self._ids), kind, pid)
        self._by_id[conn.id] = conn
        return conn, dropped

    def oldest_idle(self) -> Connection | None:
        idle = [c for c in self._by_id.values() if c.state in _DROPPABLE]
        return min(idle, key=lambda c: (_DROPPABLE[c.state], c.last_activity), default=None)

    def remove(self, conn: Connection) -> None:
        self._by_id.pop(conn.id, None)


class ByteBudget:
    """Bytes that half-received frames may hold, across all connections; takers wait their turn.

    A taker that waits is not reading, so its peer's kernel buffer fills and the peer blocks;
    its frame deadline still runs, so a slow sender cannot hold its share for long.

    Two kinds of takers: `hold` takes a frame's whole length at once (a control frame's header
    gives it), a `Share` grows as bytes come (an MCP line, whose length is known only at its
    newline).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._lot = trio.lowlevel.ParkingLot()
        self._shares: dict[Share, None] = {}  # growing shares holding bytes, oldest first
        self._frames = 0  # bytes held through `hold`

    @asynccontextmanager
    async def hold(self, nbytes: int) -> AsyncIterator[None]:
        if nbytes > self.total:
            raise ValueError(f"{nbytes} bytes can never fit a budget of {self.total}")
        while nbytes > self.free:
            await self._lot.park()
        self.free -= nbytes
        self._frames += nbytes
        try:
            yield
        finally:
            self._frames -= nbytes
            self._give(nbytes)

    def share(self) -> Share:
        return Share(self)

    def _give(self, nbytes: int) -> None:
        self.free += nbytes
        self._lot.unpark_all()


class Share:
    """One connection's growing part of a `ByteBudget`: grown before each read, released when the
    partial message is gone.

    Growing shares hold bytes while they wait for more, so two of them could each wait for the
    other's bytes until their deadlines, and a message larger than the budget could never fit.
    The oldest share therefore waits only for whole frames (`hold`), which end by themselves:
    when none holds bytes it may take past the budget, by at most one message (its own limit
    bounds it). The bytes held stay within the budget plus one message, and some message always
    makes progress.
    """

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0

    def __repr__(self) -> str:
        return f"<Share {self.held} of {self.budget.free}/{self.budget.total} bytes free>"

    async def grow_to(self, nbytes: int) -> None:
        """Hold `nbytes` in all, waiting while others hold the rest (unless this share is the oldest)."""
        budget = self.budget
        while nbytes > self.held:
            extra = nbytes - self.held
            oldest = next(iter(budget._shares), self) is self
            if extra <= budget.free or (oldest and not budget._frames):
                budget.free -= extra
                self.held = nbytes
                budget._shares.setdefault(self, None)
                break
            await budget._lot.park()

    def shrink_to(self, nbytes: int) -> None:
        """Keep only `nbytes` (0: release it all and lose its place in the queue)."""
        if nbytes >= self.held:
            return
        given, self.held = self.held - nbytes, nbytes
        if not nbytes:
            self.budget._shares.pop(self, None)
        self.budget._give(given)


async def last_words(stream: trio.SocketStream, data: bytes, timeout_s: float = 1.0) -> None:
    """Send a last message, then half-close and drain what the peer already sent (bounded): closing
    a Unix socket with unread input resets the peer, which would then lose the message."""
    with trio.move_on_after(timeout_s):
        try:
            await stream.send_all(data)
            await stream.send_eof()
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
