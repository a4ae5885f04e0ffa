"""diagd installed as users of the ecosystem install it: a wheel in a venv of its own (`pipx install`,
`uv tool install`), no checkout on sys.path, run from a directory that holds a `diagd/` folder and a
`msgpack.py` of its own (names a careless launcher would import instead of the installed ones)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests import backends
from tests.pcaps import pcap
from tests.support.wheel_venv import clean_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A user's project directory with a `diagd/` package and a `msgpack.py` that must never be imported."""
    where = tmp_path / "project"
    (where / "diagd").mkdir(parents=True)
    (where / "diagd" / "__init__.py").write_text("raise SystemExit('the diagd/ folder of the cwd was imported')\n")
    (where / "msgpack.py").write_text("raise SystemExit('the msgpack.py of the cwd was imported')\n")
    return where


@pytest.fixture
def user_env(tmp_path: Path) -> dict[str, str]:
    runtime = Path(f"/tmp/diagd-inst-{tmp_path.name[-12:]}")
    return clean_env(DIAGD_RUNTIME_DIR=str(runtime), DIAGD_STATE_DIR=str(tmp_path / "state"),
                     DIAGD_CONFIG=str(tmp_path / "config.toml"), HOME=str(tmp_path))


def run(diagd: Path, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(diagd), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)


def _views_build_input(repo: Path, path: Path) -> bool:
    """A source the MCP Apps views are built from (daemon/views: npm project, TypeScript, the test host):
    the wheel holds what the build makes (views/dist/*.html) and the web view's page (views/src/web/),
    which the daemon serves as it is, not these."""
    views = repo / "daemon" / "views"
    if views not in path.parents:
        return False
    inside = path.relative_to(views).parts
    return inside[0] not in ("dist",) and inside[:2] != ("src", "web") and "node_modules" not in inside


def test_the_wheel_holds_every_file_the_package_runs(installed_diagd: Path) -> None:
    (wheel,) = installed_diagd.parent.parent.parent.glob("dist/diagd-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    repo = Path(__file__).resolve().parents[2]
    for top, package in (("daemon", "diagd/daemon"), ("actors", "diagd/actors"), ("protocol", "diagd/protocol"),
                         ("systemd", "diagd/systemd")):
        for path in (repo / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and not _views_build_input(repo, path):
                assert f"{package}/{path.relative_to(repo / top).as_posix()}" in names, path
    # run by path, never imported: they must be there as files
    assert {"diagd/actors/sandbox/launcher.py", "diagd/actors/sandbox/kernel.py",
            "diagd/actors/crash/drgn_worker.py", "diagd/systemd/README.md"} <= names
    assert not {n for n in names if n.split("/")[0] in ("daemon", "actors", "protocol", "systemd", "tests")}


def test_installed_diagd_starts_and_answers_from_a_directory_with_a_diagd_folder(
        installed_diagd: Path, user_env: dict[str, str], workdir: Path) -> None:
    started = run(installed_diagd, user_env, workdir, "start")
    try:
        log = Path(user_env["DIAGD_STATE_DIR"]) / "daemon.log"
        assert started.returncode == 0, started.stderr + (log.read_text()[-2000:] if log.exists() else "")
        status = run(installed_diagd, user_env, workdir, "status", "--json")
        assert status.returncode == 0, status.stderr
        daemon = json.loads(status.stdout)["daemon"]
        assert f"pid {daemon['pid']}" in started.stdout
        argv0 = Path(f"/proc/{daemon['pid']}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert argv0.startswith(str(installed_diagd.parent)), argv0  # the tool venv's Python
        help_ = run(installed_diagd, user_env, workdir, "setup", "pcap", "--help")
        assert help_.returncode == 0 and "--dry-run" in help_.stdout, help_.stderr
        dry = run(installed_diagd, user_env, workdir, "setup", "pcap", "--dry-run")
        assert dry.returncode == 0 and dry.stdout.startswith("pcap: "), dry.stdout + dry.stderr
        called = run(installed_diagd, user_env, workdir, "call", "pcap_info",
                     f"pcap_path={pcap('adrian_registration_reject.pcap')}", "--visibility=off")
        assert called.returncode == 0, called.stdout + called.stderr
        doctor = json.loads(run(installed_diagd, user_env, workdir, "doctor", "--json").stdout)
        assert {c["group"] for c in doctor} >= {"diagd", *backends.names()}
    finally:
        run(installed_diagd, user_env, workdir, "stop")


def test_the_installed_samples_are_listed_copied_and_read_by_the_daemon(
        installed_diagd: Path, user_env: dict[str, str], workdir: Path) -> None:
    """README's first prompts for a user who installed the wheel and nothing else: the samples are in the
    tool's venv, `diagd examples --copy` puts them in a folder of the user's, the daemon reads both."""
    listed = run(installed_diagd, user_env, workdir, "examples", "--json")
    assert listed.returncode == 0, listed.stderr
    samples = json.loads(listed.stdout)["samples"]
    assert len(samples) >= 3 and all(s["path"].startswith(str(installed_diagd.parent.parent)) for s in samples)
    copied = run(installed_diagd, user_env, workdir, "examples", "--copy", "mine")
    assert copied.returncode == 0 and (workdir / "mine" / "NOTICE").is_file(), copied.stderr
    started = run(installed_diagd, user_env, workdir, "start")
    try:
        assert started.returncode == 0, started.stderr
        for path in (samples[0]["path"], f"mine/{samples[-1]['name']}"):  # installed; copied, relative to cwd
            called = run(installed_diagd, user_env, workdir, "call", "pcap_info", f"pcap_path={path}",
                         "--visibility=off")
            assert called.returncode == 0 and json.loads(called.stdout)["packet_count"] > 0, called.stderr
    finally:
        run(installed_diagd, user_env, workdir, "stop")


def test_client_add_prints_a_configuration_from_the_installed_diagd(
        installed_diagd: Path, user_env: dict[str, str], workdir: Path) -> None:
    if run(installed_diagd, user_env, workdir, "client", "--help").returncode != 0:
        pytest.skip("`diagd client` does not exist on this branch yet (built separately: issue 21)")
    done = run(installed_diagd, user_env, workdir, "client", "add", "claude-code", "--print")
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(installed_diagd) in done.stdout
