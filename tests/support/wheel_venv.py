"""diagd installed as a user installs it: a wheel built from the tracked files of this checkout (and the views
built from them), in a
fresh virtualenv of its own (what `pipx install` / `uv tool install` make), no checkout on sys.path.

The interpreter is one every user may run (a throw-away uid runs it in tests/e2e/test_one_daemon.py).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
PIP_TIMEOUT_S = 900  # the dependencies come from the configured index


def tracked_copy(dest: Path) -> Path:
    """The files git tracks, copied (a wheel built from it cannot pick up anything else)."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True,
                           timeout=60).stdout.decode().split("\0")
    for name in filter(None, files):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, target)
    return dest


VIEWS_BUILT = Path("daemon") / "views" / "dist"  # where `scripts/build-views.sh --install` puts the views


def build_wheel(work: Path) -> Path:
    """A wheel as a release is built: the tracked files plus the views built from them (the build's output,
    not tracked: `build-views.sh --install` before the wheel, as setup.sh does)."""
    source = tracked_copy(work / "src")
    built = sorted([*(REPO / VIEWS_BUILT).glob("*.html"), *(REPO / VIEWS_BUILT).glob("*.js")])  # views, web host
    if built:
        (source / VIEWS_BUILT).mkdir(parents=True, exist_ok=True)
        for view in built:
            shutil.copy2(view, source / VIEWS_BUILT / view.name)
    out = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
                   check=True, capture_output=True, timeout=PIP_TIMEOUT_S)
    (wheel,) = out.glob("diagd-*.whl")
    return wheel


def others_can_run(path: Path) -> bool:
    real = path.resolve()
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


def interpreter() -> str:
    """This Python, or the system's (same minor version) when another uid could not run this one."""
    mine = Path(getattr(sys, "_base_executable", sys.executable))
    if others_can_run(mine):
        return str(mine)
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    return str(system) if others_can_run(system) else str(mine)


def install_tool(wheel: Path, venv: Path) -> Path:
    """`pipx install WHEEL` by hand: a venv of its own, the wheel and its dependencies; its diagd."""
    subprocess.run([interpreter(), "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {wheel.name} failed:\n{done.stderr[-4000:]}")
    for d in (venv, *venv.rglob("*")):  # readable by a throw-away uid (a pipx venv is the user's own)
        if d.is_dir() and not d.is_symlink():
            d.chmod(d.stat().st_mode | 0o055)
        elif d.is_file() and not d.is_symlink():
            d.chmod(d.stat().st_mode | (0o055 if d.stat().st_mode & stat.S_IXUSR else 0o044))
    return venv / "bin" / "diagd"


def clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH, no venv of the checkout: only what a user's shell would have."""
    keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME")}
    return {**keep, "PATH": "/usr/local/bin:/usr/bin:/bin", **extra}
