"""The pcap actor's caches are bounded by bytes and hand back what was put (issue 12)."""

from __future__ import annotations

import pickle
from typing import Any

from diagd.actors.pcap.engine.cache import ENTRY_OVERHEAD, PackedLru


def test_a_value_comes_back_equal_with_its_types_and_as_a_fresh_copy() -> None:
    cache: PackedLru[object, dict[str, Any]] = PackedLru(2**20, 10)
    answer = {"rows": [{"number": 1, "cols": ("a", "b")}], "total": 1, "ratio": 0.5, "none": None}
    cache.put(("frames", "ngap"), answer)
    got = cache.get(("frames", "ngap"))
    assert got == answer and got is not answer
    assert isinstance(got["rows"][0]["cols"], tuple)
    got["rows"].clear()  # a caller changing its copy does not change the cache
    assert cache.get(("frames", "ngap")) == answer
    assert cache.get("missing") is None and "missing" not in cache


def test_empty_values_are_hits() -> None:
    cache: PackedLru[str, list[int]] = PackedLru(2**20, 10)
    cache["no.match"] = []
    assert cache.get("no.match") == [] and "no.match" in cache


def test_the_byte_budget_evicts_the_least_recently_used() -> None:
    value = list(range(100_000, 101_000))  # ~5 kB pickled
    size = len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)) + ENTRY_OVERHEAD
    cache: PackedLru[int, list[int]] = PackedLru(size * 3 + 10, 100)
    for key in range(3):
        cache.put(key, value)
    assert len(cache) == 3 and cache.nbytes == 3 * size
    assert cache.get(0) == value  # 0 is now the most recently used: 1 goes first
    cache.put(3, value)
    assert 1 not in cache and all(k in cache for k in (0, 2, 3))
    assert cache.nbytes == 3 * size <= cache.budget


def test_the_entry_count_is_bounded_too() -> None:
    cache: PackedLru[int, int] = PackedLru(2**20, 4)
    for key in range(10):
        cache.put(key, key)
    assert len(cache) == 4 and [k for k in range(10) if k in cache] == [6, 7, 8, 9]


def test_a_value_over_half_the_budget_is_not_kept_and_replacing_one_keeps_the_count_right() -> None:
    cache: PackedLru[str, bytes] = PackedLru(10_000, 10)
    cache.put("small", b"x" * 100)
    cache.put("big", b"x" * 6_000)
    assert "big" not in cache and "small" in cache
    before = cache.nbytes
    cache.put("small", b"y" * 100)
    assert cache.nbytes == before and cache.get("small") == b"y" * 100
    cache.put("small", b"z" * 6_000)  # too big now: the old value goes too, it is not the answer any more
    assert "small" not in cache and cache.nbytes == 0


def test_string_keys_count_their_length() -> None:
    cache: PackedLru[str, int] = PackedLru(2**20, 10)
    cache.put("f" * 1800, 5)
    assert cache.nbytes == len(pickle.dumps(5, protocol=pickle.HIGHEST_PROTOCOL)) + ENTRY_OVERHEAD + 1800


def test_it_reads_as_a_mapping() -> None:
    cache: PackedLru[int, dict[str, str]] = PackedLru(2**20, 10)
    cache[7] = {"tree": "x"}
    assert cache[7] == {"tree": "x"}
    try:
        cache[8]
    except KeyError:
        pass
    else:
        raise AssertionError("a missing key is a KeyError")


def test_known_totals_are_bounded_by_their_filters_length() -> None:
    from types import SimpleNamespace
    from typing import cast

    import trio

    from diagd.actors.pcap.engine.passes import TOTALS_BUDGET, CaptureWorkers, Cores
    from diagd.actors.pcap.engine.pool import WorkerPool

    workers = CaptureWorkers(cast(trio.Nursery, None), cast(WorkerPool, SimpleNamespace(facts=None)), [],
                             cores=Cores(1))
    long_filter = "frame.number == {} || " + "ip.addr == 10.0.0.1 || " * 70  # ~1.6 kB each
    for i in range(2000):
        workers._known(long_filter.format(i), i)
    assert workers.totals_bytes <= TOTALS_BUDGET < 2000 * len(long_filter)
    assert list(workers.totals.values())[-1] == 1999 and 0 not in workers.totals.values()
    assert workers.totals_bytes == sum(len(f) + 100 for f in workers.totals)
    workers._known(long_filter.format(1999), 7)  # a total learnt again replaces the old one
    assert workers.totals_bytes == sum(len(f) + 100 for f in workers.totals)
    for i in range(5000):
        workers._known(f"frame.number == {i}", i)
    assert len(workers.totals) == 4096
