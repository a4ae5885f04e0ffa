"""Socket activation the way systemd does it: `systemd-socket-activate` binds the sockets, waits for
the first client, then execs `diagd serve` with LISTEN_FDS / LISTEN_PID / LISTEN_FDNAMES."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import DIAGD, Env, wait_for_path
from tests.e2e.test_mcp import call, mcp_client, payload

pytestmark = pytest.mark.e2e

ACTIVATE = shutil.which("systemd-socket-activate")
needs_activate = pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is absent (package systemd)")
PASSED = ("DIAGD_RUNTIME_DIR", "DIAGD_STATE_DIR", "DIAGD_CONFIG", "PYTHONPATH")  # it passes on only what -E names


def activator(env: Env, *listen: str, fdnames: str | None = None) -> subprocess.Popen[bytes]:
    """`systemd-socket-activate` listening on `listen` (file names in the runtime dir), the daemon's
    output in daemon.log. It execs diagd in its own process, so its pid becomes the daemon's."""
    env.runtime.mkdir(mode=0o700)
    args = [str(ACTIVATE)]
    for name in listen:
        args += ["-l", str(env.runtime / name)]
    if fdnames is not None:
        args.append(f"--fdname={fdnames}")
    for var in PASSED:
        args += ["-E", var]
    logfile = open(env.root / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([*args, DIAGD, "serve"], env=env.vars, stdout=logfile, stderr=subprocess.STDOUT)
    for name in listen:
        wait_for_path(env.runtime / name, proc)
    return proc


@pytest.fixture
def activated(env: Env) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=20)


def status(env: Env) -> dict[str, object]:
    done = env.run("status", "--json")
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout)
    return data


@needs_activate
async def test_the_first_mcp_client_starts_the_daemon_on_named_inherited_sockets_and_the_next_reuses_it(
        env: Env, activated: list[subprocess.Popen[bytes]]) -> None:
    proc = activator(env, "mcp.sock", "control.sock", fdnames="mcp:control")
    activated.append(proc)
    assert proc.poll() is None and "Execing" not in (env.root / "daemon.log").read_text()  # nothing runs yet

    async with mcp_client(env, "--no-autostart") as client:  # the shim must not start a daemon itself
        result = await call(client, "echo", {"message": "first"})
        assert not result.is_error and payload(result)["message"] == "first"
    daemon = status(env)["daemon"]
    assert isinstance(daemon, dict)
    assert daemon["pid"] == proc.pid  # the activator exec'd the daemon: no second one was started
    assert daemon["sockets_from_systemd"] == ["mcp", "control"]
    assert daemon["sockets"] == {"mcp": str(env.runtime / "mcp.sock"), "control": str(env.runtime / "control.sock")}
    async with mcp_client(env, "--no-autostart") as client:
        assert not (await call(client, "echo", {"message": "second"})).is_error
    assert status(env)["daemon"]["pid"] == proc.pid  # type: ignore[index]
    text = env.run("status").stdout
    assert "(from systemd: mcp, control)" in text


@needs_activate
def test_diagd_status_starts_it_and_unnamed_sockets_are_told_apart_by_their_paths(
        env: Env, activated: list[subprocess.Popen[bytes]]) -> None:
    # diagd.socket's fds all carry the one FileDescriptorName: the daemon matches them by address.
    # The order is swapped on purpose (fd 3 is control.sock).
    proc = activator(env, "control.sock", "mcp.sock")
    activated.append(proc)
    daemon = status(env)["daemon"]
    assert isinstance(daemon, dict)
    assert daemon["pid"] == proc.pid
    assert sorted(daemon["sockets_from_systemd"]) == ["control", "mcp"]
    done = env.run("call", "echo", "message=hi", "resource=child-env", "--visibility", "off")
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)["child_pid"]
    # A child of the daemon inherits neither the LISTEN_* variables nor the listening sockets.
    environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
    assert not [v for v in environ if v.startswith(b"LISTEN_")]
    inherited = {os.readlink(f"/proc/{child}/fd/{fd}") for fd in os.listdir(f"/proc/{child}/fd")}
    assert not [target for target in inherited if target.startswith("socket:")]
    # The sockets are systemd's: the daemon leaves the files in place when it exits.
    proc.terminate()
    assert proc.wait(timeout=20) == 0
    assert (env.runtime / "mcp.sock").exists() and (env.runtime / "control.sock").exists()


