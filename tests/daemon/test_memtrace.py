"""The debug-only heap tracing behind `diagd status --memory` (DIAGD_TRACEMALLOC, issue 28)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest

from diagd.daemon import memtrace


@pytest.fixture
def tracing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(memtrace.ENV, "4")
    try:
        yield
    finally:
        tracemalloc.stop()


def test_off_unless_the_environment_asks() -> None:
    assert memtrace.frames_from_env({}) == 0
    assert memtrace.frames_from_env({memtrace.ENV: "0"}) == 0
    assert memtrace.frames_from_env({memtrace.ENV: "8"}) == 8
    assert memtrace.frames_from_env({memtrace.ENV: "1000"}) == memtrace.MAX_FRAMES
    assert memtrace.frames_from_env({memtrace.ENV: "yes"}) == 1
    assert "DIAGD_TRACEMALLOC" in memtrace.format_report(None)


def test_the_first_report_starts_tracing_and_later_ones_name_what_grew(tracing: None) -> None:
    first = memtrace.report()
    assert first is not None and tracemalloc.is_tracing() and first["frames"] == 4
    kept = [bytearray(1000) for _ in range(2000)]  # ~2 MB that stays
    second = memtrace.report()
    assert second is not None
    top = second["since_baseline"][0]
    assert top["size_diff_bytes"] >= 2_000_000 and top["count_diff"] >= 2000
    assert any("test_memtrace.py" in frame for frame in top["traceback"])
    assert second["since_previous"][0]["traceback"] == top["traceback"]
    third = memtrace.report()  # nothing new since the previous report
    assert third is not None and all(s["size_diff_bytes"] < 100_000 for s in third["since_previous"])
    assert len(kept) == 2000
    text = memtrace.format_report(third)
    assert "top growth since the baseline" in text and "test_memtrace.py" in text
