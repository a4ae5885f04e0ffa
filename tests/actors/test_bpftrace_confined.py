"""A bpftrace run as diagd starts it (the sandbox launcher + the self-exit probe), without the daemon:
it ends by itself after its timeout, its output is the user's, and only file helpers are refused where
it cannot be confined."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from diagd.actors._bpftrace_settings import (
    BpftraceSettings,
    check_confinement,
    file_helpers,
    with_self_exit,
)
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace


@needs_bpftrace
def test_a_run_nobody_stops_ends_by_itself_with_only_the_users_output() -> None:
    ensure_tracefs()
    argv = BpftraceSettings().run_command('BEGIN { printf("start\\n"); } interval:ms:500 { @ticks = count(); }',
                                          "text", 1)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    # bpftrace counts the self-exit probe; diagd subtracts it (SELF_EXIT_PROBES) when it reads this line
    assert lines[0] == "Attaching 3 probes..." and lines[1] == "start"
    # it ended on its own (exit status 0, maps printed), and not before its 1 s timeout (2 ticks a second)
    assert lines[-1].startswith("@ticks:") and int(lines[-1].split(":")[1]) >= 2


def test_the_self_exit_probe_follows_the_program_and_fires_after_timeout_plus_margin() -> None:
    assert with_self_exit("BEGIN { exit(); }  \n\n", 2.2) == "BEGIN { exit(); }\ninterval:s:5 { exit(); }\n"


@pytest.mark.parametrize(("program", "used"), [
    ('BEGIN { cat("/etc/shadow"); }', ["cat()"]),
    ('#include <linux/sched.h>\nBEGIN { }', ["#include"]),
    ('// cat("/x")\nBEGIN { printf("cat(%d)", 1); @concat = count(); }', []),
    ('/* #include <x> */ BEGIN { }', []),
])
def test_file_helpers_are_found_outside_comments_and_strings(program: str, used: list[str]) -> None:
    assert file_helpers(program) == used


def test_file_helpers_through_a_privileged_helper_are_refused_unless_allowed() -> None:
    helper = BpftraceSettings(privileged_helper="sudo -n")
    with pytest.raises(DiagdError) as refused:
        check_confinement(helper, 'BEGIN { cat("/etc/shadow"); }')
    assert refused.value.code == ErrorCode.PERMISSION_DENIED and "privileged_helper" in refused.value.message
    check_confinement(helper, "BEGIN { exit(); }")
    check_confinement(replace(helper, allow_unconfined=True), 'BEGIN { cat("/etc/shadow"); }')
