"""`diagd ... --ssh` end to end: a real OpenSSH client and a private `sshd` on a free localhost port.

"The remote host" is this machine seen through that sshd: its sessions get the test daemon's
DIAGD_* directories (SetEnv), while the local commands use another, empty runtime dir, so an
answer naming the daemon's sockets and pid can only have come over ssh.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from diagd import __version__
from tests.conftest import DIAGD, DaemonProcess, Env
from tests.support.sshd import SSHD, Sshd, free_port, keygen, start_sshd

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not SSHD.exists(), reason=f"{SSHD} is absent (openssh-server)")]


@dataclass
class Remote:
    """The test sshd as "the remote host" for the daemon directories of `env`, and the local side's
    environment."""

    env: Env
    sshd: Sshd
    local: dict[str, str]  # environment of the local `diagd ... --ssh` commands
    local_runtime: Path

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DIAGD, *args], env=env or self.local, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)

    def ssh_control(self, command: str) -> subprocess.CompletedProcess[str]:
        """`ssh -O COMMAND` on the shared connection diagd should have left behind."""
        return subprocess.run(["ssh", "-F", str(self.sshd.client_config), "-o",
                               f"ControlPath={self.local_runtime}/ssh-%C", "-p", str(self.sshd.port),
                               "-l", self.sshd.user, "-O", command, "127.0.0.1"],
                              capture_output=True, text=True, timeout=20, check=False)


@pytest.fixture
def remote_host(env: Env, tmp_path: Path) -> Iterator[Remote]:
    """The remote host, no daemon running there yet."""
    if os.geteuid() != 0 and not Path("/run/sshd").is_dir():
        pytest.skip("sshd needs /run/sshd, which only root can create")
    remote_env = {**env.vars,
                  "PATH": os.pathsep.join([str(Path(DIAGD).parent), os.environ.get("PATH", "/usr/bin:/bin")])}
    sshd = start_sshd(tmp_path / "sshd", remote_env)
    local_runtime = Path(f"/tmp/diagd-ssh-{os.getpid()}-{tmp_path.name[-12:]}")
    local = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGD_", "SSH_"))}
    local.update(DIAGD_RUNTIME_DIR=str(local_runtime), DIAGD_STATE_DIR=str(tmp_path / "local-state"),
                 DIAGD_CONFIG=str(tmp_path / "local-config.toml"), DIAGD_SSH_CONFIG=str(sshd.client_config))
    r = Remote(env, sshd, local, local_runtime)
    try:
        yield r
    finally:
        r.ssh_control("exit")
        sshd.stop()
        subprocess.run(["rm", "-rf", str(local_runtime)], check=False)


@pytest.fixture
def remote(remote_host: Remote, daemon: DaemonProcess) -> Remote:
    """The remote host with a daemon running there."""
    return remote_host


def only_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


async def test_an_mcp_sdk_client_drives_the_remote_daemon_through_diagd_mcp_ssh(remote: Remote,
                                                                                daemon: DaemonProcess) -> None:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--ssh", remote.sshd.target], env=remote.local)
    with trio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert {"diagd_status", "echo"} <= tools
            status = (await client.call_tool("diagd_status", {})).structured_content
            echoed = await client.call_tool("echo", {"message": "over ssh"})
    assert status is not None
    assert status["daemon"]["pid"] == daemon.proc.pid
    assert status["daemon"]["sockets"]["mcp"] == str(daemon.mcp_socket)
    assert json.loads(echoed.content[0].text)["message"] == "over ssh"
    assert not (remote.local_runtime / "mcp.sock").exists()  # no local daemon was started


async def test_diagd_mcp_ssh_starts_the_remote_daemon_which_outlives_the_session(remote_host: Remote) -> None:
    params = StdioServerParameters(command=DIAGD, args=["mcp", "--ssh", remote_host.sshd.target],
                                   env=remote_host.local)
    try:
        with trio.fail_after(60):
            async with Client(params, mode="legacy") as client:
                status = (await client.call_tool("diagd_status", {})).structured_content
        assert status is not None
        pid = status["daemon"]["pid"]
        assert status["daemon"]["sockets"]["control"] == str(remote_host.env.runtime / "control.sock")
        again = remote_host.run("status", "--json", "--ssh", remote_host.sshd.target)
        assert again.returncode == 0 and json.loads(again.stdout)["daemon"]["pid"] == pid
    finally:
        remote_host.env.run("stop")


def test_status_call_logs_and_doctor_run_on_the_remote_host(remote: Remote, daemon: DaemonProcess) -> None:
    target = remote.sshd.target
    status = remote.run("status", "--json", "--ssh", target)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["daemon"]["pid"] == daemon.proc.pid

    call = remote.run("call", "--ssh", target, "echo", "message=hello remote", "--visibility", "off")
    assert call.returncode == 0, call.stderr
    assert json.loads(call.stdout) == {"message": "hello remote", "resource": "default"}
    failed = remote.run("call", "echo", "message=x", "crash=true", "--ssh", target)
    assert failed.returncode == 1  # the remote command's exit status passes through

    logs = remote.run("logs", "-n", "5", "--ssh", target)
    assert logs.returncode == 0 and "hello remote" in logs.stdout

    doctor = remote.run("doctor", "--json", f"--ssh={target}")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert str(remote.env.runtime) in checks["runtime dir"]["detail"]
    assert checks["daemon"]["ok"]


def test_hostile_argument_text_reaches_the_remote_diagd_verbatim_and_runs_nothing(remote: Remote,
                                                                                  tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for text in (f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"x' ; touch {marker} '",
                 f'" && touch {marker} "', f"\\\n touch {marker}", "*", "$HOME ~ %s {}"):
        # --args-json carries the text as it is (key=value would parse `"..."` as JSON, and join
        # backslash-newline continuations); its JSON has the shell's special characters too.
        plain = not text.startswith('"') and "\\\n" not in text
        for how in (["--args-json", json.dumps({"message": text})], *([[f"message={text}"]] if plain else [])):
            out = remote.run("call", "echo", *how, "--visibility", "off", "--ssh", remote.sshd.target)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["message"] == text
    assert not marker.exists()


def test_a_second_command_reuses_the_shared_connection(remote: Remote) -> None:
    for _ in range(3):
        assert remote.run("status", "--ssh", remote.sshd.target).returncode == 0
    check = remote.ssh_control("check")
    assert check.returncode == 0 and "Master running" in check.stderr
    assert len(re.findall(r"Accepted publickey", remote.sshd.log())) == 1  # one login for three commands
    sockets = [p for p in remote.local_runtime.iterdir() if p.name.startswith("ssh-") and p.is_socket()]
    assert len(sockets) == 1 and (sockets[0].stat().st_mode & 0o777) == 0o600
    assert (remote.local_runtime.stat().st_mode & 0o777) == 0o700


def test_ssh_missing_on_path_is_one_coded_line(remote: Remote) -> None:
    out = remote.run("status", "--ssh", remote.sshd.target, env={**remote.local, "PATH": "/nonexistent"})
    assert out.returncode == 4
    assert only_line(out.stderr).startswith("diagd status: SSH_NOT_FOUND: ssh is not installed")


def test_an_unreachable_host_is_one_coded_line(remote: Remote) -> None:
    out = remote.run("status", "--ssh", f"{remote.sshd.user}@127.0.0.1:{free_port()}")
    assert out.returncode == 5
    line = only_line(out.stderr)
    assert line.startswith("diagd status: SSH_UNREACHABLE:") and "Connection refused" in line


def test_an_unknown_host_name_is_unreachable_too(remote: Remote) -> None:
    out = remote.run("status", "--ssh", "no-such-host.invalid")
    assert out.returncode == 5
    assert only_line(out.stderr).startswith("diagd status: SSH_UNREACHABLE:")


def test_a_refused_key_is_an_authentication_failure(remote: Remote, tmp_path: Path) -> None:
    config = remote.sshd.client_config_with_key(keygen(tmp_path / "stranger"), "stranger_config")
    out = remote.run("status", "--ssh", remote.sshd.target, env={**remote.local, "DIAGD_SSH_CONFIG": str(config)})
    assert out.returncode == 6
    line = only_line(out.stderr)
    assert line.startswith("diagd status: SSH_AUTH_FAILED:") and "Permission denied" in line


def test_no_diagd_on_the_remote_path_exits_127(remote: Remote) -> None:
    out = remote.run("mcp", "--ssh", remote.sshd.target, "--remote-diagd", "diagd-not-installed")
    assert out.returncode == 127 and out.stdout == ""
    line = only_line(out.stderr)
    assert line.startswith("diagd mcp: REMOTE_DIAGD_NOT_FOUND: no 'diagd-not-installed'")


def test_a_different_remote_version_is_refused(remote: Remote, tmp_path: Path) -> None:
    fake = tmp_path / "old-diagd"
    fake.write_text("#!/bin/sh\necho 'diagd 0.0.1'\n")
    fake.chmod(0o755)
    out = remote.run("status", "--ssh", remote.sshd.target, "--remote-diagd", str(fake))
    assert out.returncode == 7
    line = only_line(out.stderr)
    assert line.startswith("diagd status: VERSION_MISMATCH:") and "0.0.1" in line and __version__ in line


def test_a_remote_diagd_without_a_version_command_is_a_mismatch(remote: Remote, tmp_path: Path) -> None:
    fake = tmp_path / "older-diagd"  # what an older diagd does with an unknown sub-command: usage, exit 2
    fake.write_text("#!/bin/sh\necho 'usage: diagd ...' >&2\nexit 2\n")
    fake.chmod(0o755)
    out = remote.run("call", "echo", "--ssh", remote.sshd.target, "--remote-diagd", str(fake))
    assert out.returncode == 7
    assert only_line(out.stderr).startswith("diagd call: VERSION_MISMATCH:")


def test_ssh_options_reach_ssh(remote: Remote) -> None:
    # A wrong port given as an ssh option wins over none in the target: ssh is asked, not bypassed.
    target = f"{remote.sshd.user}@127.0.0.1"
    out = remote.run("status", "--ssh", target, "--ssh-option", f"Port={free_port()}")
    assert out.returncode == 5
    ok = remote.run("status", "--ssh", target, "--ssh-option", f"Port={remote.sshd.port}")
    assert ok.returncode == 0, ok.stderr