# What systemd does after fork, in the child: the fds from 3 on, LISTEN_PID = its own pid, exec.
LAUNCH = """
import os, sys
fd, program = int(sys.argv[1]), sys.argv[2]
os.dup2(fd, 3)
os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid()) if sys.argv[3] == "self" else sys.argv[3]
os.execv(program, [program, "serve"])
"""


def launch_with_fd3(env: Env, fd: int, *, pid: str = "self", names: str | None = None,
                    **popen: object) -> subprocess.Popen[str]:
    """`diagd serve` with `fd` as its fd 3, LISTEN_FDS=1 and LISTEN_PID as systemd sets them."""
    variables = {**env.vars, "LISTEN_FDS": "1"}
    if names is not None:
        variables["LISTEN_FDNAMES"] = names
    return subprocess.Popen([sys.executable, "-c", LAUNCH, str(fd), DIAGD, pid], env=variables, pass_fds=(fd,),
                            text=True, **popen)  # type: ignore[call-overload]


def _socket(family: int, kind: int, *, bind: str | None = None, listen: bool = False) -> socket.socket:
    s = socket.socket(family, kind)
    if bind is not None:
        s.bind(bind)
    if listen:
        s.listen()
    return s


@pytest.mark.parametrize(("what", "says"), [
    ("pipe", "is not a socket"),
    ("datagram", "is an AF_UNIX SOCK_DGRAM socket, not an AF_UNIX stream socket"),
    ("not listening", "is a socket that is not listening"),
    ("tcp", "is an AF_INET SOCK_STREAM socket"),
    ("unknown socket", "other.sock) is none of diagd's sockets: mcp (mcp.sock), control (control.sock)"),
])
def test_an_inherited_fd_that_is_not_one_of_our_listening_sockets_is_a_coded_error(env: Env, what: str, says: str
                                                                                   ) -> None:
    env.runtime.mkdir(mode=0o700)
    r, w = os.pipe()
    keep: list[socket.socket] = []
    if what == "datagram":
        keep.append(_socket(socket.AF_UNIX, socket.SOCK_DGRAM, bind=str(env.runtime / "mcp.sock")))
    elif what == "not listening":
        keep.append(_socket(socket.AF_UNIX, socket.SOCK_STREAM, bind=str(env.runtime / "mcp.sock")))
    elif what == "tcp":
        keep.append(_socket(socket.AF_INET, socket.SOCK_STREAM, bind=("127.0.0.1", 0), listen=True))
    elif what == "unknown socket":
        keep.append(_socket(socket.AF_UNIX, socket.SOCK_STREAM, bind=str(env.runtime / "other.sock"), listen=True))
    try:
        proc = launch_with_fd3(env, keep[0].fileno() if keep else r, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _out, err = proc.communicate(timeout=60)
    finally:
        for s in keep:
            s.close()
        os.close(r)
        os.close(w)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("diagd: INVALID_ARGUMENT: socket activation: fd 3 ") and says in last
    assert "Traceback" not in err
    assert not (env.runtime / "control.sock").exists()  # refused before serving anything


def test_listen_fds_meant_for_another_process_are_ignored(env: Env) -> None:
    # LISTEN_PID names someone else (variables a parent leaked): the daemon binds its own sockets.
    env.runtime.mkdir(mode=0o700)
    r, w = os.pipe()
    try:
        proc = launch_with_fd3(env, r, pid="1", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_path(env.runtime / "control.sock", proc)
            daemon = status(env)["daemon"]
            assert isinstance(daemon, dict) and daemon["sockets_from_systemd"] == []
        finally:
            proc.terminate()
            assert proc.wait(timeout=20) == 0
    finally:
        os.close(r)
        os.close(w)
