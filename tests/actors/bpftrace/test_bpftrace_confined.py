"""A bpftrace run as diagd starts it (the sandbox launcher and its deadline), without the daemon: it ends
by itself, its program and output are the user's, and only file helpers are refused where it cannot be
confined."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace

import pytest

from diagd.actors import sandbox
from diagd.actors.bpftrace.settings import (
    SELF_STOP_MARGIN_S,
    BpftraceSettings,
    check_confinement,
    file_helpers,
)
from diagd.actors.sandbox import standby
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace


@needs_bpftrace
@pytest.mark.parametrize("launch", ["cold", "standby"])
def test_a_run_nobody_stops_ends_by_itself_with_the_users_program_untouched(launch: str) -> None:
    ensure_tracefs()
    settings = BpftraceSettings(start_timeout_s=1.0)
    argv = settings.run_command('BEGIN { printf("start\\n"); } interval:ms:500 { @ticks = count(); }', "text", 1)
    assert argv[-1] == 'BEGIN { printf("start\\n"); } interval:ms:500 { @ticks = count(); }'
    if launch == "standby":  # the deadline reaches the watchdog the standby forked while it waited
        waiting = subprocess.Popen([*sandbox.launcher_prefix(), standby.STANDBY], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = waiting.communicate(json.dumps({"args": standby.request_of(argv), "env": dict(os.environ)}),
                                       timeout=60)
        done = subprocess.CompletedProcess(argv, waiting.returncode, out, err)
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    # the launcher's watchdog sent SIGINT at its deadline: bpftrace printed its maps and exited normally
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines[0] == "Attaching 2 probes..." and lines[1] == "start"
    assert lines[-1].startswith("@ticks:") and int(lines[-1].split(":")[1]) >= 2  # not before its 1 s timeout


def test_a_run_stops_itself_only_after_diagd_would_have_stopped_it() -> None:
    settings = BpftraceSettings(start_timeout_s=20.0)
    assert settings.self_stop_s(10.0) == 20.0 + 10.0 + SELF_STOP_MARGIN_S


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
