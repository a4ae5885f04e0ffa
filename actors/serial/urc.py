"""The URC buffer: unsolicited packets between calls, bounded, counting what overflow drops."""

from __future__ import annotations

from collections import deque

from diagd.actors.serial.codec import Packet


class UrcBuffer:
    """Unsolicited packets, oldest first, bounded in packets and bytes; overflow drops the oldest
    and counts it (reported by read_urc and connection_status, never silent)."""

    def __init__(self, max_packets: int, max_bytes: int) -> None:
        self.max_packets = max_packets
        self.max_bytes = max_bytes
        self._queue: deque[Packet] = deque()
        self._bytes = 0
        self.dropped = 0  # since the last consuming read
        self.dropped_total = 0
        self.received_total = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def bytes(self) -> int:
        return self._bytes

    def push(self, packet: Packet) -> None:
        self._queue.append(packet)
        self._bytes += len(packet.data)
        self.received_total += 1
        while len(self._queue) > 1 and (len(self._queue) > self.max_packets or self._bytes > self.max_bytes):
            old = self._queue.popleft()
            self._bytes -= len(old.data)
            self.dropped += 1
            self.dropped_total += 1

    def take(self, max_packets: int, max_bytes: int, *, peek: bool = False) -> tuple[list[Packet], int]:
        """Up to `max_packets` oldest packets within `max_bytes` (always at least one if any), and
        the drop count since the last consuming read (reset unless `peek`)."""
        out: list[Packet] = []
        size = 0
        for packet in self._queue:
            if len(out) >= max_packets or (out and size + len(packet.data) > max_bytes):
                break
            out.append(packet)
            size += len(packet.data)
        dropped = self.dropped
        if not peek:
            for _ in out:
                self._bytes -= len(self._queue.popleft().data)
            self.dropped = 0
        return out, dropped
