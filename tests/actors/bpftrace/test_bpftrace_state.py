"""bpftrace back end without bpftrace: stderr parsing, settings, the buffer, persistence, and the
execution's timers on the virtual clock with a scripted process."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
from pathlib import Path

import pytest
import trio
import trio.testing

from diagd.actors import system
from diagd.actors.bpftrace import helpers as bpftrace_helpers
from diagd.actors.bpftrace import store as bpftrace_store
from diagd.actors.bpftrace.execution import Execution
from diagd.actors.bpftrace.helpers import parse_man_page
from diagd.actors.bpftrace.parse import classify_failure, parse_stderr
from diagd.actors.bpftrace.probes import match_listing, normalize_filter
from diagd.actors.bpftrace.settings import BpftraceSettings
from diagd.actors.bpftrace.status import Status, StopReason
from diagd.actors.bpftrace.store import ExecutionStore
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.bpftrace_harness import ATTACH, FakeBpftrace, FakeSpawner, bpftrace_daemon

MEMLOCK = ('ERROR: Unknown error -1: couldn\'t set RLIMIT_MEMLOCK for bpftrace. If your program is not loading, '
           'you can try "ulimit -l 8192" to fix the problem\n')


# ---------------------------------------------------------------------------------------------
# stderr


def test_the_memlock_warning_is_a_notice_even_when_glued_to_another_message() -> None:
    text = ("Error while reading traceable functions from /sys/kernel/tracing/available_filter_functions: "
            "Operation not permitted" + MEMLOCK +
            "stdin:3:8-11: ERROR: Unknown function: foo\n  @x = foo(1,\n       ~~~\n")
    report = parse_stderr(text)
    assert [str(e) for e in report.errors] == ["line 3, column 8: Unknown function: foo"]
    assert report.errors[0].source == "  @x = foo(1," and report.errors[0].end_column == 11
    assert len(report.notices) == 2 and "RLIMIT_MEMLOCK" in report.notices[0]
    assert "available_filter_functions (Operation not permitted)" in report.notices[1]
    assert not report.other and not report.warnings


def test_an_error_at_end_of_input_keeps_its_quoted_line() -> None:
    report = parse_stderr('stdin:1:24-24: ERROR: syntax error, unexpected end of file, expecting }\n'
                          'BEGIN { printf("hi\\n") \n                       \n')
    assert report.errors[0].line == 1 and report.errors[0].column == 24
    assert report.errors[0].source == 'BEGIN { printf("hi\\n") '


def test_refusals_map_to_stable_codes() -> None:
    def code(text: str, rc: int = 1) -> DiagdError:
        return classify_failure(parse_stderr(text), rc, before_attach=True)

    unsafe = code('stdin:1:9-21: ERROR: system() is an unsafe function being used in safe mode\n'
                  'BEGIN { system("ls"); }\n        ~~~~~~~~~~~~\n')
    assert unsafe.code == ErrorCode.PERMISSION_DENIED and unsafe.details["unsafe"] == ["system"]
    assert "allow_unsafe" in unsafe.message
    root = code("ERROR: bpftrace currently only supports running as the root user.\n")
    assert root.code == ErrorCode.PERMISSION_DENIED and "privileged_helper" in root.message
    sudo = code("sudo: a password is required\n")
    assert sudo.code == ErrorCode.PERMISSION_DENIED and "NOPASSWD" in sudo.message
    syntax = code("stdin:1:18-19: ERROR: syntax error, unexpected ;\nBEGIN { @x = 1 + ; }\n                 ~\n")
    assert syntax.code == ErrorCode.INVALID_ARGUMENT
    assert (syntax.details["line"], syntax.details["column"]) == (1, 18)
    assert "syntax error, unexpected ;" in syntax.message
    killed = code("", rc=-9)
    assert killed.code == ErrorCode.BACKEND_UNAVAILABLE and "SIGKILL" in killed.message


def test_a_missing_tracepoint_without_tracefs_says_how_to_mount_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "tracefs_dir", lambda: None)
    err = classify_failure(parse_stderr("stdin:1:1-37: ERROR: tracepoint not found: syscalls:sys_enter_openat\n"
                                        "tracepoint:syscalls:sys_enter_openat { }\n~~~~\n"), 1, before_attach=True)
    assert err.code == ErrorCode.BACKEND_UNAVAILABLE
    assert "tracefs is not mounted" in err.message and "mount -t tracefs nodev /sys/kernel/tracing" in err.message


# ---------------------------------------------------------------------------------------------
# settings, filters, helpers table


def test_settings_are_checked_and_sudo_never_prompts() -> None:
    with pytest.raises(DiagdError, match=r"\[bpftrace\] max_line is not a setting \(did you mean max_lines\?\)"):
        BpftraceSettings.parse({"max_line": 5})
    with pytest.raises(DiagdError, match="max_lines must be an integer"):
        BpftraceSettings.parse({"max_lines": "many"})
    with pytest.raises(DiagdError, match="must be positive"):
        BpftraceSettings.parse({"max_concurrent": 0})
    with pytest.raises(DiagdError, match="privileged_helper: No closing quotation"):
        BpftraceSettings.parse({"privileged_helper": "sudo '-n"})
    settings = BpftraceSettings.parse({"privileged_helper": "sudo", "max_run_s": 30, "default_timeout_s": 5})
    assert settings.command("-l") == ["sudo", "-n", "bpftrace", "-l"]
    assert BpftraceSettings.parse({"privileged_helper": "sudo -n -E"}).helper_argv == ["sudo", "-n", "-E"]
    sigint, sigkill = settings.stop_steps(probes=100)
    assert (sigint.signal, sigint.wait_s) == (signal.SIGINT, 5.0 + 15.0)
    assert (sigkill.signal, sigkill.wait_s) == (signal.SIGKILL, 5.0 + 15.0)


def test_filters_without_a_probe_type_are_matched_here_not_by_bpftrace() -> None:
    # bpftrace 0.17 aborts on `-l 'syscalls:*read*'`: only typed patterns go to it.
    assert normalize_filter("t:sched:*") == ("tracepoint:sched:*", "tracepoint:sched:*")
    assert normalize_filter("syscalls:*read*") == (None, "syscalls:*read*")
    listing = ["tracepoint:syscalls:sys_enter_read", "tracepoint:syscalls:sys_enter_openat",
               "tracepoint:sched:sched_switch", "software:cpu-clock:"]
    assert match_listing(listing, "syscalls:*read*") == ["tracepoint:syscalls:sys_enter_read"]
    assert match_listing(listing, "openat") == ["tracepoint:syscalls:sys_enter_openat"]
    assert match_listing(listing, "*:sched_*") == ["tracepoint:sched:sched_switch"]


MAN_SNIPPET = r""".SH "MAP FUNCTIONS"
.SS "count"
.sp
.B variants
.br
.sp
.RS 4
.ie n \{\
\h'-04'\(bu\h'+03'\c
.\}
\f(CRcount()\fP
.RE
.sp
Count how often this function is called.
.sp
Using \f(CR@=count()\fP is conceptually similar to \f(CR@++\fP.
.SH "FUNCTIONS"
.SS "system"
.sp
.B variants
.br
.sp
.RS 4
\f(CRvoid system(string namefmt [, ...args])\fP
.RE
.sp
\fBunsafe\fP
\fBasync\fP
.sp
\f(CRsystem\fP lets bpftrace run the specified command (fork and exec) until it completes. More text.
.SH "PROBES"
.SS "BEGIN and END"
"""


def test_man_page_entries_give_name_signature_flags_and_first_sentence() -> None:
    helpers = {h.name: h for h in parse_man_page(MAN_SNIPPET)}
    assert set(helpers) == {"count", "system"}
    assert helpers["count"].kind == "map_function" and helpers["count"].signatures == ("count()",)
    assert helpers["count"].description == "Count how often this function is called."
    assert helpers["system"].flags == ("unsafe", "async")
    assert helpers["system"].description.startswith("system lets bpftrace run the specified command")
    assert helpers["system"].description.endswith("until it completes.")


def test_the_table_covers_every_function_of_the_installed_man_page() -> None:
    man = next((p for p in bpftrace_helpers.MAN_PAGES if p.exists()), None)
    if man is None:
        pytest.skip("no bpftrace man page installed")
    parsed = parse_man_page(gzip.decompress(man.read_bytes()).decode() if man.suffix == ".gz" else man.read_text())
    table = {(h.name, h.kind): h for h in bpftrace_helpers.HELPERS_0_17}
    assert {(h.name, h.kind) for h in parsed} <= set(table)
    for h in parsed:  # unsafe/async/compile_time as the man page says
        assert set(h.flags) == set(table[(h.name, h.kind)].flags), h.name


# ---------------------------------------------------------------------------------------------
# the buffer


def test_the_buffer_stops_at_its_line_limit_and_keeps_counting() -> None:
    ex = Execution(id="bt-00000001", program="p", output_format="text", timeout_s=10, max_lines=3)
    assert [ex.add_line(f"l{i}") for i in range(3)] == [True, True, False]
    assert ex.add_line("l3") is False and ex.add_line("Lost 7 events") is False
    assert ex.lines == ["l0", "l1", "l2"] and ex.buffer_full and ex.lines_dropped == 2 and ex.lost_events == 7
    page = ex.page(1, 10)
    assert page["output"] == ["l1", "l2"] and page["has_more"] is False and page["next_offset"] == 3
    assert ex.page(0, 2)["has_more"] is True and ex.page(9, 5)["lines_returned"] == 0


def test_the_buffer_respects_its_byte_limit_too() -> None:
    ex = Execution(id="bt-00000002", program="p", output_format="text", timeout_s=10, max_bytes=10)
    assert ex.add_line("12345") is True
    assert ex.add_line("123456") is False and ex.buffer_full and ex.lines == ["12345"]


def test_json_maps_are_tracked_even_past_the_buffer_limit() -> None:
    ex = Execution(id="bt-00000003", program="p", output_format="json", timeout_s=10, max_lines=1)
    ex.add_line('{"type": "printf", "data": "x\\n"}')
    ex.add_line('{"type": "hist", "data": {"@h": [{"min": 4, "max": 7, "count": 1}]}}')
    ex.add_line('{"type": "lost_events", "data": {"events": 3}}')
    ex.add_line("not json")
    assert ex.maps == {"@h": {"type": "hist", "data": [{"min": 4, "max": 7, "count": 1}]}}
    assert ex.lost_events == 3
    ex2 = Execution(id="bt-00000004", program="p", output_format="json", timeout_s=10)
    ex2.add_line("not json")
    ex2.add_line("[1, 2]")
    assert ex2.page(0, 10)["output"] == [{"type": "text", "data": "not json"}, {"type": "text", "data": "[1, 2]"}]


def test_the_top_log2_bucket_bpftrace_0_17_misprints_is_reported_open_ended() -> None:
    ex = Execution(id="bt-00000005", program="p", output_format="json", timeout_s=10)
    top = '{"min": 1073741824, "max": 2147483647, "count": 1}, {"min": -2147483648, "max": 0, "count": 2}'
    line = '{"type": "hist", "data": {"@h": [' + top + ']}}'
    ex.add_line(line)
    ex.add_line('{"type": "hist", "data": {"@k": {"a": [{"min": -2147483648, "max": 0, "count": 4}], '
                '"b": [{"min": 2, "max": 3, "count": 1}]}}}')
    ex.add_line('{"type": "hist", "data": {"@l": [{"max": -1, "count": 1}, {"min": 0, "max": 0, "count": 5}]}}')
    assert ex.maps["@h"]["data"] == [{"min": 1073741824, "max": 2147483647, "count": 1},
                                     {"min": 2147483648, "count": 2}]
    assert ex.maps["@k"]["data"] == {"a": [{"min": 2147483648, "count": 4}], "b": [{"min": 2, "max": 3, "count": 1}]}
    assert ex.maps["@l"]["data"] == [{"max": -1, "count": 1}, {"min": 0, "max": 0, "count": 5}]  # untouched
    assert ex.page(0, 1)["output"] == [json.loads(line)]  # the output stays what bpftrace printed


# ---------------------------------------------------------------------------------------------
# persistence


def test_an_execution_round_trips_through_the_store(tmp_path: Path) -> None:
    store = ExecutionStore(tmp_path)
    ex = Execution(id="bt-0000000a", program="BEGIN { }", output_format="text", timeout_s=3)
    store.create(ex)
    for line in ("a", "", "tab\tand \x0b vertical tab", "ünïcode"):
        ex.add_line(line)
    ex.status, ex.stop_reason, ex.exit_code = Status.TIMED_OUT, StopReason.TIMEOUT, 0
    store.save(ex)
    loaded = store.load("bt-0000000a")
    assert loaded is not None
    assert loaded.lines == ex.lines and loaded.status == Status.TIMED_OUT and loaded.stop_reason == StopReason.TIMEOUT
    with pytest.raises(DiagdError, match="not an execution id"):
        store.path("../etc")


def test_recovery_marks_in_flight_runs_interrupted_and_kills_what_they_left(tmp_path: Path) -> None:
    leftover = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        store = ExecutionStore(tmp_path)
        ex = Execution(id="bt-0000000b", program="p", output_format="text", timeout_s=3)
        ex.pid, ex.pid_start = leftover.pid, bpftrace_store.proc_starttime(leftover.pid)
        store.create(ex)
        ex.add_line("kept")
        store.save(ex)  # status still running: the daemon "died" here
        assert store.recover() == ["bt-0000000b"]
        assert leftover.wait(timeout=5) == -signal.SIGKILL
        loaded = store.load("bt-0000000b")
        assert loaded is not None and loaded.status == Status.INTERRUPTED and loaded.lines == ["kept"]
        assert loaded.stop_reason == StopReason.DAEMON_DIED and "has been killed" in (loaded.error or "")
        assert store.recover() == []
    finally:
        leftover.kill()
        leftover.wait()


def test_a_reused_pid_is_not_killed(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        start = bpftrace_store.proc_starttime(other.pid)
        assert start is not None
        assert bpftrace_store._kill_leftover(other.pid, start + 1) is False
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_old_executions_are_pruned_beyond_the_keep_limit(tmp_path: Path) -> None:
    store = ExecutionStore(tmp_path)
    for i in range(5):
        ex = Execution(id=f"bt-0000010{i}", program="p", output_format="text", timeout_s=1, created_at=1000.0 + i)
        ex.status = Status.COMPLETED
        store.create(ex)
    store.prune(2, protect={"bt-00000100"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bt-00000100", "bt-00000103", "bt-00000104"]


# ---------------------------------------------------------------------------------------------
# the execution's timers, on the virtual clock with a scripted process


SETTINGS = {"stop_grace_s": 2.0, "stop_s_per_probe": 0.5, "linger_s": 5.0}


async def test_timeout_sends_sigint_at_the_deadline_and_keeps_the_partial_output(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0.1, ATTACH.format(n=2)), (1, "tick"), (2, "tick"), (3, "tick")],
                        on_sigint=["@c: 2"])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "interval:s:1 { }", "timeout": 2.5})
            assert trio.current_time() == pytest.approx(0.1)  # returned as soon as the probes attached
            assert started["attached_probes"] == 2
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 30,
                                                 "until": "done"})
        nursery.cancel_scope.cancel()
    # The timeout counts tracing time: from the attach (0.1) on.
    assert fake.signals == [(pytest.approx(2.6), signal.SIGINT)]
    assert result["status"] == "completed" and result["stop_reason"] == "duration_reached"
    assert result["output"] == ["tick", "tick", "@c: 2"] and result["elapsed_s"] == pytest.approx(2.5)


ATTACH_FAILED = ("create_probe_event: open(/sys/kernel/tracing/kprobe_events): No such file or directory\n"
                 "ERROR: Error attaching probe: 'kprobe:do_nanosleep'\n")


async def test_exec_program_answers_when_the_probes_are_attached_not_when_announced(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # Announced at 0.1, then the attach fails and bpftrace exits at 0.4: that is the answer.
    failing = FakeBpftrace([(0.1, ATTACH.format(n=1)), (0.4, None)], attach_fails=True, exit_code=255)
    # Announced, never confirmed, still running (a very slow attach): running after start_timeout_s.
    slow = FakeBpftrace([(0.1, ATTACH.format(n=1)), (100, "late")], attach_fails=True)
    async with trio.open_nursery() as nursery:
        spawner = FakeSpawner(nursery, failing, slow)
        async with bpftrace_daemon(tmp_path, {**SETTINGS, "start_timeout_s": 5}, spawn=spawner) as h:
            failing.stderr_text = MEMLOCK + ATTACH_FAILED
            err = await h.error("exec_program", {"program": "kprobe:do_nanosleep { }"})
            assert trio.current_time() == pytest.approx(0.4)
            assert err.code == ErrorCode.BACKEND_UNAVAILABLE and err.details["probe"] == "kprobe:do_nanosleep"
            assert "kprobe_events): No such file or directory" in err.message and err.details["exit_code"] == 255
            assert h.backend.reserved == 0 and not h.backend.live
            t0 = trio.current_time()
            started = await h.call("exec_program", {"program": "p", "timeout": 1})
            assert trio.current_time() == pytest.approx(t0 + 5) and started["status"] == "running"
        nursery.cancel_scope.cancel()


async def test_through_a_privileged_helper_the_announcement_is_the_attach(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    # sudo drops the marker variable, so it is not asked for and not waited for.
    fake = FakeBpftrace([(0.1, ATTACH.format(n=1)), (5, None)], attach_fails=True)
    async with trio.open_nursery() as nursery:
        spawner = FakeSpawner(nursery, fake)
        async with bpftrace_daemon(tmp_path, {**SETTINGS, "privileged_helper": "sudo -n"}, spawn=spawner) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            assert trio.current_time() == pytest.approx(0.1) and started["status"] == "running"
        nursery.cancel_scope.cancel()
    assert not fake.notify_attached


async def test_a_program_that_ignores_sigint_is_killed_after_a_grace_that_grows_with_its_probes(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=10)), (0.5, "tick")], ignore_sigint=True)
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 1})
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 60,
                                                 "until": "done"})
        nursery.cancel_scope.cancel()
    # SIGINT at the deadline, SIGKILL after stop_grace_s + 10 probes * stop_s_per_probe.
    assert fake.signals == [(pytest.approx(1.0), signal.SIGINT), (pytest.approx(1.0 + 2.0 + 5.0), signal.SIGKILL)]
    assert result["status"] == "stopped" and result["stop_reason"] == "duration_reached"  # killed: no normal end
    assert result["output"] == ["tick"] and "was killed" in result["error"]


async def test_a_full_buffer_stops_the_program_gracefully(autojump_clock: trio.testing.MockClock,
                                                          tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), *((1 + i * 0.01, f"line {i}") for i in range(20))],
                        on_sigint=["final"])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, {**SETTINGS, "max_lines": 5}, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 60,
                                                 "until": "done"})
        nursery.cancel_scope.cancel()
    assert fake.signals and fake.signals[0] == (pytest.approx(1.04), signal.SIGINT)
    assert result["status"] == "stopped" and result["buffer_full"] and result["truncated"]
    assert result["stop_reason"] == "buffer_full" and result["lines_total"] == 5 and result["lines_dropped"] == 1
    assert result["exit_code"] == 0


async def test_a_sigkill_from_someone_else_is_a_failed_run(autojump_clock: trio.testing.MockClock,
                                                           tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), (0.5, "before")])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            await trio.sleep(1)
            fake.kill()
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 5,
                                                 "until": "done"})
        nursery.cancel_scope.cancel()
    assert result["status"] == "failed" and result["signal"] == "SIGKILL" and result["exit_code"] is None
    assert result["error"] == "bpftrace was killed by SIGKILL (not by diagd)" and result["output"] == ["before"]


async def test_the_next_execution_past_the_limit_is_busy_at_once(autojump_clock: trio.testing.MockClock,
                                                                  tmp_path: Path) -> None:
    fakes = [FakeBpftrace([(0, ATTACH.format(n=1))], on_sigint=["bye"]) for _ in range(3)]
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, {**SETTINGS, "max_concurrent": 2},
                                   spawn=FakeSpawner(nursery, *fakes)) as h:
            first = await h.call("exec_program", {"program": "p", "timeout": 30})
            await h.call("exec_program", {"program": "p", "timeout": 30})
            before = trio.current_time()
            busy = await h.error("exec_program", {"program": "p", "timeout": 30})
            assert busy.code == ErrorCode.BUSY and trio.current_time() == before
            assert len(busy.details["running"]) == 2 and busy.details["max_concurrent"] == 2
            stopped = await h.call("stop_execution", {"execution_id": first["execution_id"]})
            assert stopped["status"] == "stopped" and stopped["already_finished"] is False
            third = await h.call("exec_program", {"program": "p", "timeout": 30})  # the slot is free again
            assert h.backend.reserved == 2 and third["execution_id"] in h.backend.live
        nursery.cancel_scope.cancel()


async def test_a_finished_execution_retires_its_actor_after_linger(autojump_clock: trio.testing.MockClock,
                                                                   tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), (0.2, "only"), (0.3, None)])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            execution_id = started["execution_id"]
            await h.call("get_result", {"execution_id": execution_id, "wait_s": 5, "until": "done"})
            ended = trio.current_time()
            assert h.daemon.supervisor.find("bpftrace", execution_id) is not None
            while h.daemon.supervisor.find("bpftrace", execution_id) is not None:
                await trio.sleep(0.01)
            assert trio.current_time() == pytest.approx(ended + SETTINGS["linger_s"], abs=0.02)
            assert execution_id not in h.backend.live and h.backend.reserved == 0
        nursery.cancel_scope.cancel()
    meta = json.loads((tmp_path / "bpftrace" / execution_id / "meta.json").read_text())
    assert meta["status"] == "completed" and meta["lines_total"] == 1


async def test_daemon_shutdown_mid_run_persists_an_interrupted_run_with_its_final_output(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), (0.5, "tick")], on_sigint=["@final: 1"])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert fake.signals == [(pytest.approx(1.0), signal.SIGINT)]
    loaded = ExecutionStore(tmp_path / "bpftrace").load(started["execution_id"])
    assert loaded is not None and loaded.status == Status.INTERRUPTED
    assert loaded.stop_reason == StopReason.SHUTDOWN and loaded.lines == ["tick", "@final: 1"]


async def test_a_program_rejected_before_attaching_leaves_nothing_behind(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(0.05, None)], exit_code=1, stderr=MEMLOCK + "stdin:1:9-12: ERROR: Unknown function: "
                        "foo\nBEGIN { foo(); }\n        ~~~\n")
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            err = await h.error("exec_program", {"program": "BEGIN { foo(); }"})
            assert err.code == ErrorCode.INVALID_ARGUMENT and err.details["line"] == 1
            assert err.details["column"] == 9 and err.details["source"] == "BEGIN { foo(); }"
            assert h.backend.reserved == 0 and not h.backend.live
        nursery.cancel_scope.cancel()
    assert not (tmp_path / "bpftrace").exists() or not any((tmp_path / "bpftrace").iterdir())


async def test_get_result_waits_for_new_output_with_progress(autojump_clock: trio.testing.MockClock,
                                                            tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), (3.5, "late")], on_sigint=[])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 10},
                                  progress=True)
            assert trio.current_time() == pytest.approx(3.5)
            assert result["output"] == ["late"] and result["status"] == "running"
            values = [p[0] for p in h.progress]
            assert len(values) >= 3 and values == sorted(set(values))  # strictly increasing
            assert h.progress[-1][2] is not None and "running: 0 lines" in h.progress[-1][2]
            quick = await h.call("get_result", {"execution_id": started["execution_id"], "offset": 1,
                                                "wait_s": 0.5})
            assert quick["lines_returned"] == 0 and trio.current_time() == pytest.approx(4.0)
        nursery.cancel_scope.cancel()


def test_ids_are_validated_before_they_reach_the_disk() -> None:
    assert bpftrace_store.EXECUTION_ID.match("bt-0123abcd")
    assert not bpftrace_store.EXECUTION_ID.match("bt-../../x")



async def test_stopping_the_actor_stops_the_run_and_keeps_it(autojump_clock: trio.testing.MockClock,
                                                              tmp_path: Path) -> None:
    fake = FakeBpftrace([(0, ATTACH.format(n=1)), (0.5, "tick")], on_sigint=["@n: 1"])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            started = await h.call("exec_program", {"program": "p", "timeout": 30})
            await trio.sleep(1)
            ref = h.daemon.supervisor.find("bpftrace", started["execution_id"])
            assert ref is not None and ref.statistics()["details"]["status"] == "running"
            h.daemon.supervisor.stop(ref.id, reason="diagd_stop_actor")
            while started["execution_id"] in h.backend.live:
                await trio.sleep(0.01)
            assert h.backend.reserved == 0
        nursery.cancel_scope.cancel()
    loaded = ExecutionStore(tmp_path / "bpftrace").load(started["execution_id"])
    assert loaded is not None and loaded.status == Status.STOPPED and loaded.stop_reason == StopReason.ACTOR_STOPPED
    assert loaded.lines == ["tick", "@n: 1"]


def test_a_json_run_cut_short_by_a_crash_gets_its_maps_back_from_the_output(tmp_path: Path) -> None:
    store = ExecutionStore(tmp_path)
    ex = Execution(id="bt-0000000c", program="p", output_format="json", timeout_s=3)
    store.create(ex)
    ex.add_line('{"type": "map", "data": {"@c": {"cat": 2}}}')
    store.append(ex)  # what the periodic flush wrote before the daemon died
    store.recover()
    loaded = store.load("bt-0000000c")
    assert loaded is not None and loaded.maps == {"@c": {"type": "map", "data": {"cat": 2}}}
    assert loaded.status == Status.INTERRUPTED and (tmp_path / "bt-0000000c" / "maps.json").exists()


async def test_a_caller_that_goes_away_before_the_attach_takes_the_process_with_it(
        autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    fake = FakeBpftrace([(5, ATTACH.format(n=1))], on_sigint=[])
    async with trio.open_nursery() as nursery:
        async with bpftrace_daemon(tmp_path, SETTINGS, spawn=FakeSpawner(nursery, fake)) as h:
            with trio.move_on_after(1):
                await h.call("exec_program", {"program": "p"})
            while fake.returncode is None:
                await trio.sleep(0.01)
            assert fake.signals == [(pytest.approx(1.0), signal.SIGINT)]
            assert h.backend.reserved == 0 and not h.backend.live
        nursery.cancel_scope.cancel()
    assert not (tmp_path / "bpftrace").exists() or not any((tmp_path / "bpftrace").iterdir())


def test_probe_listings_cached_are_bounded_and_expire() -> None:
    # One cached listing per filter a client ever asked for grew without end (issue 28).
    from diagd.actors.bpftrace.backend import LISTINGS_MAX, BpftraceBackend

    backend = BpftraceBackend.__new__(BpftraceBackend)  # only its cache: no runtime, no bpftrace
    backend._listings = {}

    async def fill() -> None:
        for i in range(100):
            backend._remember_listing(("bpftrace", f"kprobe:f{i}*"), [f"kprobe:f{i}"], [], ttl_s=30)
            assert len(backend._listings) <= LISTINGS_MAX
        assert ("bpftrace", "kprobe:f99*") in backend._listings  # the newest are kept
        await trio.sleep(31)
        backend._remember_listing(("bpftrace", "x"), [], [], ttl_s=30)
        assert list(backend._listings) == [("bpftrace", "x")]  # the expired ones went

    trio.run(fill, clock=trio.testing.MockClock(autojump_threshold=0))
