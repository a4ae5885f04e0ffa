"""Where the suite's time goes: every run ends with its wall time and the ten slowest test modules
(setup, call and teardown of their tests added up, fixtures included), so a module that grows slow is
seen in every CI log, not found later."""

from __future__ import annotations

import time
from collections import Counter

import pytest

SHOWN = 10


class ModuleTimes:
    def __init__(self) -> None:
        self.started = time.monotonic()
        self.by_module: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.by_module[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        wall = time.monotonic() - self.started
        slowest = self.by_module.most_common(SHOWN)
        terminalreporter.write_line(f"suite wall time: {wall:.0f} s; slowest modules: "
                                    + "; ".join(f"{name} {seconds:.0f} s" for name, seconds in slowest))
