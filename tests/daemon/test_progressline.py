"""`diagd call`'s progress line: redrawn in place, cut to the terminal, cleared without a trace."""

from __future__ import annotations

import io
import time

from diagd.daemon.cli.progressline import CLEAR, ProgressLine


def test_each_report_redraws_the_line_with_its_percentage_and_elapsed_seconds() -> None:
    out = io.StringIO()
    line = ProgressLine(out, started=time.monotonic() - 12.2)
    line.update(2, 5, "loading capture")
    line.update(7.5, None, "waiting for bpftrace")
    assert out.getvalue() == f"{CLEAR}⏳ loading capture 40% (12 s){CLEAR}⏳ waiting for bpftrace (12 s)"


def test_clear_erases_a_shown_line_once_and_nothing_when_none_was_shown() -> None:
    out = io.StringIO()
    line = ProgressLine(out)
    line.clear()
    assert out.getvalue() == ""
    line.update(1, 1, None)
    line.clear()
    line.clear()
    assert out.getvalue() == f"{CLEAR}⏳ working 100% (0 s){CLEAR}"


def test_a_long_message_is_cut_so_the_line_never_wraps() -> None:
    out = io.StringIO()  # no terminal: 80 columns assumed
    ProgressLine(out).update(0, 1, "x" * 500)
    assert len(out.getvalue()) == len(CLEAR) + 79


def test_the_ticker_keeps_the_elapsed_time_counting_between_reports_and_stops_at_clear() -> None:
    out = io.StringIO()
    line = ProgressLine(out, tick_s=0.01)
    line.update(0, 1, "loading capture")
    deadline = time.monotonic() + 10
    while out.getvalue().count("⏳ loading capture 0%") < 3:  # redrawn without a new report
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.01)
    line.clear()
    assert out.getvalue().endswith(CLEAR)
    after = out.getvalue()
    time.sleep(0.05)
    assert out.getvalue() == after  # nothing drawn after the line was cleared
