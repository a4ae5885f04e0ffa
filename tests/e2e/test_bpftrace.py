"""bpftrace end to end: MCP SDK client -> `diagd mcp` shim -> `diagd serve` -> real bpftrace (root only).

The SDK client checks every structured result against the tool's output schema.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import DIAGD, DaemonProcess, Env, start_daemon
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace
from tests.support.progress import delivered

pytestmark = [pytest.mark.e2e, needs_bpftrace]

TOOLS = {"list_probes", "list_helpers", "exec_program", "get_result", "stop_execution", "list_executions"}


@pytest.fixture(autouse=True)
def tracefs() -> None:
    ensure_tracefs()


@asynccontextmanager
async def mcp_client(env: Env) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--no-autostart"], env=env.vars)
    async with Client(params, mode="legacy") as client:
        yield client


async def call(client: Client, name: str, args: dict[str, Any], **kw: Any) -> Any:
    with trio.fail_after(30):
        return await client.call_tool(name, args, **kw)


def ok(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content[0].text
    data: dict[str, Any] = result.structured_content
    assert json.loads(result.content[0].text) == data
    return data


def error(result: Any) -> dict[str, Any]:
    assert result.is_error
    data: dict[str, Any] = json.loads(result.content[0].text)
    return data


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def first_line(client: Client, execution_id: str) -> dict[str, Any]:
    page = ok(await call(client, "get_result", {"execution_id": execution_id, "wait_s": 10}))
    assert page["lines_returned"] >= 1, page
    return page


RUN_S = 4.0


async def test_tools_are_listed_and_a_run_reports_progress_until_it_times_out(daemon: DaemonProcess) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mcp_client(daemon.env) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools if t.name in TOOLS}
        assert set(tools) == TOOLS and all(t.output_schema is not None for t in tools.values())
        exec_hints = tools["exec_program"].annotations
        assert exec_hints is not None and exec_hints.read_only_hint is False
        # A run long enough that get_result waits through several progress intervals even when bpftrace's
        # start (LLVM's code generation, CPU-bound) takes over a second on a loaded machine.
        started = ok(await call(client, "exec_program", {
            "program": 'interval:ms:200 { @n = count(); printf("tick\\n"); }', "timeout": RUN_S}))
        assert started["status"] == "running" and started["attached_probes"] == 1
        done = ok(await call(client, "get_result", {"execution_id": started["execution_id"], "wait_s": 20,
                                                    "until": "done"}, progress_callback=on_progress))
        await delivered()
        helpers = ok(await call(client, "list_helpers", {"name": "hist"}))
        probes = ok(await call(client, "list_probes", {"filter": "tracepoint:sched:sched_switch"}))
    assert done["status"] == "completed" and done["stop_reason"] == "duration_reached" and "tick" in done["output"]
    assert any(line.startswith("@n: ") for line in done["output"])
    assert len(seen) >= 2 and all(total == RUN_S for _, total, _ in seen)
    assert [p for p, _, _ in seen] == sorted({p for p, _, _ in seen})
    assert {h["name"] for h in helpers["helpers"]} == {"hist", "lhist"}
    assert probes["probes"] == ["tracepoint:sched:sched_switch"]


async def test_exec_program_with_wait_s_answers_with_the_first_output_in_one_call(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        started = ok(await call(client, "exec_program", {
            "program": 'BEGIN { printf("first\\n"); printf("second\\n"); exit(); }', "wait_s": 20}))
        first = started["first_page"]
        assert first["execution_id"] == started["execution_id"] and first["offset"] == 0
        # The first output came: at least its first line (the second may come a moment later).
        assert first["lines_returned"] >= 1 and first["output"] == ["first", "second"][:first["lines_returned"]]
        # The page get_result gives once the run is over begins with it.
        again = ok(await call(client, "get_result", {"execution_id": started["execution_id"], "wait_s": 20,
                                                     "until": "done", "limit": 100}))
        assert again["output"][:2] == ["first", "second"]
        plain = ok(await call(client, "exec_program", {"program": 'BEGIN { printf("x\\n"); exit(); }'}))
        assert "first_page" not in plain


async def test_a_syntax_error_is_an_error_result_with_line_and_column(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        err = error(await call(client, "exec_program", {"program": "BEGIN { printf(\"x\\n\") "}))
        unknown = error(await call(client, "get_result", {"execution_id": "bt-ffffffff"}))
        bad_id = error(await call(client, "get_result", {"execution_id": "../../etc/passwd"}))
    assert err["code"] == "INVALID_ARGUMENT" and err["details"]["line"] == 1 and err["details"]["column"] == 23
    assert "syntax error" in err["message"]
    assert unknown["code"] == "NOT_FOUND"
    assert bad_id["code"] == "INVALID_ARGUMENT" and bad_id["details"]["path"] == "$.execution_id"


async def test_sigkill_of_bpftrace_mid_run_is_a_failed_run_and_the_daemon_carries_on(daemon: DaemonProcess) -> None:
    async with mcp_client(daemon.env) as client:
        started = ok(await call(client, "exec_program", {"program": 'interval:ms:50 { printf("x\\n"); }',
                                                          "timeout": 30}))
        await first_line(client, started["execution_id"])
        os.kill(started["pid"], signal.SIGKILL)
        failed = ok(await call(client, "get_result", {"execution_id": started["execution_id"], "wait_s": 10,
                                                      "until": "done"}))
        assert failed["status"] == "failed" and failed["signal"] == "SIGKILL"
        status = ok(await call(client, "diagd_status", {}))
        assert status["daemon"]["pid"] == daemon.proc.pid
        again = ok(await call(client, "exec_program", {"program": 'BEGIN { printf("ok\\n"); exit(); }'}))
        done = ok(await call(client, "get_result", {"execution_id": again["execution_id"], "wait_s": 10,
                                                    "until": "done"}))
    assert done["status"] == "completed" and done["output"][0] == "ok"


async def test_results_survive_a_restart_and_the_run_in_flight_is_interrupted_without_orphans(env: Env) -> None:
    daemon = start_daemon(env)
    try:
        async with mcp_client(env) as client:
            finished = ok(await call(client, "exec_program", {"program": 'BEGIN { printf("one\\ntwo\\n"); exit(); }'}))
            ok(await call(client, "get_result", {"execution_id": finished["execution_id"], "wait_s": 10,
                                                 "until": "done"}))
            running = ok(await call(client, "exec_program", {
                "program": 'interval:ms:50 { @ticks = count(); printf("tick\\n"); }', "timeout": 30}))
            await first_line(client, running["execution_id"])
    finally:
        assert daemon.stop() == 0
    assert not alive(running["pid"]), "bpftrace outlived the daemon"

    daemon = start_daemon(env)
    try:
        out = env.run("call", "get_result", f"execution_id={running['execution_id']}", "limit=10000",
                      "--visibility", "off")
        assert out.returncode == 0, out.stderr
        interrupted = json.loads(out.stdout)
        async with mcp_client(env) as client:
            completed = ok(await call(client, "get_result", {"execution_id": finished["execution_id"]}))
            listing = ok(await call(client, "list_executions", {}))
    finally:
        daemon.stop()
    assert completed["status"] == "completed" and completed["output"] == ["one", "two", "", ""]
    assert interrupted["status"] == "interrupted" and interrupted["stop_reason"] == "daemon_shutdown"
    assert interrupted["output"][0] == "tick" and any(x.startswith("@ticks: ") for x in interrupted["output"])
    assert {e["execution_id"]: e["status"] for e in listing["executions"]} == {
        finished["execution_id"]: "completed", running["execution_id"]: "interrupted"}


async def test_a_bpftrace_left_by_a_killed_daemon_is_reaped_at_the_next_start(env: Env) -> None:
    # Through a privileged helper (a no-op one here) bpftrace runs outside the sandbox, so no death link
    # ends it with the daemon (tests/e2e/test_escapes.py checks that one): the next start must.
    env.write_config(env.config.read_text() + '[bpftrace]\nprivileged_helper = "env"\n')
    daemon = start_daemon(env)
    try:
        async with mcp_client(env) as client:
            # Silent after its first line: a bpftrace that writes to the dead daemon's pipe dies of SIGPIPE.
            running = ok(await call(client, "exec_program", {
                "program": 'BEGIN { printf("started\\n"); } interval:ms:100 { @n = count(); }', "timeout": 30}))
            await first_line(client, running["execution_id"])
    except BaseException:
        daemon.stop()
        raise
    # Output reaches the state dir every 0.5 s (a daemon crash loses at most that much): wait until it is there.
    saved = env.state / "bpftrace" / running["execution_id"] / "output.txt"
    deadline = time.monotonic() + 10
    while not (saved.exists() and "started" in saved.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "started" in saved.read_text()
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(timeout=10)
    assert alive(running["pid"])  # its own session: the kernel does not take it down with the daemon
    for stale in (daemon.mcp_socket, daemon.control_socket):  # else start_daemon would not wait
        stale.unlink()
    daemon = start_daemon(env)
    try:
        deadline = time.monotonic() + 10
        while alive(running["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(running["pid"])
        async with mcp_client(env) as client:
            result = ok(await call(client, "get_result", {"execution_id": running["execution_id"]}))
    finally:
        daemon.stop()
    assert result["status"] == "interrupted" and result["stop_reason"] == "daemon_exited"
    assert "has been killed" in result["error"] and result["output"] == ["started"]


async def test_without_landlock_directives_outside_the_allow_list_are_refused(env: Env) -> None:
    # The worst case (issue 39): no Landlock and [bpftrace] allow_unconfined = true, so cat() and #include
    # may read any file as root; #import, #include_next and __has_include are refused all the same, before
    # any bpftrace starts, and #include still works.
    env.write_config(env.config.read_text() + "[bpftrace]\nallow_unconfined = true\n")
    daemon = start_daemon(env, {"DIAGD_LANDLOCK": "off"})
    try:
        async with mcp_client(env) as client:
            refused = [error(await call(client, "exec_program", {"program": program})) for program in (
                '#import "/etc/shadow"\nBEGIN { exit(); }',
                'struct S { int a; } %:/**/include_next "/etc/shadow"\nBEGIN { exit(); }',
                '#if __has_include("/etc/shadow")\n#endif\nBEGIN { exit(); }')]
            ran = ok(await call(client, "exec_program", {
                "program": '#include <linux/types.h>\nBEGIN { printf("ok\\n"); exit(); }'}))
            done = ok(await call(client, "get_result", {"execution_id": ran["execution_id"], "wait_s": 10,
                                                        "until": "done"}))
            listing = ok(await call(client, "list_executions", {}))
    finally:
        daemon.stop()
    assert [(r["code"], r["details"]["refused"], r["details"]["line"]) for r in refused] == [
        ("INVALID_ARGUMENT", "#import", 1), ("INVALID_ARGUMENT", "#include_next", 1),
        ("INVALID_ARGUMENT", "__has_include", 1)]
    assert all("#define, #undef, #if" in r["message"] for r in refused)
    assert done["status"] == "completed" and done["output"][0] == "ok"
    assert [e["execution_id"] for e in listing["executions"]] == [ran["execution_id"]]  # nothing else ran
    assert "root:" not in (env.root / "daemon.log").read_text(errors="replace")
