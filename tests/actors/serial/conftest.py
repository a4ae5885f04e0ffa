"""Fixtures of the serial unit tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def pty_slave() -> Iterator[str]:
    """The path of a fresh pseudo-terminal's slave (its master held open for the test)."""
    master, slave = os.openpty()
    try:
        yield os.ttyname(slave)
    finally:
        os.close(slave)
        os.close(master)
