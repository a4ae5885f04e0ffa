"""Issue 20's launcher attacks: a client whose working directory holds a `msgpack.py`, a `trio/` and an
empty `diagd/` folder (a cloned repository an MCP host starts `diagd mcp` in). `python -m` puts the
cwd first on sys.path: the first ran inside the daemon, the last made the autostart die with
ImportError under the editable install. Each module there writes a marker file when imported; the
marker must never appear, and `diagd start`, the shim's autostart (a real MCP client) and a restart
must work, with the daemon running in `/`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd.actors import interpreter
from diagd.actors.crash.drgn import WORKER_MODULE
from tests.conftest import DIAGD, Env, start_daemon, wait_for_path

pytestmark = [pytest.mark.e2e, pytest.mark.fault]


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "imported-from-the-client-cwd"
    yield path
    assert not path.exists(), f"a module of the client's cwd was imported: {path.read_text()!r}"


@pytest.fixture
def hostile(tmp_path: Path, marker: Path) -> Path:
    """A directory an MCP host might start `diagd mcp` in, planted with modules diagd imports."""
    where = tmp_path / "cloned-repo"
    where.mkdir()
    code = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("msgpack.py", "structlog.py", "sitecustomize.py", "trio/__init__.py"):
        (where / name).parent.mkdir(exist_ok=True)
        (where / name).write_text(code)
    (where / "diagd").mkdir()  # empty: a namespace package that hid the editable install's `diagd`
    return where


def daemon_pid(env: Env) -> int:
    status = env.run("status", "--json")
    assert status.returncode == 0, status.stderr
    pid: int = json.loads(status.stdout)["daemon"]["pid"]
    return pid


def assert_settled(pid: int, *, launched: bool = True) -> None:
    """The daemon runs in `/`; `launched` (by diagd): as `python -P -m`, given no relative PYTHONPATH entry
    (/proc/<pid>/environ is the environment it was started with, not what it changed since)."""
    assert os.readlink(f"/proc/{pid}/cwd") == "/"
    if not launched:
        return
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[1:4] == [b"-P", b"-m", b"diagd.daemon.cli"], argv
    environ = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    assert not interpreter.unsafe_entries(environ.get(b"PYTHONPATH", b"").decode()), environ.get(b"PYTHONPATH")


def test_diagd_start_in_a_planted_directory_imports_nothing_from_it(env: Env, hostile: Path) -> None:
    started = subprocess.run([DIAGD, "start"], cwd=hostile, env=env.vars, capture_output=True, text=True,
                             timeout=60, check=False)
    try:
        assert started.returncode == 0, started.stderr
        assert_settled(daemon_pid(env))
        call = subprocess.run([DIAGD, "call", "echo", "message=hi", "--visibility=off"], cwd=hostile, env=env.vars,
                              capture_output=True, text=True, timeout=60, check=False)
        assert call.returncode == 0 and json.loads(call.stdout)["message"] == "hi", call.stderr
    finally:
        env.run("stop")


def test_diagd_start_with_relative_directory_variables_pins_them_where_it_ran(env: Env, hostile: Path) -> None:
    """`DIAGD_STATE_DIR=state` meant the caller's directory: the daemon (in `/`) gets it absolute."""
    variables = {**env.vars, "DIAGD_STATE_DIR": "state"}
    started = subprocess.run([DIAGD, "start"], cwd=hostile, env=variables, capture_output=True, text=True,
                             timeout=60, check=False)
    try:
        assert started.returncode == 0, started.stderr
        assert (hostile / "state" / "daemon.log").is_file() and not Path("/state").exists()
        assert_settled(daemon_pid(env))
    finally:
        env.run("stop")


def test_diagd_serve_drops_the_start_directory_an_empty_pythonpath_entry_puts_on_its_path(
        env: Env, hostile: Path) -> None:
    """`PYTHONPATH=...:` (a trailing colon) means the cwd: `diagd serve` forgets it before importing trio."""
    # Python itself imports these from a PYTHONPATH entry before any line of diagd runs: no program can
    # guard against them; what diagd imports later (msgpack, trio, structlog) must not come from there.
    (hostile / "diagd").rmdir()
    (hostile / "sitecustomize.py").unlink()
    logfile = open(env.root / "daemon.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([DIAGD, "serve"], cwd=hostile, env={**env.vars, "PYTHONPATH": env.vars["PYTHONPATH"] + ":"},
                            stdout=logfile, stderr=subprocess.STDOUT)
    try:
        wait_for_path(env.runtime / "control.sock", proc)
        assert_settled(proc.pid, launched=False)
        assert env.run("call", "echo", "message=hi", "--visibility=off").returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        logfile.close()


async def test_the_shims_autostart_and_restarts_in_a_planted_directory_import_nothing_from_it(
        env: Env, hostile: Path) -> None:
    params = StdioServerParameters(command=DIAGD, args=["mcp"], cwd=hostile,
                                   env={**env.vars, "DIAGD_SHIM_AUTOSTART_AFTER_S": "0"})
    try:
        async with Client(params, mode="legacy") as client:
            with trio.fail_after(60):
                first = (await client.call_tool("diagd_status", {})).structured_content["daemon"]["pid"]
                assert_settled(first)
                stopped = await trio.to_thread.run_sync(env.run, "stop")
                assert stopped.returncode == 0, stopped.stderr
                # The shim starts the next daemon itself, from the same directory.
                second = (await client.call_tool("diagd_status", {})).structured_content["daemon"]["pid"]
                assert second != first
                assert_settled(second)
                echoed = await client.call_tool("echo", {"message": "after the restart"})
                assert echoed.structured_content["message"] == "after the restart"
    finally:
        env.run("stop")


def test_a_systemd_style_start_in_a_planted_directory_settles_in_slash(env: Env, hostile: Path) -> None:
    """The unit runs the console script (its own directory first on sys.path, not the cwd); whatever
    directory it starts in, the daemon moves to `/`."""
    os_cwd = os.getcwd()
    try:
        os.chdir(hostile)
        daemon = start_daemon(env)
    finally:
        os.chdir(os_cwd)
    try:
        assert_settled(daemon.proc.pid, launched=False)
    finally:
        daemon.stop()


def test_the_drgn_worker_started_in_a_planted_directory_imports_nothing_from_it(hostile: Path) -> None:
    """Its cwd is the session directory, where outputs are written: `-P` keeps it off sys.path."""
    done = subprocess.run(interpreter.module_argv(WORKER_MODULE), cwd=hostile, stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"hello" in done.stdout  # it started, said hello, and ended at EOF
