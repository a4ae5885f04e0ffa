"""The sandbox launcher on the real kernel: a confined Python (the drgn worker's kind of child) tries to
leave its policy, and the kernel refuses. Needs root; the Landlock tests need Landlock (this machine has ABI
7), the exec denial (seccomp) and the environment allow-list run both with Landlock and without it. Each
escape runs on a cold launcher and on a standby (`sandbox.standby`: started first, handed the run on its
stdin), which must hold the tool exactly as tight."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from diagd.actors import sandbox
from diagd.actors.sandbox import kernel, standby
from diagd.protocol.errors import DiagdError, ErrorCode

needs_landlock = pytest.mark.skipif(kernel.landlock_abi() < 1, reason="the kernel has no Landlock")
needs_seccomp = pytest.mark.skipif(not kernel.seccomp_available(), reason="no seccomp filter here (x86-64 only)")
LANDLOCK = [pytest.param(True, id="landlock", marks=needs_landlock), pytest.param(False, id="no-landlock")]
PYTHON = os.path.realpath(sys.executable)


@pytest.fixture(params=["cold", "standby"])
def launch(request: pytest.FixtureRequest) -> str:
    """How the confined tool is started: a launcher per run, or a standby handed the run."""
    return str(request.param)


def start_standby() -> subprocess.Popen[str]:
    """A standby launcher as the daemon starts one: the daemon's environment, stdin a pipe."""
    return subprocess.Popen([*sandbox.launcher_prefix(), standby.STANDBY], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def request(argv: list[str], env: dict[str, str] | None) -> str:
    """What the daemon writes to a standby for the launcher command `argv` with environment `env`."""
    args = standby.request_of(argv)
    assert args is not None, argv
    return json.dumps({"args": args, "env": dict(os.environ) if env is None else env})


def python_policy(tmp_path: Path, **changes: object) -> sandbox.Policy:
    """What a confined Python needs (the drgn worker's policy without the dump), writing only tmp_path/out."""
    (tmp_path / "out").mkdir(exist_ok=True)
    base = sandbox.Policy(read=(*sandbox.SYSTEM_READ, *sandbox.python_read_paths()),
                           write=(str(tmp_path / "out"),), exec=(PYTHON,), die_with=None)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def run_confined(tmp_path: Path, launch: str, *parts: str, policy: sandbox.Policy | None = None,
                 env: dict[str, str] | None = None) -> dict[str, object]:
    """Run the code parts (which fill the dict `r`) in a confined Python started by `launch` (the
    fixture); returns r."""
    script = tmp_path / "probe.py"
    code = "\n".join(textwrap.dedent(part).strip() for part in parts)
    script.write_text(f"import json, os, socket, subprocess, sys\nr = {{}}\n{code}\nprint(json.dumps(r))\n")
    policy = policy or python_policy(tmp_path)
    policy = dataclasses.replace(policy, read=(*policy.read, str(script)))
    argv = sandbox.wrap([sys.executable, "-I", str(script)], policy)
    if launch == "standby":
        proc = start_standby()
        out, err = proc.communicate(request(argv, env), timeout=60)
        done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def attempt(expr: str, key: str) -> str:
    return textwrap.dedent(f"""\
        try:
            {expr}
            r[{key!r}] = "ok"
        except OSError as e:
            r[{key!r}] = type(e).__name__
        """)


@needs_landlock
def test_a_confined_process_reads_only_its_allow_list(tmp_path: Path, launch: str) -> None:
    readable = tmp_path / "out" / "mine.txt"
    (tmp_path / "out").mkdir()
    readable.write_text("mine")
    r = run_confined(tmp_path, launch, attempt("open('/etc/shadow').read()", "shadow"),
                     attempt("os.listdir('/root')", "root"),
                     attempt(f"open({str(readable)!r}).read()", "mine"),
                     attempt("open('/usr/lib/os-release').read()", "system"))
    assert r == {"shadow": "PermissionError", "root": "PermissionError", "mine": "ok", "system": "ok"}


@needs_landlock
def test_a_confined_process_writes_only_its_own_directory(tmp_path: Path, launch: str) -> None:
    out = tmp_path / "out"
    r = run_confined(tmp_path, launch, attempt(f"open({str(tmp_path / 'escaped')!r}, 'w')", "outside"),
                     attempt("open('/var/tmp/diagd-escape-test', 'w')", "var_tmp"),
                     attempt(f"open({str(out / 'inside')!r}, 'w').write('x')", "inside"),
                     attempt(f"os.rename({str(out / 'inside')!r}, {str(out / 'renamed')!r})", "rename"),
                     attempt(f"os.mknod({str(out / 'mem')!r}, 0o600 | 0o020000, os.makedev(1, 1))", "mknod"))
    assert r == {"outside": "PermissionError", "var_tmp": "PermissionError", "inside": "ok", "rename": "ok",
                 "mknod": "PermissionError"}
    assert not (tmp_path / "escaped").exists() and (out / "renamed").read_text() == "x"


@needs_landlock
def test_a_confined_process_cannot_start_a_shell_or_any_other_program(tmp_path: Path, launch: str) -> None:
    r = run_confined(tmp_path, launch, """
        r["system"] = os.system("id > /dev/null 2>&1")
        """, attempt("subprocess.run(['/usr/bin/id'])", "id"), attempt("subprocess.run(['/bin/sh', '-c', 'id'])", "sh"),
                     attempt(f"open({str(tmp_path / 'out' / 'tool')!r}, 'w').write('#!/bin/sh')", "drop"))
    assert r["system"] != 0 and r["id"] == "PermissionError" and r["sh"] == "PermissionError"
    assert r["drop"] == "ok" and not os.access(tmp_path / "out" / "tool", os.X_OK)


@needs_landlock
def test_deny_exec_forbids_even_the_interpreter_that_was_allowed(tmp_path: Path, launch: str) -> None:
    r = run_confined(tmp_path, launch, "from diagd.actors.sandbox.kernel import deny_exec",
                     attempt(f"subprocess.run([{PYTHON!r}, '-c', 'pass'], check=True)", "before"),
                     'r["denied"] = deny_exec()',
                     attempt(f"subprocess.run([{PYTHON!r}, '-c', 'pass'], check=True)", "after"))
    assert r == {"before": "ok", "denied": {"seccomp": kernel.seccomp_available(), "landlock": True},
                 "after": "PermissionError"}


@needs_landlock
def test_a_confined_process_has_no_network_and_no_unix_sockets_but_socketpairs(tmp_path: Path, launch: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # like /run/systemd/private
    path = str(tmp_path / "private")
    listener.bind(path)
    listener.listen()
    tcp = socket.create_server(("127.0.0.1", 0))
    try:
        r = run_confined(tmp_path, launch, attempt(f"socket.socket(socket.AF_UNIX).connect({path!r})", "unix"),
                         attempt(f"socket.create_connection(('127.0.0.1', {tcp.getsockname()[1]}), 5)", "tcp"),
                         attempt("socket.socket(socket.AF_INET6)", "inet6"),
                         attempt("socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)", "netlink"),
                         attempt("socket.socketpair()", "pair"))
    finally:
        listener.close()
        tcp.close()
    assert r == {"unix": "OSError", "tcp": "OSError", "inet6": "OSError", "netlink": "OSError", "pair": "ok"}


@needs_landlock
def test_a_confined_root_process_holds_no_capabilities_and_cannot_signal_outside(tmp_path: Path, launch: str) -> None:
    r = run_confined(tmp_path, launch, """
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        r["caps"] = [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd")]
        r["nnp"] = status["NoNewPrivs"].strip()
        r["report"] = json.loads(os.environ["DIAGD_SANDBOX"])
        """, attempt(f"os.kill({os.getpid()}, 0)", "signal"),
                     policy=python_policy(tmp_path, read=(*python_policy(tmp_path).read, "/proc")))
    assert r["caps"] == ["0000000000000000"] * 3 and r["nnp"] == "1"
    assert r["signal"] == "PermissionError"  # Landlock ABI 6 scopes signals to the sandbox
    report = r["report"]
    assert isinstance(report, dict) and report["landlock"] == kernel.landlock_abi() and report["seccomp"]


@needs_landlock
def test_the_landlock_step_is_skipped_when_the_policy_says_unavailable(tmp_path: Path, launch: str) -> None:
    r = run_confined(tmp_path, launch, attempt("open('/etc/shadow').read()", "shadow"),
                     policy=python_policy(tmp_path, landlock=False))
    assert r == {"shadow": "ok"}


@needs_landlock
def test_a_private_tmp_keeps_the_real_tmp_out_but_the_session_paths_in(tmp_path: Path, launch: str) -> None:
    own_tmp = tmp_path / "out" / "tmp"
    marker = f"diagd-confine-{os.getpid()}"
    r = run_confined(tmp_path, launch, attempt(f"open('/tmp/{marker}', 'w').write('x')", "write_tmp"),
                     attempt(f"os.listdir({str(tmp_path / 'out')!r})", "session_dir"),
                     "r['tmp'] = sorted(os.listdir('/tmp'))",
                     policy=python_policy(tmp_path, private_tmp=str(own_tmp),
                                          write=(str(tmp_path / "out"), str(own_tmp))))
    assert r["write_tmp"] == "ok" and r["session_dir"] == "ok"
    assert (own_tmp / marker).read_text() == "x" and not Path(f"/tmp/{marker}").exists()
    assert "diagd-0" not in r["tmp"]  # the daemon's runtime directory under the real /tmp is out of sight


@needs_landlock
def test_the_tool_dies_with_the_daemon_even_when_its_forking_thread_is_long_gone(tmp_path: Path, launch: str) -> None:
    # A stand-in daemon forks the tool (or the standby it then hands the tool's run) from a thread that
    # exits at once (as Trio's cached worker threads do), then is SIGKILLed: the death link must end the tool.
    daemon = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import json, os, subprocess, sys, threading, time
        from diagd.actors import sandbox
        from diagd.actors.sandbox import standby
        policy = sandbox.Policy(read=(*sandbox.SYSTEM_READ, *sandbox.python_read_paths()), exec=({PYTHON!r},))
        argv = sandbox.wrap([{PYTHON!r}, "-c", "import time; time.sleep(600)"], policy)
        box = []
        if {launch!r} == "standby":
            t = threading.Thread(target=lambda: box.append(subprocess.Popen(
                [*sandbox.launcher_prefix(), standby.STANDBY], stdin=subprocess.PIPE)))
            t.start(); t.join()
            time.sleep(0.5)  # it waits, imported, before the go
            box[0].stdin.write(json.dumps({{"args": standby.request_of(argv), "env": dict(os.environ)}}).encode())
            box[0].stdin.close()
        else:
            t = threading.Thread(target=lambda: box.append(subprocess.Popen(argv)))
            t.start(); t.join()
        print(box[0].pid, flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None
    tool = int(daemon.stdout.readline())
    time.sleep(0.5)  # past the point where a PDEATHSIG bound to the exited thread would already have fired
    assert _alive(tool) and "time.sleep(600)" in Path(f"/proc/{tool}/cmdline").read_text()
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    deadline = time.monotonic() + 10
    while _alive(tool):
        assert time.monotonic() < deadline, "the confined tool outlived its daemon"
        time.sleep(0.05)


def test_a_standby_is_confined_by_nothing_before_its_run_and_runs_nothing_without_one(tmp_path: Path) -> None:
    """Every step is taken after the go, for that run: before it, the standby is the daemon's plain child.
    At EOF without a request (retired, or its daemon died) it leaves with 0; a malformed one starts nothing."""
    ours = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    waiting = start_standby()
    time.sleep(0.3)
    status = dict(line.split(":", 1) for line in Path(f"/proc/{waiting.pid}/status").read_text().splitlines())
    assert [status[k].strip() for k in ("NoNewPrivs", "Seccomp", "CapBnd")] == \
        ["0", "0", ours["CapBnd"].strip()]
    assert waiting.communicate("", timeout=30) == ("", "") and waiting.returncode == 0
    for bad in ("[]", json.dumps({"args": ["{}", "--"], "env": {}}),
                json.dumps({"args": [json.dumps({"supervise": True, "die_with": os.getpid()}), "--", "/bin/true"],
                            "env": {}})):
        refused = start_standby()
        out, err = refused.communicate(bad, timeout=30)
        assert refused.returncode == 2 and out == "" and "diagd sandbox: a standby" in err, (bad, err)


def children_of(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def wait_gone(pids: list[int], what: str) -> None:
    deadline = time.monotonic() + 10
    while alive := [pid for pid in pids if _alive(pid)]:
        assert time.monotonic() < deadline, f"{what}: {alive}"
        time.sleep(0.05)


@needs_landlock
def test_the_watchdog_leaves_as_soon_as_its_tool_ends_by_itself(tmp_path: Path, launch: str) -> None:
    # Landlock's signal scope keeps the kernel's parent-death signal from the sandboxed tool to its
    # unsandboxed watchdog: without its own watch on the tool, one watchdog per run piled up under init.
    # A standby forks its watchdog while it waits (its only child then) and hands it the run's death link.
    policy = dataclasses.replace(python_policy(tmp_path), die_with=os.getpid(), deadline_s=600)
    marker = f"watchdog-test-{os.getpid()}-{time.monotonic_ns()}"
    argv = sandbox.wrap([PYTHON, "-c", "import time; time.sleep(0.3)", marker], policy)
    if launch == "standby":
        tool = start_standby()
        deadline = time.monotonic() + 10
        while not (early := children_of(tool.pid)):
            assert time.monotonic() < deadline, "the standby forked no watchdog"
            time.sleep(0.02)
        _out, err = tool.communicate(request(argv, None), timeout=30)
        assert tool.returncode == 0, err
        wait_gone(early, "the standby's watchdog outlived its tool")
    else:
        assert subprocess.Popen(argv).wait(timeout=30) == 0

    def watchdogs() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                pass
        return found

    wait_gone(watchdogs(), "watchdogs outlived their tool")


def test_a_standbys_watchdog_leaves_with_a_run_that_needs_none_or_with_no_run(tmp_path: Path) -> None:
    for handed in (request(sandbox.wrap([PYTHON, "-c", "import time; time.sleep(0.3)"],
                                        dataclasses.replace(python_policy(tmp_path), landlock=False)), None), ""):
        waiting = start_standby()
        deadline = time.monotonic() + 10
        while not (watchdog := children_of(waiting.pid)):
            assert time.monotonic() < deadline, "the standby forked no watchdog"
            time.sleep(0.02)
        waiting.communicate(handed, timeout=30)
        assert waiting.returncode == 0
        wait_gone(watchdog, "a watchdog with nothing to watch stayed")


@needs_landlock
def test_unconfined_features_are_refused_with_the_reason_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox.require_confinement("drgn code", allowed_unconfined=False, setting="[crash] allow_unconfined")
    monkeypatch.setenv(sandbox.FORCE_ENV, "off")
    with pytest.raises(DiagdError) as refused:
        sandbox.require_confinement("drgn code", allowed_unconfined=False, setting="[crash] allow_unconfined")
    assert refused.value.code == ErrorCode.PERMISSION_DENIED
    assert "Landlock" in refused.value.message and "[crash] allow_unconfined = true" in refused.value.details["hint"]
    sandbox.require_confinement("drgn code", allowed_unconfined=True, setting="[crash] allow_unconfined")


@needs_landlock
def test_wrap_resolves_the_tool_and_allows_executing_only_it_and_its_loader() -> None:
    argv = sandbox.wrap(["crash", "--version"], sandbox.Policy(die_with=None))
    policy = json.loads(argv[argv.index("--") - 1])
    assert argv[:4] == [sys.executable, "-I", "-S", sandbox.LAUNCHER] and argv[-2:] == ["crash", "--version"]
    assert policy["executable"] == os.path.realpath("/usr/bin/crash")
    assert policy["exec"] == [policy["executable"], sandbox.elf_interpreter("/usr/bin/crash")]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


EXEC_ATTEMPTS = (attempt("subprocess.run(['/usr/bin/id'])", "id"),
                 attempt("subprocess.run(['/bin/sh', '-c', 'id'])", "sh"),
                 attempt(f"subprocess.run([{PYTHON!r}, '-c', 'pass'])", "python"),
                 attempt("os.execve(os.open('/usr/bin/id', os.O_RDONLY), ['id'], {})", "execveat"))
DENIED = {"id": "PermissionError", "sh": "PermissionError", "python": "PermissionError",
          "execveat": "PermissionError"}


@needs_seccomp
@pytest.mark.parametrize("landlock", LANDLOCK)
def test_after_the_launchers_exec_no_program_can_be_started_with_or_without_landlock(
        tmp_path: Path, landlock: bool, launch: str) -> None:
    # The tool itself (Python here) was started by the launcher's one allowed execve; nothing after it.
    # Everything executable is allowed to Landlock, so only the seccomp filter can be what refuses.
    policy = python_policy(tmp_path, landlock=landlock, exec_once=True, read=(*python_policy(tmp_path).read, "/proc"),
                           exec=(PYTHON, "/usr/bin", "/bin"))
    r = run_confined(tmp_path, launch, 'r["system"] = os.system("id > /dev/null 2>&1")', *EXEC_ATTEMPTS, """
        r["report"] = json.loads(os.environ["DIAGD_SANDBOX"])
        r["maps"] = [line for line in open("/proc/self/maps") if line.startswith("100000000000-")]
        """, policy=policy)
    report = r.pop("report")
    assert isinstance(report, dict) and report["exec"]
    assert report["landlock"] == (kernel.landlock_abi() if landlock else 0)
    assert r.pop("system") != 0 and r.pop("maps") == []  # the launcher's buffer is gone with its image
    assert r == DENIED


@needs_seccomp
@pytest.mark.parametrize("landlock", LANDLOCK)
def test_deny_exec_needs_no_landlock(tmp_path: Path, landlock: bool, launch: str) -> None:
    """The drgn worker's own step: from inside a running process, execve is gone (seccomp)."""
    r = run_confined(tmp_path, launch, "from diagd.actors.sandbox.kernel import deny_exec",
                     attempt(f"subprocess.run([{PYTHON!r}, '-c', 'pass'], check=True)", "before"),
                     'r["denied"] = deny_exec(landlock=False)', *EXEC_ATTEMPTS,
                     policy=python_policy(tmp_path, landlock=landlock, exec=(PYTHON, "/usr/bin", "/bin")))
    assert r.pop("before") == "ok" and r.pop("denied") == {"seccomp": True, "landlock": False}
    assert r == DENIED


@pytest.mark.parametrize("landlock", LANDLOCK)
def test_a_confined_tool_sees_only_the_environment_allow_list(tmp_path: Path, landlock: bool, launch: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC", "DIAGD_TEST_SECRET": "hunter2",
           "PYTHONPATH": str(tmp_path), "LD_PRELOAD": "/nonexistent.so", "HOME": str(tmp_path),
           "CRASH_EXTENSIONS": str(tmp_path), "CRASHPAGER": "/bin/sh"}
    r = run_confined(tmp_path, launch, 'r["env"] = dict(os.environ)',
                     policy=python_policy(tmp_path, landlock=landlock), env=env)
    seen = r["env"]
    assert isinstance(seen, dict)
    assert json.loads(seen.pop("DIAGD_SANDBOX"))["landlock"] == (kernel.landlock_abi() if landlock else 0)
    assert seen == {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_TIME": "C", "TZ": "UTC", "HOME": "/nonexistent"}


def test_an_allowed_dir_holding_diagds_state_dir_grants_everything_in_it_but_the_state_dir(tmp_path: Path,
                                                                                          launch: str) -> None:
    # allowed_dirs = [home] while the state dir is home/.local/state/diagd: a drgn or crash child may read
    # the home directory's files, never the state dir's (other clients' outputs, serial logs, the audit log).
    home = tmp_path / "home"
    state = home / ".local" / "state" / "diagd"
    (state / "serial").mkdir(parents=True)
    (state / "audit.jsonl").write_text("secret")
    (home / ".local" / "share").mkdir()
    (home / ".local" / "share" / "ok.txt").write_text("ok")
    (home / "dump.txt").write_text("ok")
    (home / "to-state").symlink_to(state)
    granted = sandbox.readable_beside([str(home)], [str(state)])
    assert str(home / "dump.txt") in granted and str(home / ".local" / "share") in granted
    assert not any(g == str(home) or g.startswith(str(state)) or g.endswith("to-state") for g in granted), granted
    assert sandbox.readable_beside([str(state / "serial")], [str(state)]) == ()
    assert sandbox.readable_beside([str(home)], []) == (str(home),)
    policy = python_policy(tmp_path)
    r = run_confined(tmp_path, launch, attempt(f"open({str(state / 'audit.jsonl')!r}).read()", "audit"),
                     attempt(f"open({str(home / 'to-state' / 'audit.jsonl')!r}).read()", "link"),
                     attempt(f"open({str(home / 'dump.txt')!r}).read()", "dump"),
                     attempt(f"open({str(home / '.local' / 'share' / 'ok.txt')!r}).read()", "share"),
                     policy=dataclasses.replace(policy, read=(*policy.read, *granted)))
    assert r == {"audit": "PermissionError", "link": "PermissionError", "dump": "ok", "share": "ok"}
