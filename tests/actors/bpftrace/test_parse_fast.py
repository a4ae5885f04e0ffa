"""actors/bpftrace/parse.py on what bpftrace really printed (tests/support/bpftrace_outputs.py: each program
run once with `-f text` and `-f json`, cached), compared with a reading of the same output written here:
the JSON run's `attached_probes` event for the text run's announcement, `json.loads` for events, and for
stderr a line reader of its own whose locations are checked against the program (the quoted line is the
program's line, the `~` underline spans [column, end_column)). Fast: the mutation gate runs it per mutant."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.bpftrace import parse
from diagd.protocol.errors import ErrorCode
from tests.support import bpftrace_outputs as recorded
from tests.support.bpftrace_harness import needs_bpftrace

pytestmark = needs_bpftrace

MEMLOCK = "couldn't set RLIMIT_MEMLOCK for bpftrace"
# Probe blocks in each program that runs (counted by hand from PROGRAMS: what "Attaching N" must say).
PROBES = {"one_probe": 1, "two_probes": 2, "printing": 1, "three_probes": 3, "not_traceable": 1}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, dict[str, Any]]]:
    return recorded.outputs()


def kernel_charges_cgroup() -> bool:
    """Linux 5.11 and later charge BPF memory to the cgroup: the RLIMIT_MEMLOCK error is harmless."""
    major, minor = (int(p) for p in re.findall(r"\d+", os.uname().release)[:2])
    return (major, minor) >= (5, 11)


def read_stderr(text: str) -> dict[str, list[Any]]:
    """bpftrace 0.17's stderr, read line by line: `FILE:L:C[-E]: LEVEL: message`, then the quoted
    program line and its underline; `ERROR: `/`WARNING: ` lines; the RLIMIT_MEMLOCK line; the rest."""
    found: dict[str, list[Any]] = {"errors": [], "warnings": [], "memlock": [], "other": []}
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line == recorded.MARKER:
            continue
        if MEMLOCK in line:
            found["memlock"].append(line)
            continue
        for level in ("ERROR", "WARNING"):
            where, sep, message = line.partition(f": {level}: ")
            if sep and where.count(":") >= 2 and " " not in where:
                _, at, span = where.rsplit(":", 2)
                column, _, end = span.partition("-")
                source, underline = lines[i], lines[i + 1]
                i += 2
                start = len(underline) - len(underline.lstrip(" \t"))
                found["errors" if level == "ERROR" else "warnings"].append(
                    {"message": message, "line": int(at), "column": int(column),
                     "end_column": int(end) if end else None, "source": source,
                     "underline": (start, underline.count("~"))})
                break
            if line.startswith(f"{level}: "):
                found["errors" if level == "ERROR" else "warnings"].append({"message": line[len(level) + 2:]})
                break
        else:
            found["other"].append(line)
    return found


def diagnostic(level: str, item: dict[str, Any]) -> dict[str, Any]:
    return {"level": level, **{k: v for k, v in item.items() if k != "underline" and v is not None}}


def test_every_run_has_its_recorded_outcome(runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    for name, (_, succeeds) in recorded.PROGRAMS.items():
        for fmt in ("text", "json"):
            assert (runs[name][fmt]["returncode"] == 0) == succeeds or name == "not_traceable", (name, fmt)


def test_attach_announcements_agree_with_the_json_run(runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    for name, probes in PROBES.items():
        text, js = runs[name]["text"]["stdout"].splitlines(), runs[name]["json"]["stdout"].splitlines()
        announced = json.loads(js[0])
        assert announced == {"type": "attached_probes", "data": {"probes": probes}}, name
        assert text[0] == f"Attaching {probes} probe{'s' if probes > 1 else ''}...", name
        assert parse.attach_count(text[0], "text") == probes == parse.attach_count(js[0], "json"), name
        assert parse.attach_count(js[0], "text") is None and parse.attach_count(text[0], "json") is None
        for line in text[1:]:
            assert parse.attach_count(line, "text") is None, (name, line)
        for line in js[1:]:
            assert parse.attach_count(line, "json") is None, (name, line)
    # The JSON announcement must be an object with a count: anything else is no announcement.
    assert parse.attach_count('{"type": "attached_probes", "data": 3}', "json") is None
    assert parse.attach_count('{"type": "attached_probes", "data": {}}', "json") == 0
    assert parse.attach_count("Attaching 2 probes... more", "text") is None


def test_events_read_as_json_loads_reads_them(runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    seen = 0
    for name in recorded.PROGRAMS:
        for line in runs[name]["json"]["stdout"].splitlines():
            if line.strip():
                seen += 1
                assert parse.parse_json_line(line) == json.loads(line), (name, line)
        for line in runs[name]["text"]["stdout"].splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                value = None
            expected = value if isinstance(value, dict) else {"type": "text", "data": line}
            assert parse.parse_json_line(line) == expected, (name, line)
    assert seen >= 10
    assert parse.parse_json_line("5") == {"type": "text", "data": "5"}
    assert parse.parse_json_line('["a"]') == {"type": "text", "data": '["a"]'}


def test_stderr_diagnostics_agree_with_a_line_reading(runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    located = 0
    for name, (program, _) in recorded.PROGRAMS.items():
        for fmt in ("text", "json"):
            stderr = runs[name][fmt]["stderr"]
            report = parse.parse_stderr(stderr)
            theirs = read_stderr(stderr)
            assert parse.parse_stderr(stderr.rstrip("\n")) == report, name  # the last newline changes nothing
            assert [d.to_json() for d in report.errors] == [diagnostic("error", e) for e in theirs["errors"]], name
            assert [d.to_json() for d in report.warnings] == \
                [diagnostic("warning", w) for w in theirs["warnings"]], name
            assert report.other == theirs["other"], name
            for item in theirs["errors"] + theirs["warnings"]:
                if "line" in item:  # where bpftrace points is where the program has it
                    located += 1
                    assert item["source"] == program.split("\n")[item["line"] - 1], (name, item)
                    assert item["underline"] == (item["column"] - 1, item["end_column"] - item["column"]), item
            if kernel_charges_cgroup():
                assert len(report.notices) == len(theirs["memlock"]), name
                assert all("RLIMIT_MEMLOCK" in n and "harmless" in n for n in report.notices)
            else:
                assert not report.notices and len(report.errors) >= len(theirs["memlock"])
            assert report.text() == "\n".join([*(str(e) for e in report.errors), *report.other])
    assert located >= 10


def test_located_diagnostics_print_where_they_are() -> None:
    diag = parse.Diagnostic("error", "syntax error", 2, 5, 7, "  @x = ;")
    assert str(diag) == "line 2, column 5: syntax error"
    assert str(parse.Diagnostic("warning", "w")) == "w"
    assert parse.Diagnostic("warning", "w").to_json() == {"level": "warning", "message": "w"}


def expect_rejection(run: dict[str, Any], theirs: dict[str, list[Any]]) -> None:
    err = parse.classify_failure(parse.parse_stderr(run["stderr"]), run["returncode"], before_attach=True)
    first = next(e for e in theirs["errors"] if "line" in e)
    where = f"line {first['line']}, column {first['column']}: {first['message']}"
    assert err.code == ErrorCode.INVALID_ARGUMENT
    assert err.message == f"bpftrace rejected the program: {where}"
    report = parse.parse_stderr(run["stderr"])
    assert err.details == {"line": first["line"], "column": first["column"], "end_column": first["end_column"],
                           "source": first["source"], "errors": [diagnostic("error", e) for e in theirs["errors"]],
                           "exit_code": run["returncode"], "stderr": report.text()[-4000:]}
    later = parse.classify_failure(report, run["returncode"], before_attach=False, doing="while running")
    everything = "\n".join([*(e["message"] for e in theirs["errors"]), *theirs["other"]])
    assert later.code == ErrorCode.BACKEND_UNAVAILABLE
    assert later.message == f"bpftrace failed while running: {everything.strip()}"


def test_refusals_become_the_documented_errors(runs: dict[str, dict[str, dict[str, Any]]]) -> None:
    tracefs = Path("/sys/kernel/tracing/available_events").exists()
    for name in ("syntax", "end_of_input", "unknown_function", "two_errors", *(("no_tracepoint",) if tracefs else ())):
        for fmt in ("text", "json"):
            expect_rejection(runs[name][fmt], read_stderr(runs[name][fmt]["stderr"]))
    for fmt in ("text", "json"):
        run = runs["unsafe"][fmt]
        theirs = read_stderr(run["stderr"])
        err = parse.classify_failure(parse.parse_stderr(run["stderr"]), run["returncode"], before_attach=True)
        names = sorted(m[1] for e in theirs["errors"] if (m := re.match(r"(\w+)\(\) is an unsafe", e["message"])))
        assert names == ["system"]
        assert err.code == ErrorCode.PERMISSION_DENIED and err.details["unsafe"] == names
        assert err.message == "the program uses unsafe builtin(s) system(), refused: set [bpftrace] allow_unsafe = " \
                              "true to allow them"
        assert err.details["errors"] == [diagnostic("error", e) for e in theirs["errors"]]
        assert err.details["exit_code"] == run["returncode"]

        run = runs["not_traceable"][fmt]
        theirs = read_stderr(run["stderr"])
        err = parse.classify_failure(parse.parse_stderr(run["stderr"]), run["returncode"], before_attach=False)
        failed = [e for e in theirs["errors"] if e["message"].startswith("Error attaching probe: ")]
        if not failed:  # this kernel attached it after all
            continue
        probe = failed[0]["message"].split("'")[1]
        assert probe == "kprobe:no_such_fn_xyz"
        why = "; ".join(line for line in theirs["other"] if line.strip()) or failed[0]["message"]
        message = f"bpftrace could not attach {probe}: {why}"
        if "kprobe_events" in why and not Path("/sys/kernel/tracing/kprobe_events").exists():
            message += " (this kernel has no kprobe_events: kprobes cannot be used here; tracepoints can)"
        assert err.code == ErrorCode.BACKEND_UNAVAILABLE and err.message == message
        assert err.details["probe"] == probe
        assert err.details["warnings"] == [f"line {w['line']}, column {w['column']}: {w['message']}"
                                           for w in theirs["warnings"]]

    nobody = runs[recorded.AS_NOBODY]["text"]
    err = parse.classify_failure(parse.parse_stderr(nobody["stderr"]), nobody["returncode"], before_attach=True)
    assert "only supports running as the root user" in nobody["stderr"]
    assert err.code == ErrorCode.PERMISSION_DENIED and err.message.startswith("bpftrace 0.17 runs only as root")
    assert err.details == {"exit_code": nobody["returncode"],
                           "stderr": parse.parse_stderr(nobody["stderr"]).text()[-4000:]}


def test_a_run_that_ends_without_a_reason_says_how() -> None:
    empty = parse.parse_stderr("")
    assert parse.classify_failure(empty, -9, before_attach=True).message == \
        "bpftrace was killed by SIGKILL before attaching its probes"
    assert parse.classify_failure(empty, -99, before_attach=False, doing="while running").message == \
        "bpftrace was killed by signal 99 while running"
    assert parse.classify_failure(empty, 1, before_attach=True).message == \
        "bpftrace failed before attaching its probes: exit status 1"
    assert parse.classify_failure(empty, 0, before_attach=True).message == \
        "bpftrace failed before attaching its probes: exit status 0"
    assert parse.classify_failure(empty, None, before_attach=True).details == {"exit_code": None, "stderr": ""}
    sudo = parse.classify_failure(parse.parse_stderr("sudo: a password is required\n"), 1, before_attach=True)
    assert sudo.code == ErrorCode.PERMISSION_DENIED and "NOPASSWD" in sudo.message
    assert sudo.details == {"exit_code": 1, "stderr": "sudo: a password is required"}
