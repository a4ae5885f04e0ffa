"""Where the shared real captures live; tests skip with a clear reason when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PCAPS = Path(os.environ.get("DIAGD_TEST_PCAPS", Path(__file__).resolve().parents[2] / "shared" / "pcaps"))


def pcap(name: str) -> str:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS} (set DIAGD_TEST_PCAPS to the folder of "
                    "shared/pcaps)")
    return str(path)
