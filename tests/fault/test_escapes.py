"""The attacks of issue 9, each tried the way an agent steered by hostile text would, on the default
configuration (no `allow_*` setting changed). Each must fail: a coded error, or a result that shows
the attempt achieved nothing. Effects are checked, not words: a marker file a shell would create,
/etc/shadow's content, a file written outside the session's directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIAGD, DaemonProcess, start_daemon
from tests.fault.conftest import SMALL_PCAP, RichDaemon, fault_env, needs_crash, needs_sharkd, open_session
from tests.fault.helpers import ControlClient, assert_coded_error, input_schema
from tests.pcaps import PCAPS
from tests.support.bpftrace_harness import ensure_tracefs, needs_bpftrace
from tests.support.procs import children

pytestmark = [pytest.mark.e2e, pytest.mark.fault]

SHADOW_MARK = "root:"  # the first field of /etc/shadow's first line on every Debian system
_markers = count()


def marker() -> Path:
    """A path in /tmp that only a successful escape would create."""
    path = Path(f"/tmp/diagd-fault-escape-{os.getpid()}-{next(_markers)}")
    path.unlink(missing_ok=True)
    return path


@pytest.fixture(autouse=True)
def no_markers_left() -> Iterator[None]:
    """A marker only exists when an escape worked (the test then fails): remove it either way."""
    yield
    for path in Path("/tmp").glob(f"diagd-fault-escape-{os.getpid()}-*"):
        path.unlink(missing_ok=True)


def everything(answer: tuple[bool, dict[str, Any]]) -> str:
    return repr(answer[1])


@pytest.fixture
def escape_session(rich_daemon: RichDaemon) -> str:
    """A session of its own (`--hex` gives it another key), joined again by every test: a successful
    escape may break it (gdb logging crashes gdb, an exec replaces the drgn worker), and a failed
    session is replaced by a fresh one on the next open, so each test starts from a working session."""
    if rich_daemon.fixture is None:
        pytest.skip("crash is not installed")
    session_id: str = open_session(rich_daemon.daemon, rich_daemon.fixture, "--hex", client="escape")["session_id"]
    return session_id


def crash(rich: RichDaemon, session_id: str, command: str) -> tuple[bool, dict[str, Any]]:
    with rich.control(client="escape", timeout=120) as c:
        return c.call("run_crash_command", {"command": command, "session_id": session_id, "force_execute": True})


def drgn(rich: RichDaemon, session_id: str, code: str) -> tuple[bool, dict[str, Any]]:
    with rich.control(client="escape", timeout=120) as c:
        return c.call("run_drgn_command", {"code": code, "session_id": session_id})


def assert_refused_or_harmless(answer: tuple[bool, dict[str, Any]], *, forbidden: str = "uid=0(") -> None:
    is_error, payload = answer
    if is_error:
        assert_coded_error(payload)
    assert forbidden not in everything(answer), f"the escape worked: {payload}"


def assert_session_works(rich: RichDaemon, session_id: str) -> None:
    """Both halves still answer: a refusal came from a live session, and the attempt broke nothing."""
    sys_answer = crash(rich, session_id, "sys")
    assert not sys_answer[0] and "PANIC" in sys_answer[1]["output"], f"crash no longer answers: {sys_answer}"
    sum_answer = drgn(rich, session_id, "1 + 1")
    assert not sum_answer[0] and sum_answer[1]["output"] == "2", f"drgn no longer answers: {sum_answer}"


# ---------------------------------------------------------------------------------------------
# crash


GDB_SHELL_SPELLINGS = [
    "gdb she {cmd}", "gdb shel {cmd}", "gdb shell {cmd}", "gdb  she\t{cmd}", "gdb !{cmd}", "gdb ! {cmd}",
    "gdb | p 1 | {cmd}", "gdb pipe p 1 | {cmd}", "gdb pytho import os; os.system('{cmd}')",
    "gdb interpreter-exec console \"shell {cmd}\"", "!{cmd}", "! {cmd}",
]


@needs_crash
@pytest.mark.parametrize("spelling", GDB_SHELL_SPELLINGS)
def test_crash_cannot_run_a_shell_command_by_any_spelling(rich_daemon: RichDaemon, escape_session: str,
                                                          spelling: str) -> None:
    assert_refused_or_harmless(crash(rich_daemon, escape_session, spelling.format(cmd="id")))
    made = marker()
    answer = crash(rich_daemon, escape_session, spelling.format(cmd=f"touch {made}"))
    assert not made.exists(), f"{spelling!r} ran a shell command as root: {answer}"
    assert_refused_or_harmless(answer)
    assert_session_works(rich_daemon, escape_session)


@needs_crash
@pytest.mark.parametrize("body", ["!{cmd}", "gdb she {cmd}", "gdb shell {cmd}"])
def test_a_crash_alias_cannot_smuggle_a_shell_command(rich_daemon: RichDaemon, escape_session: str,
                                                      body: str) -> None:
    made = marker()
    defined = crash(rich_daemon, escape_session, "alias zz " + body.format(cmd=f"touch {made}"))
    used = crash(rich_daemon, escape_session, "zz")
    assert not made.exists(), f"alias {body!r} ran a shell command as root: {defined} / {used}"
    assert_refused_or_harmless(crash(rich_daemon, escape_session, "alias zy " + body.format(cmd="id")))
    assert_refused_or_harmless(crash(rich_daemon, escape_session, "zy"))
    assert_refused_or_harmless(defined)
    assert_refused_or_harmless(used)
    assert_session_works(rich_daemon, escape_session)


@needs_crash
@pytest.mark.parametrize("setting", ["set logging file {path}", "set logg file {path}",
                                     "set logging redirect on", "set trace-commands on"])
def test_gdb_logging_cannot_create_files_or_break_the_session(rich_daemon: RichDaemon, escape_session: str,
                                                              setting: str) -> None:
    made = marker()
    first = crash(rich_daemon, escape_session, "gdb " + setting.format(path=made))
    on = crash(rich_daemon, escape_session, "gdb set logging on")
    enabled = crash(rich_daemon, escape_session, "gdb set logging enabled on")
    assert not made.exists(), f"gdb logging created {made}: {first} / {on} / {enabled}"
    for answer in (first, on, enabled):
        if answer[0]:
            assert_coded_error(answer[1])
    assert_session_works(rich_daemon, escape_session)


# ---------------------------------------------------------------------------------------------
# drgn


@needs_crash
@pytest.mark.parametrize("code", ["import os; os.system({cmd!r})",
                                  "import subprocess; subprocess.run({cmd!r}, shell=True)",
                                  "import os; os.execv('/bin/sh', ['sh', '-c', {cmd!r}])",
                                  "import pty; pty.spawn(['/bin/sh', '-c', {cmd!r}])"])
def test_drgn_code_cannot_start_a_process(rich_daemon: RichDaemon, escape_session: str, code: str) -> None:
    made = marker()
    answer = drgn(rich_daemon, escape_session, code.format(cmd=f"touch {made}; id"))
    assert not made.exists(), f"drgn code started a shell as root: {answer}"
    assert_refused_or_harmless(answer)
    assert_session_works(rich_daemon, escape_session)


@needs_crash
@pytest.mark.parametrize("code", ["open('/etc/shadow').read()", "print(open('/etc/shadow').read())",
                                  "import pathlib; pathlib.Path('/etc/shadow').read_bytes()",
                                  "import os; os.read(os.open('/etc/shadow', os.O_RDONLY), 4096)"])
def test_drgn_code_cannot_read_etc_shadow(rich_daemon: RichDaemon, escape_session: str, code: str) -> None:
    assert_refused_or_harmless(drgn(rich_daemon, escape_session, code), forbidden=SHADOW_MARK)
    assert_session_works(rich_daemon, escape_session)


@needs_crash
def test_drgn_code_cannot_write_outside_its_session_dir(rich_daemon: RichDaemon, escape_session: str) -> None:
    made = marker()
    answer = drgn(rich_daemon, escape_session, f"open({str(made)!r}, 'w').write('escaped')")
    assert not made.exists(), f"drgn code wrote {made}: {answer}"
    if answer[0]:
        assert_coded_error(answer[1])
    state_file = rich_daemon.daemon.env.state / "escaped-by-drgn"
    answer = drgn(rich_daemon, escape_session, f"open({str(state_file)!r}, 'w').write('escaped')")
    assert not state_file.exists(), f"drgn code wrote into the daemon's state dir: {answer}"
    assert_session_works(rich_daemon, escape_session)


# ---------------------------------------------------------------------------------------------
# bpftrace


@needs_bpftrace
@pytest.mark.parametrize("program", ['BEGIN { cat("/etc/shadow"); exit(); }',
                                     'BEGIN { cat("/etc/../etc/shadow"); exit(); }',
                                     'BEGIN { cat("%s", "/etc/shadow"); exit(); }'])
def test_bpftrace_cat_cannot_read_etc_shadow(rich_daemon: RichDaemon, program: str) -> None:
    ensure_tracefs()
    with rich_daemon.control(client="escape", timeout=60) as c:
        started = c.call("exec_program", {"program": program, "timeout": 3})
        if started[0]:  # refused up front: with a reason, not because bpftrace is unavailable
            assert_refused_or_harmless(started, forbidden=SHADOW_MARK)
            assert started[1]["code"] in ("INVALID_ARGUMENT", "PERMISSION_DENIED"), started
            return
        done = c.call("get_result", {"execution_id": started[1]["execution_id"], "wait_s": 20, "until": "done",
                                     "limit": 10000})
    assert_refused_or_harmless(done, forbidden=SHADOW_MARK)


# ---------------------------------------------------------------------------------------------
# The runtime directory


def serve_in(runtime: Path, root: Path) -> subprocess.CompletedProcess[str] | None:
    """Run `diagd serve` with this runtime dir; None if it started serving (it is then stopped)."""
    env = fault_env(root, "[daemon]\n", "rt")
    proc = subprocess.Popen([DIAGD, "serve"], env={**env.vars, "DIAGD_RUNTIME_DIR": str(runtime)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=20)
        return None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """Another user's directory (mode 0755, owned by nobody) and a symlink to it where the runtime dir goes."""
    target = tmp_path / "planted"
    target.mkdir()
    os.chown(target, 65534, 65534)
    os.chmod(target, 0o755)
    link = Path(f"/tmp/diagd-fault-link-{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    os.lchown(link, 65534, 65534)
    yield target, link
    link.unlink(missing_ok=True)


def assert_untouched(target: Path) -> None:
    st = target.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o755), "the daemon took the planted directory over"
    assert list(target.iterdir()) == [], f"the daemon created {list(target.iterdir())} in the planted directory"


