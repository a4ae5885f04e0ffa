"""Where the real captures of the test corpus are: the cache tests/support/corpus_cache.py fills (from
tests/corpus.toml, every sha256 checked; `scripts/setup.sh test` runs it). Tests skip with a clear
reason when a capture is absent. DIAGD_TEST_PCAPS (and DIAGD_TEST_PCAPS_EXTRA) name other folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.corpus_cache import cache_dir

PCAPS = Path(os.environ.get("DIAGD_TEST_PCAPS") or cache_dir() / "pcaps")
# The second corpus (more 5GC captures), beside the first: tests over "every capture" read both.
PCAPS_EXTRA = Path(os.environ.get("DIAGD_TEST_PCAPS_EXTRA") or PCAPS.with_name("pcaps-extra"))
FILL = "scripts/setup.sh test, or python -m tests.support.corpus_cache fill --from DIR"


def corpus() -> list[Path]:
    """Every capture of both corpora that is there, sorted (empty if neither is)."""
    return sorted(p for d in (PCAPS, PCAPS_EXTRA) if d.is_dir() for p in d.glob("*.pcap*"))


def pcap(name: str) -> str:
    path = PCAPS / name
    if not path.exists():
        pytest.skip(f"real capture {name} not found in {PCAPS} (fill the cache: {FILL})")
    return str(path)
