"""The bpftrace back end against the real bpftrace (root only), through the tool registry of an
in-process daemon. Every wait is bounded; programs use few probes (detaching costs ~75 ms each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import trio

from diagd.actors import sandbox, system
from diagd.actors.bpftrace import helpers, parse
from diagd.actors.bpftrace.backend import run_command
from diagd.actors.sandbox import standby
from diagd.protocol.errors import ErrorCode
from tests.support.bpftrace_harness import BPFTRACE, Harness, bpftrace_daemon, ensure_tracefs, needs_bpftrace

pytestmark = needs_bpftrace


@pytest.fixture(autouse=True)
def tracefs() -> None:
    ensure_tracefs()


def wrapper(tmp_path: Path, name: str, body: str) -> str:
    """A stand-in bpftrace binary ([bpftrace] path) that changes the environment bpftrace sees."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


async def page_until(h: Harness, execution_id: str, offset: int, count: int) -> dict[str, object]:
    with trio.fail_after(10):
        while True:
            page = await h.call("get_result", {"execution_id": execution_id, "offset": offset, "limit": count,
                                               "wait_s": 5})
            if page["lines_returned"] == count or page["status"] != "running":
                return page
            await trio.sleep(0.05)


async def test_a_begin_program_runs_to_completion(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        result = await h.run('BEGIN { printf("hello %d\\n", 42); exit(); }')
    assert result["status"] == "completed" and result["exit_code"] == 0
    assert result["output"][0] == "hello 42" and result["attached_probes"] == 1
    assert result["error"] is None and not [w for w in result["warnings"] if "RLIMIT" in w]


async def test_an_interval_program_is_paged_while_it_runs_and_stops_with_its_final_maps(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        started = await h.call("exec_program", {
            "program": 'interval:ms:50 { @ticks = count(); printf("tick %d\\n", elapsed / 1000000); }',
            "timeout": 30})
        execution_id = started["execution_id"]
        first = await page_until(h, execution_id, 0, 3)
        assert first["status"] == "running" and first["lines_returned"] == 3 and first["next_offset"] == 3
        second = await page_until(h, execution_id, 3, 2)
        assert second["status"] == "running" and second["offset"] == 3
        assert all(line.startswith("tick ") for line in [*first["output"], *second["output"]])
        stopped = await h.call("stop_execution", {"execution_id": execution_id})
        assert stopped["status"] == "stopped" and stopped["stop_reason"] == "stop_execution"
        final = await h.call("get_result", {"execution_id": execution_id, "offset": 0, "limit": 10000})
        assert any(line.startswith("@ticks: ") for line in final["output"])  # printed on SIGINT
        again = await h.call("stop_execution", {"execution_id": execution_id})
        assert again["already_finished"] is True


async def test_a_tracepoint_program_sees_a_process_the_test_starts(tmp_path: Path) -> None:
    target = f"/tmp/diagd-bt-{uuid.uuid4().hex[:12]}"
    Path(target).write_text("x")
    try:
        async with bpftrace_daemon(tmp_path) as h:
            started = await h.call("exec_program", {
                "program": 'tracepoint:syscalls:sys_enter_openat /str(args->filename) == "' + target + '"/ '
                           '{ printf("%s %d %s\\n", comm, pid, str(args->filename)); exit(); }',
                "timeout": 20})
            assert started["attached_probes"] == 1
            reader = subprocess.run(["cat", target], capture_output=True, check=True)
            assert reader.stdout == b"x"
            result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 15,
                                                 "until": "done"})
    finally:
        os.unlink(target)
    assert result["status"] == "completed"
    comm, pid, filename = result["output"][0].split()
    assert comm == "cat" and filename == target and int(pid) > 0


