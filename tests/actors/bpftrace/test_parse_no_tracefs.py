"""actors/bpftrace/parse.py on what bpftrace 0.17 really printed without tracefs (a private mount namespace
with /sys/kernel/tracing unmounted, tests/support/bpftrace_outputs_no_tracefs.py) and for a hardware
probe the kernel refused, two unsafe builtins and the non-root run, plus the kernel-release rule of the
RLIMIT_MEMLOCK notice and the wording of the root and sudo refusals. The expected
values are written out here: bpftrace's own lines as it printed them, and what diagd documents for
each (the tracefs refusal and its fix, the notices, the attach failure). Fast: run per mutant."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from diagd.actors import system
from diagd.actors.bpftrace import parse
from diagd.protocol.errors import ErrorCode
from tests.support import bpftrace_outputs
from tests.support import bpftrace_outputs_no_tracefs as recorded
from tests.support.bpftrace_harness import needs_bpftrace

NOENT = os.strerror(errno.ENOENT)  # "No such file or directory"
MOUNT_FIX = "sudo mount -t tracefs nodev /sys/kernel/tracing"  # as scripts/setup.sh mounts it
MEMLOCK_LINE = ('ERROR: Unknown error -1: couldn\'t set RLIMIT_MEMLOCK for bpftrace. If your program is not '
                'loading, you can try "ulimit -l 8192" to fix the problem')
MEMLOCK_NOTICE = ("bpftrace could not raise RLIMIT_MEMLOCK (harmless: this kernel charges BPF memory to the "
                  "cgroup)")
FILTER_FUNCTIONS = "/sys/kernel/tracing/available_filter_functions"
TRACEABLE_NOTICE = (f"bpftrace cannot read {FILTER_FUNCTIONS} ({NOENT}): kprobe names are not checked before "
                    "attaching")
KPROBE = "kprobe:do_nanosleep { exit(); }"
NOT_TRACEABLE = parse.Diagnostic(
    "warning", 'do_nanosleep is not traceable (either non-existing, inlined, or marked as "notrace"); attaching '
    "to it will likely fail", 1, 1, 20, KPROBE)
NO_KPROBE_EVENTS = " (this kernel has no kprobe_events: kprobes cannot be used here; tracepoints can)"


class Release(NamedTuple):
    release: str


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    if recorded.UNSHARE is None:
        pytest.skip("unshare is not installed")
    return recorded.outputs()


def kernel(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    monkeypatch.setattr(parse.os, "uname", lambda: Release(release))


def kprobe_events(monkeypatch: pytest.MonkeyPatch, present: bool) -> None:
    real = os.path.exists

    def exists(path: Any) -> bool:
        return present if str(path) == "/sys/kernel/tracing/kprobe_events" else real(path)

    monkeypatch.setattr(parse.os.path, "exists", exists)


@pytest.mark.parametrize(("release", "charged"), [
    ("6.18.44-fc-v1300", True), ("5.11.0", True), ("5.12.3", True), ("6.0.0", True), ("5.10.220-1", False),
    ("5.9.0", False), ("4.19.0", False), ("4.20.1", False), ("3.10.0-1160.el7.x86_64", False), ("6", False)])
def test_memlock_is_a_notice_from_linux_5_11_on(release: str, charged: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux 5.11 charges BPF memory to the memory cgroup: RLIMIT_MEMLOCK stops mattering there. A release
    the check cannot read (no major.minor) is not taken for a new kernel."""
    kernel(monkeypatch, release)
    report = parse.parse_stderr(MEMLOCK_LINE + "\nsomething else\n")
    assert report.other == ["something else"] and not report.warnings
    if charged:
        assert report.notices == [MEMLOCK_NOTICE] and report.errors == []
    else:
        assert report.notices == [] and report.errors == [parse.Diagnostic("error", MEMLOCK_LINE[len("ERROR: "):])]


