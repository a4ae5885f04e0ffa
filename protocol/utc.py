"""The one UTC timestamp format of every answer, record and file name diagd writes.

`iso(ts)` is "2026-11-25T12:00:00Z" (`digits` adds a truncated fraction: ".123Z"); `compact(ts)` the
same instant for file names, "20261125T120000Z" ("20261125T120000123Z"). Stdlib only.
"""

from __future__ import annotations

import time


def _fraction(ts: float, digits: int) -> str:
    return f"{int(ts % 1 * 10**digits):0{digits}d}" if digits else ""


def iso(ts: float | None = None, *, digits: int = 0) -> str:
    """`ts` (default: now) as ISO 8601 UTC, to the second or to `digits` decimals."""
    ts = time.time() if ts is None else ts
    fraction = _fraction(ts, digits)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + (f".{fraction}" if fraction else "") + "Z"


def compact(ts: float | None = None, *, digits: int = 0) -> str:
    """`ts` (default: now) for a file name: no separators, `digits` decimals run on after the seconds."""
    ts = time.time() if ts is None else ts
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(ts)) + _fraction(ts, digits) + "Z"