def test_a_symlinked_runtime_dir_is_refused_and_its_target_left_alone(planted: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    target, link = planted
    done = serve_in(link, tmp_path / "serve")
    assert done is not None, "diagd serve ran with its runtime dir behind a symlink"
    assert done.returncode != 0 and str(link) in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert_untouched(target)


def test_a_symlink_to_a_directory_of_ours_is_refused_as_runtime_dir(tmp_path: Path) -> None:
    """Even a link to a private directory we own: whoever planted the link chose where our sockets go."""
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    link = Path(f"/tmp/diagd-fault-ourlink-{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(ours)
    os.lchown(link, 65534, 65534)
    try:
        done = serve_in(link, tmp_path / "serve")
    finally:
        link.unlink()
    assert done is not None, "diagd serve ran with its runtime dir behind a symlink"
    assert done.returncode != 0 and str(link) in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert list(ours.iterdir()) == [], f"the daemon created {list(ours.iterdir())} behind the symlink"


def test_a_runtime_dir_owned_by_another_user_is_refused(planted: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = planted
    done = serve_in(target, tmp_path / "serve")
    assert done is not None, "diagd serve ran in a runtime dir owned by another user"
    assert done.returncode != 0 and str(target) in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert_untouched(target)


def test_a_symlinked_parent_of_the_runtime_dir_is_refused(planted: tuple[Path, Path], tmp_path: Path) -> None:
    target, link = planted
    done = serve_in(link / "diagd", tmp_path / "serve")
    assert done is not None, "diagd serve ran with a runtime dir under a symlink to another user's directory"
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert_untouched(target)


# ---------------------------------------------------------------------------------------------
# Catastrophic regexes: each on a daemon of its own, because today one freezes the daemon for good


CATASTROPHIC = r"(\w+\s?)+$"


@pytest.fixture
def regex_daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    env = fault_env(tmp_path / "regex", f'[daemon]\nallowed_dirs = ["{PCAPS}"]\n', "re")
    daemon = start_daemon(env)
    try:
        yield daemon
    finally:
        stop_hard(daemon)
        shutil.rmtree(env.runtime, ignore_errors=True)


def stop_hard(daemon: DaemonProcess) -> None:
    """SIGTERM; a daemon frozen by a regex ignores it, so then SIGKILL it and the children it started."""
    kids = [p.pid for p in children(daemon.proc.pid)]
    daemon.proc.terminate()
    try:
        daemon.proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        daemon.proc.kill()
        daemon.proc.wait(timeout=10)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def assert_regex_does_not_stall(daemon: DaemonProcess, tool: str, args: dict[str, Any]) -> None:
    """The hostile call ends with a result or TIMEOUT/INVALID_ARGUMENT while another client keeps being served."""
    answers: list[tuple[bool, dict[str, Any]] | BaseException] = []

    def hostile() -> None:
        try:
            with ControlClient(daemon.control_socket, client="hostile", timeout=150) as c:
                answers.append(c.call(tool, args))
        except BaseException as exc:  # reported by the test, not lost in the thread
            answers.append(exc)

    thread = threading.Thread(target=hostile, daemon=True)
    thread.start()
    with ControlClient(daemon.control_socket, client="bystander", timeout=10) as other:
        while thread.is_alive():
            try:
                assert other.ok("diagd_status")["daemon"]["pid"] == daemon.proc.pid
            except TimeoutError:
                raise AssertionError(f"the daemon stopped serving others while {tool} ran {CATASTROPHIC!r}") from None
            time.sleep(0.2)
    thread.join(timeout=150)
    assert answers, f"{tool} never answered"
    answer = answers[0]
    assert not isinstance(answer, BaseException), f"{tool} got no answer: {answer!r}"
    is_error, payload = answer
    if is_error:
        assert assert_coded_error(payload) in ("TIMEOUT", "INVALID_ARGUMENT"), payload
    assert other_still_answers(daemon)


def other_still_answers(daemon: DaemonProcess) -> bool:
    with ControlClient(daemon.control_socket, client="after", timeout=15) as c:
        return bool(c.ok("diagd_status")["daemon"]["pid"] == daemon.proc.pid)


@needs_sharkd
def test_a_catastrophic_regex_in_pcap_text_search_does_not_stall_the_daemon(regex_daemon: DaemonProcess) -> None:
    assert_regex_does_not_stall(regex_daemon, "pcap_text_search",
                                {"pcap_path": str(PCAPS / SMALL_PCAP), "query": CATASTROPHIC, "is_regex": True})


@needs_sharkd
def test_a_catastrophic_regex_in_pcap_list_fields_does_not_stall_the_daemon(regex_daemon: DaemonProcess) -> None:
    assert_regex_does_not_stall(regex_daemon, "pcap_list_fields", {"query": CATASTROPHIC, "is_regex": True,
                                                                    "limit": 5})


@needs_crash
def test_a_catastrophic_regex_in_search_command_output_does_not_stall_the_daemon(
        rich_daemon: RichDaemon, regex_daemon: DaemonProcess) -> None:
    # A stored output with long word runs, made by the rich daemon's session and copied to the regex
    # daemon's state dir: stored outputs are readable by any daemon on that state dir, and this one
    # may freeze for good without harming the session the other tests use.
    assert rich_daemon.session_id is not None
    with rich_daemon.control(client="setup") as c:
        stored = c.ok("run_drgn_command", {"code": "for i in range(200): print('w' * 60 + '!')",
                                           "session_id": rich_daemon.session_id})
    session_dir = rich_daemon.daemon.env.state / "crash" / rich_daemon.session_id
    shutil.copytree(session_dir, regex_daemon.env.state / "crash" / rich_daemon.session_id)
    args: dict[str, Any] = {"command_id": stored["command_id"], "query": CATASTROPHIC}
    if "is_regex" in input_schema(regex_daemon, "search_command_output")["properties"]:
        args["is_regex"] = True  # today the query is always a regex; a fix may make that opt-in
    assert_regex_does_not_stall(regex_daemon, "search_command_output", args)
