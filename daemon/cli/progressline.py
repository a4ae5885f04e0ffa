"""`diagd call`'s progress line: one line on a terminal, redrawn in place (stdlib only).

Each report rewrites the line (`\\r`, erase to its end) as "⏳ loading capture 40% (12 s)", cut to
the terminal's width so it never wraps (a wrapped line cannot be redrawn with `\\r`). It is
cleared before anything else is written, so banners and errors start on a clean line. Only for a
terminal: on a pipe or a file nothing is drawn and no progress is even asked for.

Between reports a ticker thread redraws the last one each second, so the elapsed time keeps
counting while a back end has nothing new to say (a capture load reports only its start and end).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Protocol, TextIO

CLEAR = "\r\x1b[K"
DEFAULT_COLUMNS = 80  # when the terminal does not say its width


class Report(Protocol):
    """A progress report (the control protocol's `Progress` frame)."""

    @property
    def progress(self) -> float: ...
    @property
    def total(self) -> float | None: ...
    @property
    def message(self) -> str | None: ...


class ProgressLine:
    def __init__(self, out: TextIO, started: float | None = None, *, tick_s: float | None = None) -> None:
        self._out = out
        self._started = time.monotonic() if started is None else started
        self._tick_s = tick_s
        self._lock = threading.Lock()  # the ticker and the caller write the same line
        self._last: tuple[float, float | None, str | None] | None = None
        self._done = threading.Event()
        self._ticker: threading.Thread | None = None
        self.shown = False

    def update(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        with self._lock:
            self._last = (progress, total, message)
            self._draw()
        if self._tick_s is not None and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, args=(self._tick_s,), daemon=True)
            self._ticker.start()

    def _draw(self) -> None:
        if self._last is None:
            return
        progress, total, message = self._last
        text = f"⏳ {message or 'working'}"
        if total:
            text += f" {max(0.0, min(progress / total, 1.0)):.0%}"
        text += f" ({time.monotonic() - self._started:.0f} s)"
        self._out.write(CLEAR + text[:max(self._columns() - 1, 10)])
        self._out.flush()
        self.shown = True

    def _tick(self, every_s: float) -> None:
        while not self._done.wait(every_s):
            with self._lock:
                self._draw()

    def report(self, report: Report) -> None:
        self.update(report.progress, report.total, report.message)

    def clear(self) -> None:
        """Erase the line (and stop redrawing it): anything written next starts on a clean line."""
        self._done.set()
        with self._lock:
            self._last = None
            if self.shown:
                self._out.write(CLEAR)
                self._out.flush()
                self.shown = False

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self._out.fileno()).columns or DEFAULT_COLUMNS
        except (OSError, ValueError):
            return DEFAULT_COLUMNS


def for_stderr(visibility: str) -> ProgressLine | None:
    """A progress line on stderr when it is a terminal (and the banners are not turned off)."""
    if visibility == "off" or not sys.stderr.isatty():
        return None
    return ProgressLine(sys.stderr, tick_s=1.0)
