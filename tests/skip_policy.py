"""Skips may not turn CI green: under CI a skip is a failure unless its reason is allowed here.

A test that skips because a capture, the vmcore fixture, tshark, bpftrace or the Mermaid parser is
missing has not checked anything, and a run in which every real check skipped would otherwise pass.
Under CI (the `CI` variable set, as `.ci/run` does; or DIAGD_STRICT_SKIPS=1 anywhere) such a skip is
reported as a failure with its reason. Outside CI it stays a skip, so a developer without the corpus
can still run the rest. Every run ends with one line counting the skips by reason.

ALLOWED holds the few reasons that are facts of a machine, not gaps in its setup; each says why.
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest

# (pattern matched against the skip reason, why a CI machine may legitimately lack it)
ALLOWED: tuple[tuple[str, str], ...] = (
    (r"needs a kernel without kprobe_events", "a property of the running kernel, which CI cannot choose"),
    (r"the kernel has no Landlock", "a property of the running kernel; the tests without Landlock run anyway"),
)
_ALLOWED = [re.compile(pattern) for pattern, _why in ALLOWED]
REFUSED = "skipped under CI, which needs this check to run: "


def strict() -> bool:
    """True under CI (CI set to anything but '', '0' or 'false') or with DIAGD_STRICT_SKIPS=1."""
    if os.environ.get("DIAGD_STRICT_SKIPS", "") not in ("", "0"):
        return True
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def allowed(reason: str) -> bool:
    return any(pattern.search(reason) for pattern in _ALLOWED)


def skip_reason(report: pytest.TestReport) -> str | None:
    """The reason of a plain skip (not an xfail), or None."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def async_skip_reason(call: pytest.CallInfo[None]) -> str | None:
    """The reason an async test gave `pytest.skip`: pytest-trio 0.8 catches the Skipped inside the Trio
    run's exception group and raises a fresh `pytest.skip()` without it; the original stays in that
    fresh exception's context (the group it was handling), whose single leaf is the real Skipped."""
    excinfo = call.excinfo
    if excinfo is None or not isinstance(excinfo.value, pytest.skip.Exception) or excinfo.value.msg:
        return None
    queue: list[BaseException] = [c] if (c := excinfo.value.__context__) is not None else []
    while queue:
        exc = queue.pop()
        if isinstance(exc, BaseExceptionGroup):
            queue.extend(exc.exceptions)
        elif isinstance(exc, pytest.skip.Exception) and exc.msg:
            return exc.msg
    return None


class SkipPolicy:
    """The pytest plugin: counts skips by reason and, when strict, fails the ones not allowed."""

    def __init__(self, strict_mode: bool) -> None:
        self.strict = strict_mode
        self.reasons: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
        outcome = yield
        report: pytest.TestReport = outcome.get_result()
        reason = skip_reason(report)
        if reason is None:
            return
        if (recovered := async_skip_reason(call)) is not None:
            reason = recovered
            if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
                report.longrepr = (report.longrepr[0], report.longrepr[1], f"Skipped: {reason}")
        if self.strict and not allowed(reason):
            report.outcome = "failed"
            report.longrepr = (f"{REFUSED}{reason}\n"
                               "(install what it needs — ./scripts/setup.sh test — or, if this machine can "
                               "never have it, add the reason to ALLOWED in tests/skip_policy.py with why)")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Counted from the reports, which under pytest-xdist are the ones its controller receives (the
        workers mark the reports; the controller prints the summary)."""
        if (reason := skip_reason(report)) is not None:
            self.reasons[reason] += 1
        elif report.failed and isinstance(report.longrepr, str) and report.longrepr.startswith(REFUSED):
            reason = report.longrepr.removeprefix(REFUSED).split("\n", 1)[0]
            self.reasons[reason] += 1
            self.refused[reason] += 1

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        total = sum(self.reasons.values())
        if not total:
            terminalreporter.write_line("skips: none")
            return
        parts = "; ".join(f"{count}× {reason}" for reason, count in self.reasons.most_common())
        mode = f", {sum(self.refused.values())} failed as not allowed under CI" if self.refused else ""
        terminalreporter.write_line(f"skips: {total}{mode} — {parts}")
