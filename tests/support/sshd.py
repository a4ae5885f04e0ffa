"""A private OpenSSH server on a free localhost port, for tests of `diagd ... --ssh`.

Everything lives in one temporary directory: a throw-away host key and user key, an sshd_config
that trusts only that user key (`AuthorizedKeysFile` in the directory, `StrictModes no`, no PAM),
and a client config for `ssh -F` (OpenSSH reads ~/.ssh from the passwd home, not $HOME, so a
test cannot rely on it). The system's sshd and its config are never touched. `SetEnv` gives
every session the environment of "the remote host": this venv's `diagd` first on PATH and the
isolated DIAGD_* directories of the test's daemon.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
# Variables the remote session gets (SetEnv): where the remote daemon lives, and how to find diagd.
REMOTE_VARS = ("DIAGD_RUNTIME_DIR", "DIAGD_STATE_DIR", "DIAGD_CONFIG", "PYTHONPATH", "PATH")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "diagd-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path


@dataclass
class Sshd:
    proc: subprocess.Popen[bytes]
    port: int
    user: str
    client_config: Path  # for `ssh -F` / DIAGD_SSH_CONFIG: the right key and a pinned host key
    dir: Path

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")

    def client_config_with_key(self, key: Path, name: str) -> Path:
        """A client config like ours but offering `key` (not authorised here) instead."""
        path = self.dir / name
        path.write_text(self.client_config.read_text().replace(str(self.dir / "user_key"), str(key)))
        return path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def start_sshd(where: Path, remote_env: dict[str, str], *, timeout: float = 10) -> Sshd:
    where.mkdir(parents=True, exist_ok=True)
    host_key = keygen(where / "host_key")
    user_key = keygen(where / "user_key")
    shutil.copy(f"{user_key}.pub", where / "authorized_keys")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir (root only)
    port = free_port()
    user = getpass.getuser()
    set_env = " ".join(f'"{k}={remote_env[k]}"' for k in REMOTE_VARS if remote_env.get(k))
    config = where / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}",
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {where / 'authorized_keys'}",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        f"AllowUsers {user}",
        "PidFile none",
        "LogLevel VERBOSE",
        f"SetEnv {set_env}",
        "",
    ]))
    known_hosts = where / "known_hosts"
    host_pub = Path(f"{host_key}.pub").read_text().split()
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    client = where / "ssh_config"
    client.write_text("\n".join([
        "Host *",
        f"  IdentityFile {user_key}",
        "  IdentitiesOnly yes",
        "  IdentityAgent none",
        f"  UserKnownHostsFile {known_hosts}",
        "  StrictHostKeyChecking yes",
        "  GlobalKnownHostsFile /dev/null",
        "  LogLevel ERROR",
        "",
    ]))
    log = open(where / "sshd.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    log.close()
    server = Sshd(proc, port, user, client, where)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {server.log()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise TimeoutError(f"sshd did not listen on {port} within {timeout} s: {server.log()}") from None
            time.sleep(0.02)
