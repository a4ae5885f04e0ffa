"""A capture's memory of answers, frame trees and frame-number lists, bounded by bytes (issue 12).

As live Python objects the pcap actor's caches took ~10x their JSON size (a dict, str and int
object per value) and left pymalloc arenas pinned when evicted: after a short session on a 55 MB
capture (~4 MB of answers and trees, a 100k-frame list) they held ~40 MB of the daemon's RSS.
Here each value is kept pickled, as one bytes object: what an entry costs is its length, the
budget is a number of bytes, a large value sits in a mapping of its own (unmapped when evicted,
see actors/heap.py), and a hit returns an equal, fresh copy (pickle keeps tuples, ints and every
other type as they were, so an answer from the cache is the answer computed).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

ENTRY_OVERHEAD = 100  # bytes an entry costs besides its value: the dict slot, the key, the bytes header


class PackedLru(Generic[K, V]):
    """Least-recently-used values, pickled, at most `budget` bytes and `max_entries` entries in all.

    A value larger than `budget // 2` is not kept (it would flush everything else)."""

    def __init__(self, budget: int, max_entries: int) -> None:
        self.budget, self.max_entries = budget, max_entries
        self._entries: OrderedDict[K, bytes] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: K) -> V | None:
        """A copy of the value kept under `key` (now the most recently used), or None."""
        return self[key] if key in self._entries else None

    def __getitem__(self, key: K) -> V:
        blob = self._entries[key]
        self._entries.move_to_end(key)
        value: V = pickle.loads(blob)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep `value` under `key`, evicting the least recently used until it fits."""
        self.discard(key)
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        if self._cost(key, blob) > self.budget // 2:
            return
        self._entries[key] = blob
        self.nbytes += self._cost(key, blob)
        while self.nbytes > self.budget or len(self._entries) > self.max_entries:
            old_key, old = self._entries.popitem(last=False)
            self.nbytes -= self._cost(old_key, old)

    def __setitem__(self, key: K, value: V) -> None:
        self.put(key, value)

    def discard(self, key: K) -> None:
        blob = self._entries.pop(key, None)
        if blob is not None:
            self.nbytes -= self._cost(key, blob)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    @staticmethod
    def _cost(key: K, blob: bytes) -> int:
        return len(blob) + ENTRY_OVERHEAD + (len(key) if isinstance(key, str) else 0)
