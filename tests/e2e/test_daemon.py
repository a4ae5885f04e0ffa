"""The daemon process and its CLI: sockets and their hygiene, garbage, signals, autostart, banners."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import time
from pathlib import Path

import msgpack
import pytest

from diagd.protocol import control
from tests.conftest import DIAGD, DaemonProcess, Env, start_daemon, wait_for_path
from tests.support.raw import INITIALIZE, RawMCP

pytestmark = pytest.mark.e2e


def control_connect(daemon: DaemonProcess) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(daemon.control_socket))
    return sock


def read_frame(sock: socket.socket) -> control.Message | None:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            return None
        header += chunk
    length = struct.unpack(">I", header)[0]
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return control.decode(body)


def frame(obj: object) -> bytes:
    body = msgpack.packb(obj)
    return struct.pack(">I", len(body)) + body


def assert_alive(daemon: DaemonProcess) -> None:
    assert daemon.proc.poll() is None
    with control.BlockingClient(str(daemon.control_socket), client="test", timeout=10) as client:
        assert client.request(control.StatusRequest)["daemon"]["pid"] == daemon.proc.pid


def test_socket_directory_is_owner_only_and_sockets_are_0600(daemon: DaemonProcess) -> None:
    assert stat.S_IMODE(daemon.env.runtime.stat().st_mode) == 0o700
    for sock in (daemon.mcp_socket, daemon.control_socket):
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_a_connection_from_another_uid_is_refused(daemon: DaemonProcess) -> None:
    # Open the file-permission door on purpose: SO_PEERCRED must still refuse the peer.
    os.chmod(daemon.env.runtime, 0o711)
    os.chmod(daemon.mcp_socket, 0o666)
    pid = os.fork()
    if pid == 0:  # child: become nobody, connect, report whether the daemon answered
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            raw = RawMCP(daemon.mcp_socket, timeout=5)  # connecting works: the file mode allows it
            try:
                raw.send(INITIALIZE)
                code = 0 if raw.read_line() is None else 1
            except (ConnectionResetError, BrokenPipeError):
                code = 0  # closed on us: refused
        except Exception:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    os.chmod(daemon.mcp_socket, 0o600)
    os.chmod(daemon.env.runtime, 0o700)
    assert os.waitstatus_to_exitcode(status) == 0, "the daemon answered a foreign uid"
    assert "refused connection from another uid" in daemon.log()
    assert_alive(daemon)


def test_garbage_on_the_mcp_socket_gets_json_rpc_errors_and_the_connection_lives(daemon: DaemonProcess) -> None:
    raw = RawMCP(daemon.mcp_socket)
    raw.send_bytes(b"\x00\xff\xfe garbage\n")
    first = raw.read()
    assert first is not None and first["error"]["code"] == -32700
    raw.send_bytes(b'{"jsonrpc": "1.0", "id": 5}\n')
    assert raw.read()["error"] is not None  # type: ignore[index]
    assert raw.initialize()["result"]["serverInfo"]["name"] == "diagd"
    raw.close()
    assert_alive(daemon)


def test_an_oversized_mcp_line_gets_an_error_and_a_closed_connection(env: Env) -> None:
    env.write_config('[daemon]\nextra_backends = ["echo_actor"]\nmax_line_bytes = 65536\n')
    daemon = start_daemon(env)
    try:
        raw = RawMCP(daemon.mcp_socket)
        raw.send_bytes(b"[" * 200_000)
        reply = raw.read()
        assert reply is not None and "exceeds 65536 bytes" in reply["error"]["message"]
        assert raw.read_line() is None
        assert_alive(daemon)
    finally:
        daemon.stop()


def test_control_socket_answers_garbage_with_coded_errors(daemon: DaemonProcess) -> None:
    sock = control_connect(daemon)
    sock.sendall(frame({"t": "status", "id": 1}))  # not hello first
    reply = read_frame(sock)
    assert isinstance(reply, control.ErrorReply) and "hello" in reply.message
    assert read_frame(sock) is None

    sock = control_connect(daemon)
    sock.sendall(frame({"t": "hello", "version": 99}))
    reply = read_frame(sock)
    assert isinstance(reply, control.ErrorReply) and reply.code == "PROTOCOL_ERROR"
    assert reply.details["supported"] == list(control.SUPPORTED_VERSIONS)

    sock = control_connect(daemon)
    sock.sendall(frame({"t": "hello", "version": control.PROTOCOL_VERSION}))
    assert isinstance(read_frame(sock), control.Hello)
    sock.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")  # malformed msgpack: error, connection lives
    reply = read_frame(sock)
    assert isinstance(reply, control.ErrorReply) and reply.code == "PROTOCOL_ERROR"
    sock.sendall(frame({"t": "status", "id": 7}))
    ok = read_frame(sock)
    assert isinstance(ok, control.Reply) and ok.id == 7

    sock = control_connect(daemon)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # reads as a 1.2 GB frame header
    reply = read_frame(sock)
    assert isinstance(reply, control.ErrorReply) and "exceeds" in reply.message
    assert read_frame(sock) is None
    assert_alive(daemon)


def test_sigterm_reaps_children_removes_sockets_and_exits_cleanly(env: Env) -> None:
    daemon = start_daemon(env)
    try:
        out = env.run("call", "echo", "message=hi", "resource=child-1", "--visibility", "off")
        child_pid = json.loads(out.stdout)["child_pid"]
        assert Path(f"/proc/{child_pid}").exists()
    finally:
        exit_code = daemon.stop()
    assert exit_code == 0
    assert not daemon.mcp_socket.exists() and not daemon.control_socket.exists()
    assert not Path(f"/proc/{child_pid}").exists(), "the actor's child process was not reaped"
    assert '"diagd stopped"' in daemon.log()


def test_ready_is_notified_to_systemd_once_sockets_listen(env: Env) -> None:
    notify_path = env.root / "notify.sock"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(notify_path))
    receiver.settimeout(20)
    daemon = start_daemon(env, {"NOTIFY_SOCKET": str(notify_path)})
    try:
        message = receiver.recv(4096).decode()
        assert message.startswith("READY=1")
        assert daemon.mcp_socket.exists() and daemon.control_socket.exists()
    finally:
        daemon.stop()
        receiver.close()


def test_second_daemon_refuses_to_start_while_one_runs(daemon: DaemonProcess) -> None:
    second = daemon.env.run("serve", timeout=20)
    assert second.returncode == 1 and "already runs" in second.stderr
    assert_alive(daemon)


def test_shim_autostarts_a_daemon_and_speaks_mcp(env: Env) -> None:
    proc = subprocess.run([DIAGD, "mcp"], env=env.vars, input=json.dumps(INITIALIZE).encode() + b"\n",
                          capture_output=True, timeout=30, check=False)
    try:
        assert proc.returncode == 0, proc.stderr
        reply = json.loads(proc.stdout.splitlines()[0])
        assert reply["id"] == 0 and reply["result"]["serverInfo"]["name"] == "diagd"
        assert (env.runtime / "control.sock").exists()
        status = env.run("status", "--json")
        assert json.loads(status.stdout)["running"] is True
    finally:
        stopped = env.run("stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not (env.runtime / "mcp.sock").exists()


def test_shim_without_autostart_fails_cleanly_with_nothing_on_stdout(env: Env) -> None:
    proc = env.run("mcp", "--no-autostart", input=json.dumps(INITIALIZE).encode() + b"\n")
    assert proc.returncode == 3  # NO_DAEMON
    assert proc.stdout == ""
    assert "no daemon listening" in proc.stderr


def test_diagd_call_prints_the_verbose_banner_on_stderr_and_the_result_on_stdout(daemon: DaemonProcess) -> None:
    out = daemon.env.run("call", "echo", "message=hello world", "delay_s=0.01")
    assert out.returncode == 0
    assert json.loads(out.stdout) == {"message": "hello world", "resource": "default"}
    lines = out.stderr.splitlines()
    assert lines[:5] == ["📡 calling tool: echo", "   args: {", '     "message": "hello world",',
                         '     "delay_s": 0.01', "   }"]
    rule = lines[5]
    assert set(rule) == {"─"}
    assert lines[6] == "ℹ️ source: echo"
    assert lines[7:11] == lines[1:5]
    assert lines[11].startswith("   elapsed: ") and lines[11].endswith("s")
    assert len(lines[11].split(": ")[1].rstrip("s").split(".")[1]) == 2
    assert lines[12] == rule and len(lines) == 13


def test_diagd_call_shows_the_banner_on_failure_and_exits_nonzero(daemon: DaemonProcess) -> None:
    out = daemon.env.run("call", "echo", "message=x", "crash=true")
    assert out.returncode == 1
    assert json.loads(out.stdout)["code"] == "ACTOR_FAILED"
    assert "ℹ️ source: echo" in out.stderr and "   elapsed: " in out.stderr


def test_diagd_call_visibility_simple_and_off(daemon: DaemonProcess) -> None:
    simple = daemon.env.run("call", "diagd_calls", "--visibility", "simple")
    assert simple.stderr == "📡 calling tool: diagd_calls\n"
    off = daemon.env.run("call", "diagd_calls", "--visibility=off")
    assert off.stderr == "" and json.loads(off.stdout)["total_calls"] >= 1


def test_diagd_call_visibility_comes_from_config(daemon: DaemonProcess) -> None:
    daemon.env.write_config('[daemon]\nextra_backends = ["echo_actor"]\nvisibility = "off"\n')
    out = daemon.env.run("call", "diagd_status")
    assert out.returncode == 0 and out.stderr == ""


def test_diagd_call_args_json_and_no_arguments(daemon: DaemonProcess) -> None:
    out = daemon.env.run("call", "echo", "--args-json", '{"message": "from json"}')
    assert json.loads(out.stdout)["message"] == "from json"
    none = daemon.env.run("call", "diagd_calls")
    assert "   args: {}\n" in none.stderr


def test_status_shows_daemon_actors_and_tool_stats(daemon: DaemonProcess) -> None:
    daemon.env.run("call", "echo", "message=x", "resource=tty-test")
    text = daemon.env.run("status").stdout
    assert f"pid {daemon.proc.pid}" in text
    assert "tty-test" in text and "idle" in text
    assert "echo" in text and "P95 MS" in text
    data = json.loads(daemon.env.run("status", "--json").stdout)
    actor = next(a for a in data["actors"] if a["resource"] == "tty-test")
    assert set(actor) >= {"id", "kind", "state", "inbox_depth", "idle_s_left", "restarts"}
    assert data["tools"]["echo"]["count"] == 1
    assert set(data["tools"]["echo"]) >= {"p50_ms", "p95_ms", "failure_rate"}
    # The daemon's own RSS (children not counted) and its workers' (none: echo owns no process).
    assert 10 * 2**20 < data["daemon"]["rss_bytes"] < 2**30
    assert data["daemon"]["workers"] == 0 and data["daemon"]["workers_rss_bytes"] == 0
    assert "memory: daemon rss " in text and ", 0 workers rss 0.0 MB" in text


def test_status_without_a_daemon_says_so(env: Env) -> None:
    out = env.run("status")
    assert out.returncode == 3 and "not running" in out.stdout


def test_diagd_call_without_a_daemon_exits_3_and_starts_none(env: Env) -> None:
    # A one-shot command never leaves a daemon behind: starting one is `diagd start` or systemd's job.
    out = env.run("call", "echo", "message=x", "--visibility=off")
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.startswith("diagd call: diagd is not running") and "diagd start" in out.stderr
    assert not (env.runtime / "control.sock").exists() and not (env.runtime / "mcp.sock").exists()
    assert env.run("status").returncode == 3
    # With banners on: no call was made, so none is announced and no result banner comes before the error.
    verbose = env.run("call", "echo", "message=x", "--visibility=verbose")
    assert verbose.returncode == 3 and verbose.stderr.splitlines() == [
        f"diagd call: diagd is not running (no socket at {env.runtime / 'control.sock'}); start it with `diagd start`"]


def owner_only_problems(root: Path) -> list[str]:
    """Every file under `root` not 0600 and every directory not 0700 (symlinks: none expected)."""
    problems = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) or stat.S_IMODE(st.st_mode) != want:
            problems.append(f"{path} {stat.filemode(st.st_mode)}")
    return problems


def test_state_files_and_rotated_audit_logs_are_owner_only_whatever_umask_the_daemon_had(env: Env) -> None:
    env.write_config('[daemon]\nextra_backends = ["echo_actor"]\naudit_max_bytes = 2000\naudit_keep = 2\n')
    previous = os.umask(0)  # the daemon inherits the most permissive umask there is
    try:
        daemon = start_daemon(env)
    finally:
        os.umask(previous)
    try:
        # What back ends write through plain open()/mkdir (bpftrace results, pcap exports, tshark's
        # files, crash's scratch files) is owner-only because the whole process runs under umask 077.
        umask = next(line for line in Path(f"/proc/{daemon.proc.pid}/status").read_text().splitlines()
                     if line.startswith("Umask:"))
        assert umask.split()[1] == "0077"
        for i in range(12):
            assert env.run("call", "echo", f"message=secret-{i}", "--visibility=off").returncode == 0
    finally:
        daemon.stop()
    assert (env.state / "audit.jsonl.1").exists(), "the audit log did not rotate"
    assert owner_only_problems(env.state) == []


def test_every_call_from_mcp_and_cli_lands_in_the_audit_log(daemon: DaemonProcess) -> None:
    daemon.env.run("call", "echo", "message=audited")
    raw = RawMCP(daemon.mcp_socket)
    raw.initialize()
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "nope", "arguments": {}}})
    assert raw.read() is not None
    raw.close()
    lines = [json.loads(line) for line in (daemon.env.state / "audit.jsonl").read_text().splitlines()]
    # Each call: a "started" record, then its end, with one call id.
    assert [(r["tool"], r["outcome"], r["client"].split(":")[0]) for r in lines] == [
        ("echo", "started", "cli"), ("echo", "ok", "cli"), ("nope", "started", "mcp"), ("nope", "error", "mcp")]
    assert lines[0]["call_id"] == lines[1]["call_id"] != lines[2]["call_id"] == lines[3]["call_id"]
    assert lines[1]["arguments"] == {"message": "audited"} and lines[3]["code"] == "INVALID_ARGUMENT"
    logs = daemon.env.run("logs", "-n", "5")
    assert "echo" in logs.stdout and "error:INVALID_ARGUMENT" in logs.stdout


def test_reload_applies_a_good_config_and_keeps_the_old_one_on_a_bad_one(daemon: DaemonProcess) -> None:
    daemon.env.write_config('[daemon]\nextra_backends = ["echo_actor"]\ncall_timeout_s = 0.2\n')
    assert daemon.env.run("reload").returncode == 0
    slow = daemon.env.run("call", "echo", "message=x", "delay_s=2", "--visibility=off")
    assert json.loads(slow.stdout)["code"] == "TIMEOUT"
    daemon.env.write_config("[daemon\nbroken")
    bad = daemon.env.run("reload")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
    again = daemon.env.run("call", "echo", "message=x", "delay_s=2", "--visibility=off")
    assert json.loads(again.stdout)["code"] == "TIMEOUT"  # the old config is still in force
    assert_alive(daemon)


def test_sighup_reloads_the_config(daemon: DaemonProcess) -> None:
    daemon.env.write_config('[daemon]\nextra_backends = ["echo_actor"]\ncall_timeout_s = 0.2\n')
    daemon.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while '"config reloaded"' not in daemon.log():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    slow = daemon.env.run("call", "echo", "message=x", "delay_s=2", "--visibility=off")
    assert json.loads(slow.stdout)["code"] == "TIMEOUT"


def test_a_sighup_as_soon_as_a_socket_exists_reloads_and_does_not_end_the_daemon(env: Env) -> None:
    """The signal receiver is open before any socket is bound: whoever sees a socket may signal at once.
    (It was opened after both: a SIGHUP in between ended the daemon, SIGHUP's default action, and
    test_sighup_reloads_the_config failed under load in CI.)"""
    with open(env.root / "daemon.log", "wb") as logfile:
        proc = subprocess.Popen([DIAGD, "serve"], env=env.vars, stdout=logfile, stderr=subprocess.STDOUT)
        daemon = DaemonProcess(proc, env)
        try:
            while not daemon.mcp_socket.exists():  # the first socket bound: signalled the moment it appears
                assert proc.poll() is None, daemon.log()
            proc.send_signal(signal.SIGHUP)
            wait_for_path(daemon.control_socket, proc)
            deadline = time.monotonic() + 20
            while '"config reloaded"' not in daemon.log():
                assert proc.poll() is None, f"the daemon ended on SIGHUP: {daemon.log()[-2000:]}"
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert proc.poll() is None
        finally:
            daemon.stop()


def test_stop_actor_from_the_cli(daemon: DaemonProcess) -> None:
    daemon.env.run("call", "echo", "message=x", "resource=r")
    actor_id = json.loads(daemon.env.run("status", "--json").stdout)["actors"][0]["id"]
    assert daemon.env.run("stop-actor", actor_id).returncode == 0
    assert json.loads(daemon.env.run("status", "--json").stdout)["actors"] == []


def test_doctor_reports_every_check_with_a_fix(env: Env) -> None:
    out = env.run("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert {"tshark", "sharkd", "capinfos", "bpftrace", "bpftrace privileges", "tracefs", "crash",
            "python:drgn", "runtime dir", "config", "daemon"} <= set(checks)
    assert all(c["fix"] for c in checks.values() if not c["ok"])
    assert out.returncode == 0


def test_broken_config_makes_serve_fail_with_a_coded_message(env: Env) -> None:
    env.write_config("[daemon]\nno_such_key = 1\n")
    out = env.run("serve", timeout=20)
    assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stderr and "no_such_key" in out.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(env: Env, tmp_path: Path) -> None:
    unit = tmp_path / "diagd.service"
    rendered = env.run("service", "print")
    assert rendered.returncode == 0 and "Type=notify" in rendered.stdout
    unit.write_text(rendered.stdout)
    xdg_runtime = tmp_path / "xdg"  # the --user manager needs one, even where no user session exists
    xdg_runtime.mkdir(mode=0o700)
    out = subprocess.run(["systemd-analyze", "verify", "--user", str(unit)], capture_output=True, text=True,
                         timeout=60, check=False,
                         env={**env.vars, "SYSTEMD_LOG_LEVEL": "warning", "XDG_RUNTIME_DIR": str(xdg_runtime)})
    problems = [line for line in out.stderr.splitlines() if str(unit) in line or "diagd.service" in line]
    assert out.returncode == 0 and not problems, out.stderr


def test_runtime_dir_waits_are_bounded(env: Env) -> None:
    with pytest.raises(TimeoutError):
        wait_for_path(env.runtime / "never.sock", timeout=0.1)


def test_status_memory_traces_the_heap_only_when_the_daemon_was_started_for_it(env: Env) -> None:
    # Debug-only (issue 28): off by default; with DIAGD_TRACEMALLOC the first --memory starts tracing.
    plain = start_daemon(env)
    try:
        out = env.run("status", "--memory")
        assert out.returncode == 0 and "tracemalloc is off" in out.stdout and "DIAGD_TRACEMALLOC" in out.stdout
        assert json.loads(env.run("status", "--memory", "--json").stdout)["memory"] is None
    finally:
        plain.stop()
    traced = start_daemon(env, {"DIAGD_TRACEMALLOC": "4"})
    try:
        first = json.loads(env.run("status", "--memory", "--json").stdout)["memory"]
        assert first["frames"] == 4
        for i in range(20):
            env.run("call", "echo", f"message=m{i}", "resource=tty-test")
        text = env.run("status", "--memory").stdout
        assert "top growth since the baseline:" in text and "top growth since the previous report:" in text
        assert "growth since the baseline" in text.splitlines()[0]
        assert "memory" not in json.loads(env.run("status", "--json").stdout)  # a plain status takes no snapshot
    finally:
        traced.stop()
