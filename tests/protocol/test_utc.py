"""protocol/utc.py: the one UTC timestamp format."""

from __future__ import annotations

from diagd.protocol import utc

T = 1_764_072_000.1239  # 2025-11-25T12:00:00.1239Z


def test_iso_to_the_second_or_to_truncated_decimals() -> None:
    assert utc.iso(T) == "2025-11-25T12:00:00Z"
    assert utc.iso(T, digits=3) == "2025-11-25T12:00:00.123Z"
    assert utc.iso().endswith("Z") and len(utc.iso()) == 20


def test_compact_is_the_same_instant_for_file_names() -> None:
    assert utc.compact(T) == "20251125T120000Z"
    assert utc.compact(T, digits=3) == "20251125T120000123Z"