async def test_a_syntax_error_comes_back_at_once_with_line_and_column(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        with trio.fail_after(5):
            err = await h.error("exec_program", {"program": 'BEGIN {\n  printf("x\\n");\n  @x = 1 + ;\n}'})
        assert err.code == ErrorCode.INVALID_ARGUMENT
        assert (err.details["line"], err.details["column"]) == (3, 12)
        assert "syntax error" in err.message and err.details["source"] == "  @x = 1 + ;"
        unknown = await h.error("exec_program", {"program": "tracepoint:syscalls:sys_enter_nope { }"})
        assert unknown.code == ErrorCode.INVALID_ARGUMENT and "tracepoint not found" in unknown.message
        assert h.backend.reserved == 0
        assert (await h.call("list_executions", {}))["total"] == 0


async def test_unsafe_builtins_are_refused_unless_the_config_allows_them(tmp_path: Path) -> None:
    program = 'BEGIN { system("echo from-system"); exit(); }'
    async with bpftrace_daemon(tmp_path / "safe") as h:
        err = await h.error("exec_program", {"program": program})
    assert err.code == ErrorCode.PERMISSION_DENIED and err.details["unsafe"] == ["system"]
    async with bpftrace_daemon(tmp_path / "unsafe", {"allow_unsafe": True}) as h:
        result = await h.run(program)
    assert result["status"] == "completed" and "from-system" in result["output"]


async def test_every_function_flagged_unsafe_is_refused_by_the_binary_without_unsafe(tmp_path: Path) -> None:
    unsafe = sorted(h.name for h in helpers.HELPERS_0_17 if "unsafe" in h.flags)
    assert unsafe == ["override", "signal", "system"]
    calls = " ".join(f"{name}();" for name in unsafe)
    code, _out, err = await run_command(["bpftrace", "-d", "-e", f"kprobe:vfs_read {{ {calls} }}"])
    assert code != 0
    refused = sorted(m[1] for m in parse._UNSAFE.finditer(err))
    assert refused == unsafe


async def test_a_run_that_reaches_its_duration_completes_with_its_end_output(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        result = await h.run('interval:ms:100 { printf("t\\n"); } END { printf("end\\n"); }', timeout=1)
    assert result["status"] == "completed" and result["stop_reason"] == "duration_reached" and result["exit_code"] == 0
    assert 5 <= result["output"].count("t") <= 11 and "end" in result["output"]
    assert result["elapsed_s"] >= 1.0  # what it was asked: the whole second (how much longer is bench/'s business)


async def test_the_sixth_concurrent_execution_is_busy(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        ids = [(await h.call("exec_program", {"program": "interval:s:1 { }", "timeout": 30}))["execution_id"]
               for _ in range(5)]
        # Refused, not queued: a queued call would wait for one of the five 30 s runs (a hang guard, not a
        # speed bound: how fast the refusal comes is bench/'s business).
        with trio.fail_after(20):
            err = await h.error("exec_program", {"program": "interval:s:1 { }"})
        assert err.code == ErrorCode.BUSY and sorted(err.details["running"]) == sorted(ids)
        listing = await h.call("list_executions", {"status": "running"})
        assert listing["running"] == 5 and listing["max_concurrent"] == 5
        async with trio.open_nursery() as nursery:
            for execution_id in ids:
                nursery.start_soon(h.call, "stop_execution", {"execution_id": execution_id})
        assert h.backend.reserved == 0


async def test_the_buffer_limit_stops_the_program_and_flags_it(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path, {"max_lines": 50}) as h:
        result = await h.run('interval:ms:1 { printf("line %d\\n", @n++); }', timeout=20)
    assert result["status"] == "stopped" and result["stop_reason"] == "buffer_full"
    # stop_reason says the buffer ended it, not its 20 s timeout (no wall-clock bound needed for that).
    assert result["buffer_full"] is True and result["lines_total"] == 50
    assert result["output"][:2] == ["line 0", "line 1"]


async def test_json_output_returns_maps_and_histograms_as_data(tmp_path: Path) -> None:
    program = ('BEGIN { @calls["read"] = count(); @calls["read"] = count(); @calls["open"] = count(); '
               '@lat = hist(3); @lat = hist(200); @lin = lhist(7, 0, 10, 5); @s = stats(10); '
               'printf("done\\n"); exit(); }')
    async with bpftrace_daemon(tmp_path) as h:
        result = await h.run(program, output_format="json")
    assert result["status"] == "completed"
    assert {"type": "printf", "data": "done\n"} in result["output"]
    maps = result["maps"]
    assert maps["@calls"] == {"type": "map", "data": {"read": 2, "open": 1}}
    buckets = maps["@lat"]["data"]
    assert maps["@lat"]["type"] == "hist" and sum(b["count"] for b in buckets) == 2
    assert {"min": 2, "max": 3, "count": 1} in buckets and {"min": 128, "max": 255, "count": 1} in buckets
    assert maps["@lin"] == {"type": "hist", "data": [{"min": 5, "max": 9, "count": 1}]}
    assert maps["@s"] == {"type": "stats", "data": {"count": 1, "average": 10, "total": 10}}
    assert all(isinstance(event, dict) and "type" in event for event in result["output"])


async def test_a_sigkill_of_bpftrace_mid_run_is_a_failed_run_and_the_back_end_carries_on(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        started = await h.call("exec_program", {"program": 'interval:ms:50 { printf("alive\\n"); }', "timeout": 30})
        await page_until(h, started["execution_id"], 0, 1)
        os.kill(started["pid"], signal.SIGKILL)
        result = await h.call("get_result", {"execution_id": started["execution_id"], "wait_s": 10, "until": "done"})
        assert result["status"] == "failed" and result["signal"] == "SIGKILL" and "not by diagd" in result["error"]
        assert result["output"][0] == "alive" and h.backend.reserved == 0
        after = await h.run('BEGIN { printf("still fine\\n"); exit(); }')
        assert after["output"][0] == "still fine"


async def test_results_come_from_disk_once_the_actor_has_retired(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path, {"linger_s": 0.05}) as h:
        result = await h.run('BEGIN { printf("a\\nb\\n"); exit(); }')
        execution_id = result["execution_id"]
        with trio.fail_after(5):
            while execution_id in h.backend.live:
                await trio.sleep(0.02)
        assert h.daemon.supervisor.find("bpftrace", execution_id) is None
        again = await h.call("get_result", {"execution_id": execution_id, "offset": 1, "limit": 1})
        assert again["output"] == ["b"] and again["status"] == "completed" and again["has_more"] is True
        missing = await h.error("get_result", {"execution_id": "bt-00000000"})
        assert missing.code == ErrorCode.NOT_FOUND


async def test_missing_tracefs_is_reported_with_the_mount_command(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # bpftrace runs in a private mount namespace without tracefs; the daemon's check agrees. The stand-in
    # is a shell script running unshare and umount, which the sandbox would not let bpftrace's run execute.
    monkeypatch.setenv("DIAGD_LANDLOCK", "off")
    hidden = wrapper(tmp_path, "bpftrace-no-tracefs",
                     'exec unshare -m sh -c \'umount /sys/kernel/tracing 2>/dev/null; '
                     'umount /sys/kernel/debug/tracing 2>/dev/null; exec bpftrace "$@"\' sh "$@"')
    monkeypatch.setattr(system, "tracefs_dir", lambda: None)
    async with bpftrace_daemon(tmp_path, {"path": hidden}) as h:
        err = await h.error("exec_program", {"program": "tracepoint:sched:sched_switch { @ = count(); }"})
        assert err.code == ErrorCode.BACKEND_UNAVAILABLE
        assert "tracefs is not mounted" in err.message and "mount -t tracefs nodev /sys/kernel/tracing" in err.message
        listed = await h.error("list_probes", {"filter": "tracepoint:sched:*"})
        assert listed.code == ErrorCode.BACKEND_UNAVAILABLE and "mount -t tracefs" in listed.message
        other = await h.call("list_probes", {"filter": "software:*"})
        assert other["tracefs_mounted"] is False and "tracefs is not mounted" in other["warnings"][0]


async def test_bpftrace_refusing_a_non_root_user_is_permission_denied(tmp_path: Path) -> None:
    # setpriv as the privileged helper (which runs bpftrace unconfined: the sandbox drops CAP_SETUID).
    async with bpftrace_daemon(tmp_path, {"privileged_helper": "setpriv --reuid=65534 --regid=65534 "
                                                               "--clear-groups"}) as h:
        err = await h.error("exec_program", {"program": "BEGIN { exit(); }"})
    assert err.code == ErrorCode.PERMISSION_DENIED
    assert "root" in err.message and "privileged_helper" in err.message


async def test_not_root_without_helper_is_refused_before_running_anything(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(system, "cap_effective", lambda: 0)
    async with bpftrace_daemon(tmp_path) as h:
        err = await h.error("exec_program", {"program": "BEGIN { exit(); }"})
        assert err.code == ErrorCode.PERMISSION_DENIED and "sudo -n" in err.details["fix"]
        assert h.backend.reserved == 0
    async with bpftrace_daemon(tmp_path, {"privileged_helper": "env"}) as h:  # a helper: bpftrace decides
        result = await h.run('BEGIN { printf("via helper\\n"); exit(); }')
    assert result["output"][0] == "via helper"


async def test_list_probes_pages_filters_and_shows_tracepoint_fields(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        first = await h.call("list_probes", {"filter": "t:syscalls:sys_enter_*", "limit": 10})
        assert first["filter"] == "tracepoint:syscalls:sys_enter_*" and first["returned"] == 10
        assert first["has_more"] is True and first["total"] > 100
        second = await h.call("list_probes", {"filter": "t:syscalls:sys_enter_*", "offset": 10, "limit": 10})
        assert not set(first["probes"]) & set(second["probes"])
        untyped = await h.call("list_probes", {"filter": "syscalls:*openat*", "with_args": True})
        assert "tracepoint:syscalls:sys_enter_openat" in untyped["probes"]
        assert "const char * filename" in untyped["args"]["tracepoint:syscalls:sys_enter_openat"]
        assert not any(a.startswith("unsigned short common_") for a in untyped["args"][untyped["probes"][0]])
        everything = await h.call("list_probes", {"limit": 1})
        assert everything["total"] >= first["total"] and everything["tracefs_mounted"] is True


async def test_list_helpers_describes_the_installed_bpftrace(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        found = await h.call("list_helpers")
        assert found["bpftrace_version"].startswith("bpftrace v") and found["verified"] is True
        by_name = {(x["name"], x["kind"]): x for x in found["helpers"]}
        for name, kind in [("printf", "function"), ("str", "function"), ("kstack", "builtin"), ("comm", "builtin"),
                           ("pid", "builtin"), ("hist", "map_function"), ("count", "map_function")]:
            assert by_name[(name, kind)]["description"], name
        assert by_name[("system", "function")]["flags"] == ["unsafe", "async"]
        if found["bpftrace_version"].startswith("bpftrace v0.17"):
            assert found["not_in_installed_binary"] == [] and "warning" not in found
        maps_only = await h.call("list_helpers", {"kind": "map_function"})
        assert {x["kind"] for x in maps_only["helpers"]} == {"map_function"} and maps_only["total"] >= 10


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def child_processes() -> list[str]:
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return [Path(f"/proc/{pid}/stat").read_text() for pid in children if Path(f"/proc/{pid}").exists()]


async def standby_waiting(h: Harness) -> int:
    """The pid of the standby launcher waiting for the next run (the first confined run started it)."""
    with trio.fail_after(30):
        while True:
            ref = h.daemon.supervisor.find(standby.KIND, "bpftrace")
            details = ref.statistics()["details"] if ref is not None else {}
            if details.get("waiting") and details.get("workers"):
                return int(details["workers"][0]["pid"])
            await trio.sleep(0.02)


def served(h: Harness) -> int:
    ref = h.daemon.supervisor.find(standby.KIND, "bpftrace")
    return int(ref.statistics()["details"]["served"]) if ref is not None else 0


async def test_runs_of_every_outcome_leave_no_fd_and_no_child_behind(tmp_path: Path) -> None:
    # Children this process had before (a module run earlier in this worker may leave some): only the
    # runs' own must be gone, and the standby launcher's once it is stopped.
    before = {stat.split()[0] for stat in child_processes()}
    async with bpftrace_daemon(tmp_path, {"linger_s": 0.01}) as h:
        baseline = open_fds()
        await h.run('BEGIN { printf("done\\n"); exit(); }')
        await standby_waiting(h)  # the runs below start on it (or cold, when it is still starting)
        await h.run('interval:ms:10 { printf("x\\n"); }', timeout=0.3)
        await h.error("exec_program", {"program": "BEGIN { nope(); }"})
        killed = await h.call("exec_program", {"program": "interval:s:1 { }", "timeout": 30})
        os.kill(killed["pid"], signal.SIGKILL)
        await h.call("get_result", {"execution_id": killed["execution_id"], "wait_s": 10, "until": "done"})
        await h.call("list_probes", {"filter": "t:sched:*"})
        with trio.fail_after(5):
            while h.backend.live:
                await trio.sleep(0.02)
        assert served(h) >= 1
        launcher = h.daemon.supervisor.find(standby.KIND, "bpftrace")
        assert launcher is not None
        h.daemon.supervisor.stop(launcher.id, "test finished with it")
        with trio.fail_after(15):
            while open_fds() != baseline or [s for s in child_processes() if s.split()[0] not in before]:
                await trio.sleep(0.02)
        assert open_fds() == baseline
        assert [stat for stat in child_processes() if stat.split()[0] not in before] == []


def sandbox_of(pid: int) -> dict[str, object]:
    """What a running bpftrace is held by, as the kernel shows it: capabilities, no_new_privs, seccomp,
    and its environment (DIAGD_SANDBOX: the launcher's report, Landlock's ABI among it)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return {**{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs",
                                                "Seccomp", "Seccomp_filters")},
            "environ": sorted(e for e in environ if e), "exe": os.readlink(f"/proc/{pid}/exe")}


async def test_a_run_on_the_standby_launcher_is_held_as_a_cold_one(tmp_path: Path) -> None:
    program = 'interval:ms:100 { printf("tick\\n"); }'
    async with bpftrace_daemon(tmp_path) as h:
        cold = await h.call("exec_program", {"program": program, "timeout": 30})
        assert served(h) == 0
        held_cold = sandbox_of(cold["pid"])
        await h.call("stop_execution", {"execution_id": cold["execution_id"]})
        waiting = await standby_waiting(h)
        warm = await h.call("exec_program", {"program": program, "timeout": 30})
        assert warm["pid"] == waiting and served(h) == 1  # the standby became the run's bpftrace
        held_warm = sandbox_of(warm["pid"])
        await h.call("stop_execution", {"execution_id": warm["execution_id"]})
        assert held_warm == held_cold and held_warm["exe"] == os.path.realpath(BPFTRACE)
        report = json.loads(next(e for e in held_warm["environ"] if e.startswith("DIAGD_SANDBOX="))[14:])
        assert report["landlock"] == sandbox.landlock_abi() and report["seccomp"] and report["death_link"]
        await standby_waiting(h)
        shadow = await h.run('interval:ms:100 { cat("/etc/shadow"); printf("tick\\n"); exit(); }')
        assert served(h) == 2 and "tick" in shadow["output"]
        assert not [line for line in shadow["output"] if "root:" in line]
        assert any("/etc/shadow" in w and "Permission denied" in w for w in shadow["warnings"]), shadow


async def test_without_warm_launcher_every_run_is_cold(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path, {"warm_launcher": False}) as h:
        for _ in range(2):
            done = await h.run('BEGIN { printf("cold\\n"); exit(); }')
            assert done["output"][0] == "cold"
        await trio.sleep(0.2)
        assert h.daemon.supervisor.find(standby.KIND, "bpftrace") is None


async def test_a_filter_bpftrace_rejects_is_an_invalid_argument(tmp_path: Path) -> None:
    async with bpftrace_daemon(tmp_path) as h:
        err = await h.error("list_probes", {"filter": "tracepoint:"})
    assert err.code == ErrorCode.INVALID_ARGUMENT and "requires 2 arguments" in err.message


def probe_that_cannot_attach() -> str:
    """A probe bpftrace accepts (parser, semantic analyser) but the kernel refuses to attach."""
    if not Path("/sys/kernel/tracing/kprobe_events").exists():
        return "kprobe:do_nanosleep"  # a kernel without kprobe_events: every kprobe fails to attach
    blacklist = Path("/sys/kernel/debug/kprobes/blacklist")
    for line in blacklist.read_text().splitlines() if blacklist.exists() else []:
        parts = line.split()
        if len(parts) == 2 and parts[1].isidentifier():
            return f"kprobe:{parts[1]}"  # the kernel refuses kprobes on its own blacklist
    pytest.skip("needs a kernel without kprobe_events, or a readable kprobe blacklist")


@pytest.mark.parametrize("output_format", ["text", "json"])
async def test_a_probe_that_fails_to_attach_is_the_exec_program_answer(tmp_path: Path, output_format: str) -> None:
    probe = probe_that_cannot_attach()
    async with bpftrace_daemon(tmp_path) as h:
        with trio.fail_after(20):
            err = await h.error("exec_program", {"program": f"{probe} {{ @x = count(); }}", "timeout": 30,
                                                 "output_format": output_format})
        assert err.code == ErrorCode.BACKEND_UNAVAILABLE and err.details["probe"] == probe
        assert f"Error attaching probe: '{probe}'" in err.details["stderr"] and probe in err.message
        assert h.backend.reserved == 0 and not h.backend.live
        assert (await h.call("list_executions", {}))["total"] == 0
        # A program that attaches still answers running, and the attach marker is nobody's warning.
        started = await h.call("exec_program", {"program": "tracepoint:syscalls:sys_enter_nanosleep { }",
                                                "timeout": 30, "output_format": output_format})
        assert started["status"] == "running" and started["attached_probes"] == 1
        # ... because bpftrace said its probes are attached (not because start_timeout_s ran out).
        assert h.backend.live[started["execution_id"]]._attach_confirmed.is_set()
        stopped = await h.call("stop_execution", {"execution_id": started["execution_id"]})
        assert stopped["status"] == "stopped" and not [w for w in stopped["warnings"] if "NOTIFY" in w]
