"""Debug-only Python heap tracing: what grew in the daemon, by allocation traceback (issue 28).

Off unless the daemon is started with `DIAGD_TRACEMALLOC=N` (N: frames kept per traceback, 1-64;
`1` is enough to name a line, 8 names the caller that keeps it). Then the first `diagd status
--memory` starts `tracemalloc` and takes the baseline snapshot, and each later one (or the `memory`
field of `diagd status --memory --json`) shows the tracebacks whose live memory grew most since the
baseline and since the previous report. Tracing starts on that first request, not at start-up: a
warmed-up daemon's growth is what matters, and tracing the start-up imports (the MCP SDK, pydantic)
made the first call take minutes and each report as long. Tracing costs CPU and ~2x the traced
memory: a debugging aid, not for production.
"""

from __future__ import annotations

import os
import tracemalloc
from typing import Any

ENV = "DIAGD_TRACEMALLOC"
MAX_FRAMES = 64
TOP = 25

_baseline: tracemalloc.Snapshot | None = None
_previous: tracemalloc.Snapshot | None = None


def frames_from_env(environ: dict[str, str] | None = None) -> int:
    """Frames per traceback asked for by DIAGD_TRACEMALLOC (0: off; anything not a number: 1)."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip()
    if value in ("", "0", "off", "no", "false"):
        return 0
    try:
        return max(1, min(MAX_FRAMES, int(value)))
    except ValueError:
        return 1


def start_tracing() -> None:
    """Start tracing and take the baseline snapshot (the first report's)."""
    global _baseline, _previous
    tracemalloc.start(frames_from_env())
    _baseline = _previous = _snapshot()


def _snapshot() -> tracemalloc.Snapshot:
    # Leave out tracemalloc's own bookkeeping and the import machinery (modules loaded late are not growth).
    return tracemalloc.take_snapshot().filter_traces((
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
        tracemalloc.Filter(False, "<unknown>"),
    ))


def _growth(now: tracemalloc.Snapshot, then: tracemalloc.Snapshot, top: int) -> list[dict[str, Any]]:
    stats = [s for s in now.compare_to(then, "traceback") if s.size_diff > 0][:top]
    return [{"size_diff_bytes": s.size_diff, "count_diff": s.count_diff, "size_bytes": s.size, "count": s.count,
             "traceback": [f"{f.filename}:{f.lineno}" for f in reversed(s.traceback)]} for s in stats]


def report(top: int = TOP) -> dict[str, Any] | None:
    """Top growth since the baseline and since the previous report; None when DIAGD_TRACEMALLOC is off.
    The first one starts tracing (and reports nothing grown yet)."""
    global _previous
    if not frames_from_env():
        return None
    if not tracemalloc.is_tracing():
        start_tracing()
    now = _snapshot()
    baseline = _baseline or now
    previous = _previous or now
    current, peak = tracemalloc.get_traced_memory()
    out = {
        "frames": tracemalloc.get_traceback_limit(),
        "traced_bytes": current,
        "traced_peak_bytes": peak,
        "overhead_bytes": tracemalloc.get_tracemalloc_memory(),
        "total_growth_bytes": sum(s.size_diff for s in now.compare_to(baseline, "filename")),
        "since_baseline": _growth(now, baseline, top),
        "since_previous": _growth(now, previous, top),
    }
    _previous = now
    return out


def format_report(memory: dict[str, Any] | None) -> str:
    """`diagd status --memory` as text."""
    if memory is None:
        return (f"tracemalloc is off: start the daemon with {ENV}=8 (frames per traceback); the first "
                f"`diagd status --memory` then starts tracing, the later ones show what grew")
    mb = 2 ** 20
    lines = [f"traced {memory['traced_bytes'] / mb:.1f} MB (peak {memory['traced_peak_bytes'] / mb:.1f} MB, "
             f"tracemalloc's own {memory['overhead_bytes'] / mb:.1f} MB), {memory['frames']} frames per traceback; "
             f"growth since the baseline {memory['total_growth_bytes'] / mb:+.2f} MB"]
    for title, key in (("since the baseline", "since_baseline"), ("since the previous report", "since_previous")):
        lines.append(f"top growth {title}:")
        for s in memory[key]:
            lines.append(f"  {s['size_diff_bytes'] / 1024:+10.1f} kB {s['count_diff']:+7d} blocks "
                         f"(now {s['size_bytes'] / 1024:.1f} kB)")
            lines.extend(f"      {frame}" for frame in s["traceback"])
        if not memory[key]:
            lines.append("  nothing grew")
    return "\n".join(lines)