@needs_bpftrace
def test_the_traceable_functions_notice_runs_into_the_next_message(runs: dict[str, dict[str, Any]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stderr = runs["dry_run_kprobe"]["stderr"]
    glued = f"Error while reading traceable functions from {FILTER_FUNCTIONS}: {NOENT}{MEMLOCK_LINE}\n"
    assert stderr == glued + KPROBE.join(["stdin:1:1-20: WARNING: " + NOT_TRACEABLE.message + "\n", "\n"]) + \
        "~" * 19 + "\n"
    for release, memlock_is_notice in (("6.18.0", True), ("5.4.0", False)):
        kernel(monkeypatch, release)
        for text in (stderr, stderr.rstrip("\n")):
            report = parse.parse_stderr(text)
            assert report.warnings == [NOT_TRACEABLE] and report.other == [], release
            if memlock_is_notice:
                assert sorted(report.notices) == sorted([MEMLOCK_NOTICE, TRACEABLE_NOTICE]) and not report.errors
            else:  # the notice ends where the ERROR the kernel still means begins
                assert report.notices == [TRACEABLE_NOTICE]
                assert report.errors == [parse.Diagnostic("error", MEMLOCK_LINE[len("ERROR: "):])]
    # Where it ends a line, or the text, or runs into a WARNING, it ends there too.
    kernel(monkeypatch, "6.18.0")
    notice = f"Error while reading traceable functions from {FILTER_FUNCTIONS}: {NOENT}"
    rest: list[object]
    for text, rest in ((notice, []), (notice + "\nlater\n", ["later"]),
                       (notice + "WARNING: w\n", [parse.Diagnostic("warning", "w")]),
                       (notice + "  ERROR: e", [parse.Diagnostic("error", "e")])):
        report = parse.parse_stderr(text)
        assert report.notices == [TRACEABLE_NOTICE], text
        assert [*report.errors, *report.warnings, *report.other] == rest, text


@needs_bpftrace
def test_listing_without_tracefs_is_an_unlocated_warning(runs: dict[str, dict[str, Any]]) -> None:
    run = runs["list_tracepoints"]
    assert run["returncode"] == 0 and run["stdout"] == ""
    report = parse.parse_stderr(run["stderr"])
    assert report.warnings == [parse.Diagnostic(
        "warning", f"Could not read symbols from /sys/kernel/tracing/available_events: {NOENT}")]
    assert report.errors == [] and report.other == [] and report.notices == []
    assert report.text() == ""


@needs_bpftrace
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_tracepoint_without_tracefs_asks_for_the_mount(fmt: str, runs: dict[str, dict[str, Any]],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run = runs[f"tracepoint_{fmt}"]
    assert run["returncode"] == 1 and run["stdout"] == ""
    kernel(monkeypatch, "6.18.0")
    report = parse.parse_stderr(run["stderr"])
    where = "line 1, column 1: tracepoint not found: sched:sched_switch"
    assert [str(e) for e in report.errors] == [where] and report.errors[0].source == \
        "tracepoint:sched:sched_switch { exit(); }" and report.errors[0].end_column == 30
    # As it was recorded: no tracefs anywhere.
    monkeypatch.setattr(system, "tracefs_dir", lambda: None)
    err = parse.classify_failure(report, run["returncode"], before_attach=True)
    assert err.code == ErrorCode.BACKEND_UNAVAILABLE
    assert err.message == ("tracefs is not mounted (no /sys/kernel/tracing/available_events), so bpftrace cannot "
                           f"find any tracepoint: fix as root with `{MOUNT_FIX}` (diagd doctor checks it)")
    assert err.details == {"fix": MOUNT_FIX, "exit_code": 1, "stderr": where}
    assert parse.tracefs_fix() == MOUNT_FIX
    listed = parse.tracefs_error("nothing can be listed", filter="sched:*")
    assert listed.code == ErrorCode.BACKEND_UNAVAILABLE and listed.details == {"fix": MOUNT_FIX, "filter": "sched:*"}
    assert listed.message == ("tracefs is not mounted (no /sys/kernel/tracing/available_events), so nothing can be "
                              f"listed: fix as root with `{MOUNT_FIX}` (diagd doctor checks it)")
    # With tracefs mounted the same words mean the tracepoint does not exist: the program is wrong.
    monkeypatch.setattr(system, "tracefs_dir", lambda: Path("/sys/kernel/tracing"))
    err = parse.classify_failure(report, run["returncode"], before_attach=True)
    assert err.code == ErrorCode.INVALID_ARGUMENT and err.message == f"bpftrace rejected the program: {where}"


@needs_bpftrace
@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("has_kprobe_events", [False, True])
def test_a_kprobe_without_kprobe_events_cannot_attach(fmt: str, has_kprobe_events: bool,
                                                      runs: dict[str, dict[str, Any]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    run = runs[f"kprobe_{fmt}"]
    assert run["returncode"] == 255
    assert parse.attach_count(run["stdout"].splitlines()[0], fmt) == 1  # announced, then refused
    kernel(monkeypatch, "6.18.0")
    kprobe_events(monkeypatch, has_kprobe_events)
    report = parse.parse_stderr(run["stderr"])
    why = f"create_probe_event: open(/sys/kernel/tracing/kprobe_events): {NOENT}"
    assert report.other == [why] and report.warnings == [NOT_TRACEABLE]
    for before_attach in (False, True):
        err = parse.classify_failure(report, run["returncode"], before_attach=before_attach)
        assert err.code == ErrorCode.BACKEND_UNAVAILABLE
        assert err.message == f"bpftrace could not attach kprobe:do_nanosleep: {why}" + \
            ("" if has_kprobe_events else NO_KPROBE_EVENTS)
        assert err.details == {"probe": "kprobe:do_nanosleep", "warnings": [
            f"line 1, column 1: {NOT_TRACEABLE.message}"], "exit_code": 255,
            "stderr": "Error attaching probe: 'kprobe:do_nanosleep'\n" + why}


@needs_bpftrace
def test_a_hardware_probe_the_kernel_refuses_names_the_probe(runs: dict[str, dict[str, Any]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """bpftrace 0.17 does not quote a hardware probe's name in `Error attaching probe: NAME`."""
    run = runs["hardware"]
    if run["returncode"] == 0:
        pytest.skip("this machine has a PMU: the hardware probe attached")
    assert run["stdout"] == "Attaching 1 probe...\n"
    kernel(monkeypatch, "6.18.0")
    kprobe_events(monkeypatch, False)  # the kprobe_events hint is for kprobes only
    report = parse.parse_stderr(run["stderr"])
    why = f"perf_event_open failed: {NOENT}"
    assert report.other == [why]
    err = parse.classify_failure(report, run["returncode"], before_attach=False, doing="while running")
    assert err.code == ErrorCode.BACKEND_UNAVAILABLE
    assert err.message == f"bpftrace could not attach hardware:cpu-cycles:1000000: {why}"
    assert err.details == {"probe": "hardware:cpu-cycles:1000000", "warnings": [], "exit_code": 255,
                           "stderr": "Error attaching probe: hardware:cpu-cycles:1000000\n" + why}
    # Without bpftrace's line before it, the ERROR itself says why.
    alone = parse.parse_stderr("ERROR: Error attaching probe: 'kprobe:f'\n")
    err = parse.classify_failure(alone, 255, before_attach=False)
    assert err.message == "bpftrace could not attach kprobe:f: Error attaching probe: 'kprobe:f'"
    assert err.details["probe"] == "kprobe:f" and err.details["warnings"] == []


def test_a_located_diagnostic_cut_before_its_underline_keeps_no_quote() -> None:
    """The quoted line is bpftrace's only with the underline after it (stderr read before bpftrace
    finished writing): without it the line is just another line."""
    cut = "stdin:1:1-20: ERROR: boom\nkprobe:do_nanosleep { exit(); }"
    report = parse.parse_stderr(cut)
    assert report.errors == [parse.Diagnostic("error", "boom", 1, 1, 20)]
    assert report.other == ["kprobe:do_nanosleep { exit(); }"]
    report = parse.parse_stderr("stdin:2:3: WARNING: w")
    assert report.warnings == [parse.Diagnostic("warning", "w", 2, 3)] and report.other == []
    report = parse.parse_stderr("stdin:2:3: WARNING: w\n  x = ;\n  ~\nafter  \n  indented")
    assert report.warnings == [parse.Diagnostic("warning", "w", 2, 3, None, "  x = ;")]
    assert report.other == ["after", "  indented"]  # trailing blanks go, leading ones stay


def test_fatal_lines_are_errors_and_long_stderr_keeps_its_end() -> None:
    report = parse.parse_stderr("FATAL: it broke\nERROR: too\n")
    assert report.errors == [parse.Diagnostic("error", "it broke"), parse.Diagnostic("error", "too")]
    lines = [f"line {n:05d}" for n in range(1000)]  # 10 characters a line: 10,999 joined
    err = parse.classify_failure(parse.parse_stderr("\n".join(lines)), 1, before_attach=True)
    assert err.details["stderr"] == "\n".join(lines)[-4000:] and len(err.details["stderr"]) == 4000
    assert err.details["stderr"].endswith("line 00999") and err.message.endswith("line 00999")


@needs_bpftrace
def test_an_attach_failure_says_why_with_every_line_bpftrace_printed_before_it(
        runs: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    """`-v` prints its steps on stderr: each line before the ERROR is part of why, joined with "; "."""
    run = runs["verbose_kprobe"]
    kernel(monkeypatch, "6.18.0")
    kprobe_events(monkeypatch, False)
    report = parse.parse_stderr(run["stderr"])
    steps = ["INFO: node count: 5", "Attaching kprobe:do_nanosleep",
             f"create_probe_event: open(/sys/kernel/tracing/kprobe_events): {NOENT}"]
    assert report.other == steps
    err = parse.classify_failure(report, run["returncode"], before_attach=False)
    assert err.message == f"bpftrace could not attach kprobe:do_nanosleep: {'; '.join(steps)}{NO_KPROBE_EVENTS}"


@needs_bpftrace
def test_every_unsafe_builtin_is_named_once_sorted(runs: dict[str, dict[str, Any]],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run = runs["two_unsafe"]
    kernel(monkeypatch, "6.18.0")
    report = parse.parse_stderr(run["stderr"])
    err = parse.classify_failure(report, run["returncode"], before_attach=True)
    assert err.code == ErrorCode.PERMISSION_DENIED
    assert err.message == ("the program uses unsafe builtin(s) signal, system(), refused: set [bpftrace] "
                           "allow_unsafe = true to allow them")
    assert err.details["unsafe"] == ["signal", "system"] and len(err.details["errors"]) == 3


@needs_bpftrace
def test_the_root_and_sudo_refusals_say_what_to_do() -> None:
    nobody = bpftrace_outputs.outputs()[bpftrace_outputs.AS_NOBODY]["text"]
    err = parse.classify_failure(parse.parse_stderr(nobody["stderr"]), nobody["returncode"], before_attach=True)
    assert err.message == ("bpftrace 0.17 runs only as root (euid 0; CAP_BPF+CAP_PERFMON are not enough for this "
                           "version): run diagd as root or set [bpftrace] privileged_helper = \"sudo -n\" with a "
                           "NOPASSWD sudoers rule for bpftrace")
    # sudo is not installed here: its refusals as sudo prints them.
    for said in ("sudo: a password is required", "sudo: a terminal is required to read the password; either use "
                 "the -S option to read from standard input or configure an askpass helper",
                 "Sorry, user nobody is not allowed to execute '/usr/bin/bpftrace' as root on host.\n"
                 "sudo: nobody is not allowed to run sudo on host."):
        err = parse.classify_failure(parse.parse_stderr(said + "\n"), 1, before_attach=True)
        assert err.code == ErrorCode.PERMISSION_DENIED, said
        assert err.message == ("the privileged helper refused to run bpftrace without a password: add a NOPASSWD "
                               "sudoers rule for bpftrace (diagd never answers prompts)"), said
