"""Escape attempts through the real path (SDK client -> diagd mcp -> daemon -> crash / drgn worker / bpftrace),
on the default configuration: each fails or gets a coded error. Then the same features on a daemon that sees
no Landlock (DIAGD_LANDLOCK=off): refused with the reason, and allowed when the config accepts them unconfined.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from diagd.actors.sandbox import kernel
from tests.actors.crash.test_escapes import ESCAPES
from tests.conftest import DaemonProcess, Env, start_daemon
from tests.e2e.test_crash import call, make_env, status
from tests.e2e.test_pcap_differential import session as one_client
from tests.fixtures.vmcore import VmcoreFixture, build
from tests.support.bpftrace_harness import ensure_tracefs

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("crash") is None, reason="crash is not installed"),
    pytest.mark.skipif(kernel.landlock_abi() < 1, reason="the kernel has no Landlock"),
    pytest.mark.skipif(os.geteuid() != 0, reason="bpftrace and the private /tmp need root"),
]


@dataclass
class Daemon:
    process: DaemonProcess
    fixture: VmcoreFixture
    root: Path

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        return await call(self.process, tool, **args)

    async def open_session(self) -> dict[str, Any]:
        session = await self.call("open_vmcore_session", vmcore_path=str(self.fixture.vmcore),
                                  vmlinux_path=str(self.fixture.vmlinux))
        assert not session["_is_error"], session
        return session


def daemon_with(root: Path, config: str = "", extra_env: dict[str, str] | None = None) -> Iterator[Daemon]:
    fixture = build()
    env: Env = make_env(root, f'[daemon]\nallowed_dirs = ["{fixture.dir}", "{root}"]\n{config}')
    process = start_daemon(env, extra_env)
    try:
        yield Daemon(process, fixture, root)
    finally:
        process.stop()
        shutil.rmtree(env.runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def confined(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from daemon_with(tmp_path_factory.mktemp("confined"), extra_env=SECRET)


@pytest.fixture(scope="module")
def session(confined: Daemon) -> dict[str, Any]:
    result: dict[str, Any] = trio.run(confined.open_session)
    return result


SECRET = {"DIAGD_TEST_SECRET": "hunter2"}  # in the daemon's environment: no child may see it


@pytest.fixture(scope="module")
def unconfined_allowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that sees no Landlock and is configured to run gdb passthrough and drgn anyway: what is
    left is seccomp's exec denial, the command check and the environment allow-list."""
    yield from daemon_with(tmp_path_factory.mktemp("unconfined"), "[crash]\nallow_unconfined = true\n",
                           extra_env={"DIAGD_LANDLOCK": "off", **SECRET})


@pytest.fixture(scope="module", params=["landlock", "no-landlock"])
def any_kernel(request: pytest.FixtureRequest) -> tuple[Daemon, dict[str, Any]]:
    """The default daemon (Landlock), then one without Landlock (DIAGD_LANDLOCK=off, allow_unconfined),
    each with a session: the exec, alias and environment tests run on both."""
    daemon: Daemon = request.getfixturevalue("confined" if request.param == "landlock" else "unconfined_allowed")
    opened: dict[str, Any] = (request.getfixturevalue("session") if request.param == "landlock"
                              else trio.run(daemon.open_session))
    return daemon, opened


async def drgn(daemon: Daemon, session: dict[str, Any], code: str) -> dict[str, Any]:
    return await daemon.call("run_drgn_command", code=code, session_id=session["session_id"])


UNREACHABLE = ("FileNotFoundError", "PermissionError")  # not in its world, or refused by Landlock / DAC


def raised(result: dict[str, Any]) -> str:
    """The exception class drgn code raised (run_drgn_command answers INVALID_ARGUMENT with its traceback)."""
    assert result["_is_error"] and result["code"] == "INVALID_ARGUMENT", result
    return str(result["details"]["traceback"]).strip().splitlines()[-1].split(":")[0]


# -- drgn ------------------------------------------------------------------------------------------

