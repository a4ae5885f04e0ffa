"""`diagd status` shows the daemon's RSS and every actor's worker processes; the heap is trimmed
once the daemon goes quiet after calls (issue 12)."""

from __future__ import annotations

import gc
import os
import platform
from typing import Any

import trio
import trio.testing

from diagd.actors import heap, system
from diagd.daemon.cli.status_text import format_status
from diagd.daemon.server.audit import CallRecord
from diagd.daemon.server.heap_trim import QuietTrimmer


def status(actors: list[dict[str, Any]], **daemon: Any) -> dict[str, Any]:
    return {"daemon": {"version": "0", "pid": 1, "uptime_s": 1.0, "started_at": "t", "config": "c", "state_dir": "s",
                       "sockets": {}, "clients": [], "calls_total": 0, **daemon},
            "actors": actors, "tools": {}}


def actor(ident: str, workers: list[dict[str, Any]] | None) -> dict[str, Any]:
    details = {} if workers is None else {"workers": workers}
    return {"id": ident, "kind": ident.split("-")[0], "resource": "r", "state": "idle", "inbox_depth": 0,
            "idle_s_left": None, "restarts": 0, "details": details}


def test_status_lists_each_actors_workers_with_their_rss_and_the_totals() -> None:
    text = format_status(status(
        [actor("pcap-1", [{"pid": 11, "rss_bytes": 200 * 2**20, "role": "sharkd"},
                          {"pid": 12, "rss_bytes": None, "role": "sharkd"}]),
         actor("crash-2", [{"pid": 21, "rss_bytes": 300 * 2**20, "role": "crash"}]),
         actor("serial-3", None)],
        rss_bytes=45 * 2**20, workers=3, workers_rss_bytes=500 * 2**20))
    assert "memory: daemon rss 45.0 MB, 3 workers rss 500.0 MB" in text
    lines = text.splitlines()
    header = lines.index("workers (3):")
    assert lines[header + 1].split() == ["PID", "ROLE", "ACTOR", "RSS"]
    assert [line.split() for line in lines[header + 2:header + 5]] == [
        ["11", "sharkd", "pcap-1", "200.0", "MB"], ["12", "sharkd", "pcap-1", "-"],
        ["21", "crash", "crash-2", "300.0", "MB"]]


def test_status_without_workers_has_no_worker_table_and_an_old_daemon_shows_dashes() -> None:
    text = format_status(status([actor("serial-1", None)]))
    assert "workers (" not in text and "memory: daemon rss -, 0 workers rss -" in text


def test_status_shows_what_each_back_end_keeps_as_tables_sizes_and_ages_readable() -> None:
    indexes = [{"capture": "/c/a.pcap", "frames": 10, "disk_bytes": 3 * 2**20, "age_s": 7200, "in_use": False},
               {"capture": None, "frames": 5, "disk_bytes": 2**20, "age_s": 5, "in_use": True}]
    text = format_status({**status([]), "backends": {"pcap": {"indexes": indexes, "other": []}}})
    lines = text.splitlines()
    at = lines.index("pcap indexes (2):")
    assert [line.split() for line in lines[at + 1:at + 4]] == [
        ["CAPTURE", "FRAMES", "DISK_BYTES", "AGE_S", "IN_USE"], ["/c/a.pcap", "10", "3.0", "MB", "2h00m", "False"],
        ["-", "5", "1.0", "MB", "5.0s", "True"]]
    assert lines[at + 4:at + 6] == ["pcap other (0):", "  none"]


def test_workers_reads_rss_from_proc_and_leaves_absent_processes_out() -> None:
    found = system.workers((os.getpid(), "self"), (None, "gone"))
    assert found == [{"pid": os.getpid(), "rss_bytes": found[0]["rss_bytes"], "role": "self"}]
    assert found[0]["rss_bytes"] and found[0]["rss_bytes"] > 0


def record(outcome: str) -> CallRecord:
    return CallRecord(ts=0, client="t", tool="x", arguments={}, duration_ms=1, queue_ms=0, outcome=outcome,
                      code=None, bytes=1, truncated=False)


async def test_the_heap_is_trimmed_once_when_no_call_finished_for_the_quiet_time(autojump_clock: Any) -> None:
    trimmer = QuietTrimmer(quiet_s=2.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trimmer.run)
        await trio.sleep(10)
        assert trimmer.trims == 0  # nothing happened: nothing to give back
        trimmer.observe(record("started"))
        await trio.sleep(10)
        assert trimmer.trims == 0
        for _ in range(5):  # calls 1 s apart keep it waiting
            trimmer.observe(record("ok"))
            await trio.sleep(1)
        assert trimmer.trims == 0
        await trio.sleep(1.5)
        assert trimmer.trims == 1
        await trio.sleep(60)
        assert trimmer.trims == 1
        trimmer.observe(record("error"))
        await trio.sleep(2.5)
        assert trimmer.trims == 2
        nursery.cancel_scope.cancel()


def test_heap_helpers_take_effect_on_glibc_and_report_nothing_elsewhere() -> None:
    glibc = platform.libc_ver()[0] == "glibc"
    assert heap.configure() is glibc
    if not glibc:
        assert heap.trim() is False
        return
    # 64 MB of blocks under the mmap threshold land on the heap; freeing all but the last leaves a
    # free region below a live block, which only malloc_trim gives back: it must say it did.
    blocks = [bytearray(100 * 1024) for _ in range(640)]
    keep = blocks[-1]
    del blocks
    assert heap.trim() is True
    assert len(keep) == 100 * 1024


def test_settle_takes_what_lives_out_of_the_collectors_full_walks() -> None:
    """heap.settle() after the daemon's imports: a full collection then walks only what came after
    (measured in the daemon: 82 ms for one in the middle of a text search before, ~20 ms after)."""
    kept = [[n] for n in range(1000)]  # lists: always tracked (a dict of ints may not be)
    try:
        heap.settle()
        assert gc.get_freeze_count() >= len(kept)
        in_oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert not any(id(o) in in_oldest for o in kept)
        after = [[n] for n in range(10)]
        gc.collect(1)
        gc.collect(1)  # survivors of two collections reach the oldest generation
        assert any(id(o) in {id(x) for x in gc.get_objects(generation=2)} for o in after)
    finally:
        gc.unfreeze()
