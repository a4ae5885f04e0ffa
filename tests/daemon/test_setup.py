"""`diagd setup` and `diagd doctor` per back end: what each back end declares (SYSTEM_NEEDS), what is
installed by apt and how, asked first, refused without a way to root. apt itself is a recorder on
PATH here (nothing is installed); dpkg-query is the real one."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from diagd.daemon import discovery
from diagd.daemon.cli import backend_needs, setup_cli
from tests import backends
from tests.conftest import Env
from tests.support.needy_backend import PACKAGE

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system (no dpkg-query)")


@pytest.fixture
def needy(env: Env) -> Env:
    env.write_config('[daemon]\nextra_backends = ["needy_backend"]\n')
    return env


def recorder(env: Env, name: str) -> Path:
    """`name` on PATH first: appends its argv to a log and succeeds."""
    bindir = env.root / "bin"
    bindir.mkdir(exist_ok=True)
    log = env.root / "ran.log"
    script = bindir / name
    script.write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\ncat > /dev/null\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env.vars["PATH"] = f"{bindir}:{env.vars['PATH']}"
    return log


def test_every_builtin_back_end_declares_its_needs() -> None:
    declared = backend_needs.declared()
    assert list(declared) == [b.name for b in discovery.installed()]
    packages = {name: needs.packages for name, needs in declared.items()}
    assert packages == {"pcap": ("tshark", "wireshark-common"), "serial": (), "bpftrace": ("bpftrace",),
                        "crash": ("crash", "bubblewrap"), "capture": ("wireshark-common",)}


def test_dry_run_prints_the_apt_commands_for_what_is_missing_only(needy: Env) -> None:
    done = needy.run("setup", "needy_backend", "pcap", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"needy_backend: to install: {PACKAGE}" in done.stdout
    assert "a note only this back end prints" in done.stdout
    install = [line for line in done.stdout.splitlines() if "apt-get install" in line]
    assert len(install) == 1 and install[0].split()[-1] == PACKAGE  # tshark is installed: not asked for


def test_a_no_at_the_prompt_installs_nothing(needy: Env) -> None:
    if os.geteuid() != 0 and not shutil.which("sudo"):
        pytest.skip("no root and no sudo: setup refuses before asking (the next test)")
    log = recorder(needy, "apt-get")
    done = needy.run("setup", "needy_backend", input=b"n\n")
    assert done.returncode == 1 and "[y/N]" in done.stdout and "nothing installed" in done.stdout
    assert not log.exists()


def test_yes_runs_apt_update_then_install_of_the_missing_packages(needy: Env) -> None:
    if os.geteuid() != 0:
        pytest.skip("would go through sudo")
    log = recorder(needy, "apt-get")
    done = needy.run("setup", "all", "--yes")
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == ["apt-get update -q",
                                            f"apt-get install -y -q --no-install-recommends {PACKAGE}"]


def test_unknown_back_end_is_a_usage_error(env: Env) -> None:
    done = env.run("setup", "pcapp")
    assert done.returncode == 2 and "unknown back end pcapp" in done.stderr and "pcap, serial" in done.stderr


def test_without_root_or_sudo_it_refuses_and_prints_what_to_run(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sudo on it
    assert setup_cli.install([PACKAGE], yes=True, dry_run=False) == 1
    err = capsys.readouterr().err
    assert "needs root, and there is no sudo" in err and f"--no-install-recommends {PACKAGE}" in err


def test_doctor_groups_checks_per_back_end_with_setup_as_the_fix(needy: Env) -> None:
    checks = json.loads(needy.run("doctor", "--json").stdout)
    groups = {c["group"] for c in checks}
    assert {"diagd", *backends.names(), "needy_backend"} <= groups
    absent = next(c for c in checks if c["name"] == "diagd-test-absent-tool")
    assert absent["group"] == "needy_backend" and not absent["ok"]
    assert absent["fix"].startswith("diagd setup needy_backend")
    text = needy.run("doctor").stdout
    assert "needy_backend: needs attention (diagd-test-absent-tool)" in text
