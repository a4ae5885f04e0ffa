"""Where the shared real captures live; tests skip with a clear reason when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _find() -> Path:
    if override := os.environ.get("DIAGD_TEST_PCAPS"):
        return Path(override)
    beside_checkout = Path(__file__).resolve().parents[2] / "shared" / "pcaps"
    for candidate in (beside_checkout, Path("/work/shared/pcaps")):
        if candidate.is_dir():
            return candidate
    return beside_checkout


PCAPS = _find()
# The second corpus (more 5GC captures), beside the first: tests over "every capture" read both.
PCAPS_EXTRA = Path(os.environ.get("DIAGD_TEST_PCAPS_EXTRA") or PCAPS.with_name("pcaps-extra"))


def corpus() -> list[Path]:
    """Every capture of both corpora that is there, sorted (empty if neither is)."""
    return sorted(p for d in (PCAPS, PCAPS_EXTRA) if d.is_dir() for p in d.glob("*.pcap*"))


def pcap(name: str) -> str:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS} (set DIAGD_TEST_PCAPS to the folder of "
                    "shared/pcaps)")
    return str(path)
