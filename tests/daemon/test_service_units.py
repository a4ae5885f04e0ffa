"""The systemd units `diagd service install` writes: checked by systemd's own `systemd-analyze verify`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Env

ANALYZE = shutil.which("systemd-analyze")


def install(env: Env, *flags: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    config_home = env.root / "xdg-config"
    env.vars["XDG_CONFIG_HOME"] = str(config_home)
    done = env.run("service", "install", "--no-start", *flags)
    assert done.returncode == 0, done.stderr
    return done, config_home / "systemd" / "user"


@pytest.fixture
def short_runtime() -> Iterator[Path]:
    """A runtime dir with a short path: the user units systemd-analyze also loads (gpg-agent's) put
    sockets in it, and a socket path over 107 bytes is refused (pytest-xdist's tmp paths are longer)."""
    runtime = Path(tempfile.mkdtemp(prefix="xdg-"))
    yield runtime
    shutil.rmtree(runtime, ignore_errors=True)


def verify(*units: Path, runtime: Path) -> subprocess.CompletedProcess[str]:
    """Offline verification as a user manager would load them: `--user` resolves %t and %h; it
    needs a runtime dir, which a throw-away one provides (no user manager, no bus)."""
    runtime.mkdir(mode=0o700, exist_ok=True)
    return subprocess.run([str(ANALYZE), "--user", "verify", *map(str, units)], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})


def test_install_socket_writes_both_units_and_uninstall_removes_both(env: Env) -> None:
    done, units = install(env, "--socket")
    service, sock = units / "diagd.service", units / "diagd.socket"
    assert f"wrote {service}" in done.stdout and f"wrote {sock}" in done.stdout
    assert "ListenStream=%t/diagd/mcp.sock" in sock.read_text()
    assert sock.read_text() == env.run("service", "print", "--socket").stdout
    assert service.read_text() == env.run("service", "print").stdout
    done = env.run("service", "uninstall")
    assert done.returncode == 0
    assert not service.exists() and not sock.exists()


def test_install_without_socket_writes_the_service_only(env: Env) -> None:
    _done, units = install(env)
    assert (units / "diagd.service").exists() and not (units / "diagd.socket").exists()


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is absent (package systemd)")
def test_the_installed_units_pass_systemd_analyze_verify(env: Env, short_runtime: Path) -> None:
    _done, units = install(env, "--socket")
    done = verify(units / "diagd.socket", units / "diagd.service", runtime=short_runtime)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is absent (package systemd)")
def test_verify_would_catch_a_broken_socket_unit(env: Env, short_runtime: Path) -> None:
    # The check above means something: the same verification fails on a unit systemd cannot use.
    _done, units = install(env, "--socket")
    broken = units / "diagd.socket"
    broken.write_text(broken.read_text().replace("ListenStream=%t/diagd/mcp.sock", "ListenStream=not-a-path"))
    done = verify(broken, units / "diagd.service", runtime=short_runtime)
    assert "not-a-path" in done.stderr


def test_documentation_points_at_a_file_that_exists(env: Env) -> None:
    _done, units = install(env, "--socket")
    for unit in (units / "diagd.service", units / "diagd.socket"):
        docs = [line.removeprefix("Documentation=") for line in unit.read_text().splitlines()
                if line.startswith("Documentation=")]
        assert docs and all(d.startswith("file:/") and Path(d.removeprefix("file:")).is_file() for d in docs), docs


def test_the_service_carries_the_config_and_state_dir_of_the_shell_that_installed_it(env: Env) -> None:
    env.vars["DIAGD_CONFIG"] = str(env.root / "my 100%" / "config.toml")
    _done, units = install(env)
    text = (units / "diagd.service").read_text()
    assert f'Environment="DIAGD_CONFIG={env.root}/my 100%%/config.toml"' in text
    assert f'Environment="DIAGD_STATE_DIR={env.state}"' in text


def fake_systemctl(env: Env, tmp_path: Path, stderr: str) -> None:
    """A `systemctl` first on PATH that fails every call with `stderr` (as systemctl does without a user
    manager, or on a unit it refuses)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {stderr!r} >&2\nexit 1\n")
    script.chmod(0o755)
    env.vars["PATH"] = f"{bin_dir}{os.pathsep}{env.vars.get('PATH', '')}"
    env.vars["XDG_CONFIG_HOME"] = str(env.root / "xdg-config")


def test_without_a_user_manager_service_says_what_to_do_and_no_raw_systemctl_error(env: Env, tmp_path: Path) -> None:
    fake_systemctl(env, tmp_path, "Failed to connect to bus: No medium found")
    done = env.run("service", "install")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "no systemd user manager here; start the daemon with `diagd start`" in done.stdout
    gone = env.run("service", "uninstall")
    assert gone.returncode == 0 and gone.stderr == "" and "removed" in gone.stdout, gone.stderr


def test_a_systemctl_refusal_is_one_line_naming_the_command(env: Env, tmp_path: Path) -> None:
    fake_systemctl(env, tmp_path, "Failed to enable unit: Unit file diagd.service is masked.")
    done = env.run("service", "install")
    assert done.stderr == ("diagd service: systemctl --user daemon-reload: Failed to enable unit: Unit file "
                           "diagd.service is masked.\n"), done.stderr
