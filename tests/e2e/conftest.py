"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.pcaps import PCAPS

SOURCE = PCAPS / "magma_gx_gy_combined_04.pcapng"
COPIES = 12  # ~35 MB: a filter pass takes long enough for another call to run beside it


@pytest.fixture(scope="session")
def bigger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SOURCE.exists():
        pytest.skip(f"{SOURCE} is absent (set DIAGD_TEST_PCAPS)")
    out = tmp_path_factory.mktemp("workers") / "bigger.pcapng"
    subprocess.run(["mergecap", "-a", "-w", str(out), *[str(SOURCE)] * COPIES], check=True, capture_output=True)
    return out