async def test_drgn_code_cannot_read_etc_shadow_or_other_files_outside_its_job(confined: Daemon,
                                                                              session: dict[str, Any]) -> None:
    # Not in its mount namespace at all (FileNotFoundError); Landlock would refuse them if they were.
    assert raised(await drgn(confined, session, "open('/etc/shadow').read()")) in UNREACHABLE
    assert raised(await drgn(confined, session, "import os; os.listdir('/root/.ssh')")) in UNREACHABLE
    works = await drgn(confined, session, "print(prog['init_task'].comm.string_().decode())")
    assert not works["_is_error"] and works["output"] == "swapper/0"


async def test_drgn_code_cannot_read_diagds_state_dir_though_allowed_dirs_holds_it(confined: Daemon,
                                                                                 session: dict[str, Any]) -> None:
    # allowed_dirs holds the test root and with it the state dir (every client's outputs, serial logs,
    # the audit log): the sandbox grants the root's other entries (as they were when the session
    # started) only (issue 20, tool groups).
    state = confined.process.env.state
    assert raised(await drgn(confined, session, f"open({str(state / 'audit.jsonl')!r}).read()")) in UNREACHABLE
    assert raised(await drgn(confined, session, f"import os; os.listdir({str(state)!r})")) in UNREACHABLE
    works = await drgn(confined, session, f"print(open({str(confined.root / 'config.toml')!r}).read())")
    assert not works["_is_error"] and "allowed_dirs" in works["output"], works
    own = await drgn(confined, session, "import os; open('mine', 'w').write('x'); print('mine' in os.listdir('.'))")
    assert not own["_is_error"] and own["output"] == "True", own  # its scratch directory stays its


async def test_drgn_code_writes_only_its_scratch_directory(confined: Daemon, session: dict[str, Any],
                                                           tmp_path: Path) -> None:
    outside = tmp_path / "escaped.txt"
    assert raised(await drgn(confined, session, f"open({str(outside)!r}, 'w')")) in UNREACHABLE
    assert raised(await drgn(confined, session, "open('/etc/cron.d/diagd', 'w')")) in UNREACHABLE
    # diagd's session directory (its stored outputs) is not in the worker's world: it writes its scratch.
    stored = Path(session["workdir"]) / "session.json"
    assert raised(await drgn(confined, session, f"open({str(stored)!r}, 'w')")) in UNREACHABLE
    wrote = await drgn(confined, session, "import os; open('scratch.txt', 'w').write('ok'); print(os.getcwd())")
    assert not wrote["_is_error"] and wrote["output"] == "/tmp" and not outside.exists()
    assert not (Path(session["workdir"]) / "scratch.txt").exists() and stored.is_file()


async def test_drgn_code_cannot_start_a_process(any_kernel: tuple[Daemon, dict[str, Any]], tmp_path: Path) -> None:
    confined, session = any_kernel  # with Landlock and without: seccomp refuses execve either way
    marker = tmp_path / "ran"
    status = await drgn(confined, session, f"import os; os.system('touch {marker}')")
    assert not status["_is_error"] and status["output"] != "0"  # the shell could not be executed
    assert raised(await drgn(confined, session, "import subprocess; subprocess.run(['/usr/bin/id'])")) \
        == "PermissionError"
    python = await drgn(confined, session, "import subprocess, sys; subprocess.run([sys.executable, '-c', '1'])")
    assert raised(python) == "PermissionError"  # not even the interpreter that runs the worker
    assert not marker.exists()


