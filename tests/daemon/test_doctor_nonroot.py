"""`diagd doctor`, `doctor --json` and `setup --dry-run` as a user without root: rows, never a traceback.

Run as root (CI is), the commands run as `nobody` (no supplementary groups), with a HOME and runtime dir
of its own and nothing of this environment (no DIAGD_*, no PYTHONPATH); run as another user, as that
user. Without root what root alone may open says so in its row: on Debian /sys/kernel/tracing is 0700.

`nobody` runs this checkout's diagd: the venv's own `diagd` when another uid can run its interpreter,
else (a Python under root's home, as pyenv puts it) the system's Python of the same minor version with
the venv's site-packages (tests/support/wheel_venv.py picks the interpreter the same way).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIAGD, REPO
from tests.support.wheel_venv import interpreter, others_can_run

TRACEFS = Path("/sys/kernel/tracing")
ROW = re.compile(r"^  \[(ok  |FAIL|warn)\] \S")
# The venv's packages, for a system Python: .pth files (the editable diagd) processed as in the venv.
BOOT = "import site, sys; site.addsitedir(sys.argv.pop(1)); from diagd.daemon.cli.cli import main; sys.exit(main())"


def others_can_read(path: Path) -> bool:
    """Whether a uid that is neither the owner nor in the group may list `path` (a directory)."""
    real = path.resolve()
    return bool(real.stat().st_mode & stat.S_IROTH) and all(p.stat().st_mode & stat.S_IXOTH
                                                             for p in (real, *real.parents))


@dataclass
class User:
    """Who runs the commands, and how."""

    name: str
    uid: int | None  # None: this process's own user
    gid: int | None
    home: Path
    argv: list[str]  # the `diagd` command

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {"HOME": str(self.home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "XDG_RUNTIME_DIR": str(self.home / "run")}
        return subprocess.run([*self.argv, *args], env=env, cwd=self.home, capture_output=True, text=True,
                              timeout=120, check=False, user=self.uid, group=self.gid,
                              extra_groups=[] if self.uid is not None else None)

    def can_enter(self, path: Path) -> bool:
        if self.uid is None:
            return os.access(path, os.R_OK | os.X_OK)
        st = path.stat()  # nobody owns nothing and is in no group: the "other" bits decide
        return st.st_uid == self.uid or st.st_mode & 0o005 == 0o005


def nobodys_diagd() -> list[str]:
    """This checkout's diagd, by a way `nobody` can run it (skipped, with why, when there is none)."""
    site_packages = Path(sysconfig.get_paths()["purelib"])
    unreadable = [p for p in (site_packages, REPO) if not others_can_read(p)]
    if unreadable:
        pytest.skip(f"another uid cannot read {', '.join(map(str, unreadable))}: no diagd that nobody can run")
    if others_can_run(Path(getattr(sys, "_base_executable", sys.executable))):
        return [DIAGD]
    python = interpreter()
    if not others_can_run(Path(python)):
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that another uid can run")
    return [python, "-P", "-c", BOOT, str(site_packages)]


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    home = Path(tempfile.mkdtemp(prefix="diagd-nonroot-", dir="/tmp"))
    try:
        if os.geteuid() != 0:
            (home / "run").mkdir(mode=0o700)
            yield User(pwd.getpwuid(os.getuid()).pw_name, None, None, home, [DIAGD])
            return
        nobody = pwd.getpwnam("nobody")
        argv = nobodys_diagd()
        home.chmod(0o700)
        (home / "run").mkdir(mode=0o700)
        for d in (home, home / "run"):
            os.chown(d, nobody.pw_uid, nobody.pw_gid)
        yield User("nobody", nobody.pw_uid, nobody.pw_gid, home, argv)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def checks(user: User) -> list[dict[str, Any]]:
    done = user.run("doctor", "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stdout + done.stderr
    found = json.loads(done.stdout)
    assert isinstance(found, list) and found
    assert all({"name", "ok", "detail", "fix", "required", "group"} <= set(c) for c in found), found
    failed = [c["name"] for c in found if c["required"] and not c["ok"]]
    assert done.returncode == (1 if failed else 0), failed  # 1: a required check failed, nothing else
    return list(found)


def test_doctor_json_has_every_check_and_says_why_the_tracefs_is_not_ours(user: User,
                                                                          checks: list[dict[str, Any]]) -> None:
    names = {c["name"] for c in checks}
    assert {"runtime dir", "config", "daemon"} <= names, names
    assert all(c["fix"] for c in checks if not c["ok"]), [c for c in checks if not c["ok"] and not c["fix"]]
    if "bpftrace" in {c["group"] for c in checks}:
        tracefs = next(c for c in checks if c["name"] == "tracefs")
        assert tracefs["detail"], tracefs
        if TRACEFS.is_dir() and not user.can_enter(TRACEFS):
            assert "readable by root only" in tracefs["detail"], tracefs
        privileges = next(c for c in checks if c["name"] == "bpftrace privileges")
        if user.uid is not None:
            assert not privileges["ok"] and privileges["fix"], privileges


def test_doctor_prints_a_row_per_check_under_its_group(user: User, checks: list[dict[str, Any]]) -> None:
    done = user.run("doctor")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(1 for line in lines if ROW.match(line)) == len(checks), done.stdout
    groups = dict.fromkeys(c["group"] for c in checks)
    assert [line.split(":")[0] for line in lines if not line.startswith(" ")] == list(groups), done.stdout
    if "bpftrace" in groups and TRACEFS.is_dir() and not user.can_enter(TRACEFS):
        assert any("tracefs" in line and "readable by root only" in line for line in lines), done.stdout


def test_setup_dry_run_prints_a_row_per_back_end(user: User, checks: list[dict[str, Any]]) -> None:
    done = user.run("setup", "--dry-run")
    assert "Traceback" not in done.stderr, done.stderr
    if shutil.which("dpkg-query") is None:  # not Debian: it says what to install, installs nothing
        assert done.returncode == 1 and "no dpkg here" in done.stderr, done.stderr
        return
    assert done.returncode == 0, done.stdout + done.stderr
    backends = {c["group"] for c in checks} - {"diagd"}
    rows = {m.group(1) for m in re.finditer(r"^(\S+): (to install|nothing to install|installed)", done.stdout,
                                            re.MULTILINE)}
    assert rows == backends, done.stdout
