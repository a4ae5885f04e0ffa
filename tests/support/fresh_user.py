"""A throw-away user for tests that must not meet this user's real daemon: a fresh uid with no passwd
entry, its own HOME and, like systemd-logind makes it, its own /run/user/$UID (mode 0700).

Root only (setpriv switches to the uid). Every process the uid ran is ended by pid at the end; the
directories are removed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

RUN_USER = Path("/run/user")


@dataclass
class FreshUser:
    uid: int
    home: Path
    base: Path  # 0755, root's: files the user may read (a config) live here
    run_user: Path

    def setpriv(self, *argv: str) -> list[str]:
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups", "--", *argv]

    def run(self, argv: list[str], env: dict[str, str], *, cwd: Path | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.setpriv(*argv), env=env, cwd=cwd or self.home, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def pids(self) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == self.uid:
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found


def _free_uid() -> int:
    start = 62000 + os.getpid() % 1000
    for uid in range(start, start + 500):
        try:
            pwd.getpwuid(uid)
            continue
        except KeyError:
            pass
        if not (RUN_USER / str(uid)).exists():
            return uid
    raise RuntimeError("no free uid")


@contextmanager
def fresh_user(*, session_dir: bool = True) -> Iterator[FreshUser]:
    uid = _free_uid()
    base = Path(tempfile.mkdtemp(prefix=f"diagd-u{uid}-", dir="/tmp"))
    base.chmod(0o755)
    home = base / "home"
    home.mkdir(mode=0o700)
    os.chown(home, uid, uid)
    run_user = RUN_USER / str(uid)
    if session_dir:
        run_user.mkdir(mode=0o700)
        os.chown(run_user, uid, uid)
    user = FreshUser(uid, home, base, run_user)
    try:
        yield user
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # named steps: ask, then force, the uid's processes only
            for pid in user.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for _ in range(100):
                if not user.pids():
                    break
                time.sleep(0.05)
        shutil.rmtree(run_user, ignore_errors=True)
        shutil.rmtree(f"/tmp/diagd-{uid}", ignore_errors=True)  # the fallback runtime dir
        shutil.rmtree(base, ignore_errors=True)