async def test_drgn_code_cannot_connect_over_tcp_or_to_a_unix_socket(confined: Daemon, session: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    private = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # like /run/systemd/private
    private.bind(str(tmp_path / "private"))
    private.listen()
    server = socket.create_server(("127.0.0.1", 0))
    try:
        unix = await drgn(confined, session, "import socket; socket.socket(socket.AF_UNIX)"
                                             f".connect({str(tmp_path / 'private')!r})")
        tcp = await drgn(confined, session, "import socket; socket.create_connection(('127.0.0.1', "
                                            f"{server.getsockname()[1]}), 5)")
    finally:
        private.close()
        server.close()
    assert raised(unix) == "OSError" and "family not supported" in unix["details"]["traceback"]
    assert raised(tcp) == "OSError"


async def test_drgn_sees_only_the_environment_allow_list(any_kernel: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, session = any_kernel
    seen = await drgn(daemon, session, "import json, os; print(json.dumps(sorted(os.environ)))")
    assert not seen["_is_error"], seen
    names = set(json.loads(seen["output"]))
    allowed = {"PATH", "LANG", "LANGUAGE", "TZ", "HOME", "DIAGD_SANDBOX"}
    assert names - allowed <= {n for n in names if n.startswith("LC_")}, names
    home = await drgn(daemon, session, "import os; print(os.environ['HOME'], os.environ.get('DIAGD_TEST_SECRET'))")
    assert home["output"] == "/nonexistent None"


# -- crash ------------------------------------------------------------------------------------------

async def test_crash_aliases_cannot_reach_gdb_and_gdb_sees_no_secret(any_kernel: tuple[Daemon, dict[str, Any]]
                                                                      ) -> None:
    daemon, session = any_kernel
    sid = session["session_id"]
    for command in ("alias zz gdb", "alias zz g", 'alias zz "gdb"', "set gdb on"):
        refused = await daemon.call("run_crash_command", command=command, session_id=sid)
        assert refused["_is_error"] and refused["code"] == "INVALID_ARGUMENT", (command, refused)
    used = await daemon.call("run_crash_command", command="zz she id", session_id=sid)
    assert used["_is_error"] or "uid=" not in used["output"], used
    environment = await daemon.call("run_crash_command", command="gdb show environment", session_id=sid)
    assert not environment["_is_error"], environment
    assert "HOME=/nonexistent" in environment["output"] and "hunter2" not in environment["output"]
    assert '"exec":"denied after this one"' in environment["output"]


async def test_crash_cannot_start_a_shell_by_any_spelling(any_kernel: tuple[Daemon, dict[str, Any]]) -> None:
    confined, session = any_kernel
    async with one_client(confined.process) as call:  # one MCP client for the many refusals
        for command in ESCAPES:
            result = await call("run_crash_command", command=command, session_id=session["session_id"])
            assert result["_is_error"] and result["code"] == "INVALID_ARGUMENT", (command, result)
    still = await confined.call("run_crash_command", command="gdb p jiffies", session_id=session["session_id"])
    assert not still["_is_error"] and "=" in still["output"]


# -- bpftrace ---------------------------------------------------------------------------------------

async def bpftrace_run(daemon: Daemon, program: str, run_s: float = 3) -> dict[str, Any]:
    started = await daemon.call("exec_program", program=program, timeout=run_s, output_format="json")
    assert not started["_is_error"], started
    result = await daemon.call("get_result", execution_id=started["execution_id"], wait_s=30, until="done")
    return result


async def test_bpftrace_cat_of_etc_shadow_fails_while_its_probes_still_work(confined: Daemon) -> None:
    ensure_tracefs()
    result = await bpftrace_run(confined, 'tracepoint:syscalls:sys_enter_openat { @opens = count(); } '
                                          'interval:ms:300 { cat("/etc/shadow"); printf("tick\\n"); exit(); }')
    lines = [line if isinstance(line, dict) else json.loads(line) for line in result["output"]]
    cats = [line["data"] for line in lines if line.get("type") == "cat"]
    assert cats and all("root:" not in c for c in cats)
    assert any(line.get("type") == "printf" and line["data"] == "tick\n" for line in lines)
    assert any(line.get("type") == "map" for line in lines)  # the tracepoint fired and its map was printed
    assert any("/etc/shadow" in w and "Permission denied" in w for w in result["warnings"]), result["warnings"]


def test_a_bpftrace_run_dies_with_its_daemon(tmp_path: Path) -> None:
    # The run started on the standby launcher (the warm path), which the first run started; the waiting
    # replacement leaves with the daemon too (EOF on its stdin).
    ensure_tracefs()
    gen = daemon_with(tmp_path)
    daemon = next(gen)
    try:
        first = trio.run(lambda: daemon.call("exec_program", program='BEGIN { printf("cold\\n"); exit(); }'))
        assert not first["_is_error"], first

        def waiting() -> int | None:
            found = [a["details"] for a in status(daemon.process)["actors"] if a["kind"] == "sandbox-standby"]
            return found[0]["workers"][0]["pid"] if found and found[0]["waiting"] and found[0]["workers"] else None

        deadline = time.monotonic() + 30
        while (standby := waiting()) is None:
            assert time.monotonic() < deadline, "no standby launcher waited"
            time.sleep(0.05)
        started = trio.run(lambda: daemon.call("exec_program", program="interval:s:1 { printf(\"tick\\n\"); }",
                                               timeout=50))
        assert not started["_is_error"], started
        pid = started["pid"]
        assert pid == standby and _alive(pid)
        deadline = time.monotonic() + 30
        while (replacement := waiting()) is None:
            assert time.monotonic() < deadline, "no replacement standby launcher waited"
            time.sleep(0.05)
        daemon.process.proc.send_signal(signal.SIGKILL)
        daemon.process.proc.wait()
        deadline = time.monotonic() + 10
        while _alive(pid) or _alive(replacement):
            assert time.monotonic() < deadline, "bpftrace or the standby launcher outlived the killed daemon"
            time.sleep(0.05)
    finally:
        gen.close()


# -- where Landlock is unavailable ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def unconfined_refused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    yield from daemon_with(tmp_path_factory.mktemp("nolandlock"), extra_env={"DIAGD_LANDLOCK": "off"})


async def test_without_landlock_the_escape_capable_features_are_refused_with_the_reason(
        unconfined_refused: Daemon) -> None:
    session = await unconfined_refused.open_session()
    for result in (await drgn(unconfined_refused, session, "1"),
                   await unconfined_refused.call("run_crash_command", command="drgn: 1",
                                                 session_id=session["session_id"]),
                   await unconfined_refused.call("run_crash_command", command="gdb p jiffies",
                                                 session_id=session["session_id"])):
        assert result["_is_error"] and result["code"] == "PERMISSION_DENIED", result
        assert "Landlock" in result["message"] and "[crash] allow_unconfined" in result["details"]["hint"]
    plain = await unconfined_refused.call("run_crash_command", command="p jiffies", session_id=session["session_id"])
    assert not plain["_is_error"]  # crash itself still serves
    ensure_tracefs()
    cat = await unconfined_refused.call("exec_program", program='BEGIN { cat("/etc/hostname"); exit(); }')
    assert cat["_is_error"] and cat["code"] == "PERMISSION_DENIED" and "cat()" in cat["message"]
    probes = await bpftrace_run(unconfined_refused, 'BEGIN { printf("hi\\n"); exit(); }')
    assert probes["status"] == "completed"


async def test_without_landlock_allow_unconfined_opens_them_again(tmp_path: Path) -> None:
    gen = daemon_with(tmp_path, "[crash]\nallow_unconfined = true\n[bpftrace]\nallow_unconfined = true\n",
                      extra_env={"DIAGD_LANDLOCK": "off"})
    daemon = next(gen)
    try:
        session = await daemon.open_session()
        ran = await drgn(daemon, session, "print(prog['init_task'].comm.string_().decode())")
        assert not ran["_is_error"] and ran["output"] == "swapper/0"
        # Without Landlock the namespaces still hold: the host's files are not in the worker's world.
        assert raised(await drgn(daemon, session, "open('/etc/hostname').read()")) in UNREACHABLE
        gdb = await daemon.call("run_crash_command", command="gdb p jiffies", session_id=session["session_id"])
        assert not gdb["_is_error"]
        ensure_tracefs()
        cat = await bpftrace_run(daemon, 'BEGIN { cat("/etc/hostname"); exit(); }')
        assert cat["status"] == "completed" and cat["output"]
    finally:
        gen.close()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
