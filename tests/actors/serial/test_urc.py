"""The URC buffer against a plain list model of its documented rules, over seeded random push/take runs.

The model keeps every packet in a list and re-reads the rules of `UrcBuffer`'s docstrings: after a
push, the oldest packets go (counted) while more than one is held and either bound is passed; a take
returns the oldest packets up to `max_packets` within `max_bytes` (at least one), with the drops since
the last consuming take, and removes them unless it peeks. Every count the tools report is compared.
"""

from __future__ import annotations

import random

from diagd.actors.serial.codec import Packet
from diagd.actors.serial.urc import UrcBuffer


class Model:
    def __init__(self, max_packets: int, max_bytes: int) -> None:
        self.max_packets, self.max_bytes = max_packets, max_bytes
        self.held: list[bytes] = []
        self.dropped = self.dropped_total = self.received_total = 0

    def push(self, data: bytes) -> None:
        self.held.append(data)
        self.received_total += 1
        while len(self.held) > 1 and (len(self.held) > self.max_packets
                                      or sum(map(len, self.held)) > self.max_bytes):
            del self.held[0]
            self.dropped += 1
            self.dropped_total += 1

    def take(self, max_packets: int, max_bytes: int, peek: bool) -> tuple[list[bytes], int]:
        n = 0
        while n < min(max_packets, len(self.held)) and (n == 0 or sum(map(len, self.held[:n + 1])) <= max_bytes):
            n += 1
        out, dropped = self.held[:n], self.dropped
        if not peek:
            del self.held[:n]
            self.dropped = 0
        return out, dropped


def test_the_buffer_follows_its_rules_on_random_runs() -> None:
    rng = random.Random(20240527)
    for _ in range(200):
        max_packets, max_bytes = rng.randint(1, 6), rng.randint(1, 40)
        urc, model = UrcBuffer(max_packets, max_bytes), Model(max_packets, max_bytes)
        for step in range(40):
            if rng.random() < 0.6:
                data = bytes([step % 256]) * rng.randint(0, 12)
                urc.push(Packet(data, 0.0, 0.0, 0.0))
                model.push(data)
            else:
                want_packets, want_bytes, peek = rng.randint(1, 5), rng.randint(0, 30), rng.random() < 0.3
                taken, dropped = urc.take(want_packets, want_bytes, peek=peek)
                assert ([p.data for p in taken], dropped) == model.take(want_packets, want_bytes, peek)
            assert len(urc) == len(model.held) and urc.bytes == sum(map(len, model.held))
            assert (urc.dropped, urc.dropped_total, urc.received_total) == (
                model.dropped, model.dropped_total, model.received_total)
            everything, _ = urc.take(10**6, 10**9, peek=True)
            assert [p.data for p in everything] == model.held
