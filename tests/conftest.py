"""Shared fixtures: an isolated environment per test, and a real `diagd serve` subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio.testing

from tests.module_times import ModuleTimes
from tests.skip_policy import SkipPolicy, strict

REPO = Path(__file__).resolve().parent.parent
SUPPORT = Path(__file__).resolve().parent / "support"
DIAGD = shutil.which("diagd", path=str(Path(sys.executable).parent)) or "diagd"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(strict()), "diagd-skip-policy")
    config.pluginmanager.register(ModuleTimes(), "diagd-module-times")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Virtual time that jumps whenever every task is blocked: timers tested to the exact tick."""
    return trio.testing.MockClock(autojump_threshold=0)


@dataclass
class Env:
    root: Path
    runtime: Path
    state: Path
    config: Path
    vars: dict[str, str]

    def run(self, *args: str, input: bytes | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DIAGD, *args], env=self.vars, capture_output=True, text=True,
                              input=input.decode() if input else None, timeout=timeout, check=False)

    def write_config(self, text: str) -> None:
        self.config.write_text(text)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    # Unix socket paths are limited to 107 bytes: keep the runtime dir short.
    runtime = Path(f"/tmp/diagd-test-{os.getpid()}-{tmp_path.name[-12:]}")
    shutil.rmtree(runtime, ignore_errors=True)
    config = tmp_path / "config.toml"
    config.write_text('[daemon]\nextra_backends = ["echo_actor"]\nidle_timeout_s = 600\n')
    variables = {
        **os.environ,
        "DIAGD_RUNTIME_DIR": str(runtime),
        "DIAGD_STATE_DIR": str(tmp_path / "state"),
        "DIAGD_CONFIG": str(config),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH", "")])),
    }
    variables.pop("NOTIFY_SOCKET", None)
    yield Env(tmp_path, runtime, tmp_path / "state", config, variables)
    shutil.rmtree(runtime, ignore_errors=True)


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    env: Env

    @property
    def mcp_socket(self) -> Path:
        return self.env.runtime / "mcp.sock"

    @property
    def control_socket(self) -> Path:
        return self.env.runtime / "control.sock"

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return (self.env.root / "daemon.log").read_text(errors="replace")


def wait_for_path(path: Path, proc: subprocess.Popen[bytes] | None = None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode} before {path} appeared")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def start_daemon(env: Env, extra_env: dict[str, str] | None = None) -> DaemonProcess:
    logfile = open(env.root / "daemon.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([DIAGD, "serve"], env={**env.vars, **(extra_env or {})},
                            stdout=logfile, stderr=subprocess.STDOUT)
    daemon = DaemonProcess(proc, env)
    wait_for_path(daemon.control_socket, proc)
    wait_for_path(daemon.mcp_socket, proc)
    return daemon


@pytest.fixture
def daemon(env: Env) -> Iterator[DaemonProcess]:
    d = start_daemon(env)
    yield d
    d.stop()


@pytest.fixture(autouse=True)
def replies_match_their_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real call through the MCP SDK's client, in every test, has its reply validated against the
    tool's whole generated output schema (tests/support/reply_check.py)."""
    try:
        from mcp import Client
    except ImportError:  # pragma: no cover - the SDK is a dependency
        return
    from tests.support.reply_check import check

    original = Client.call_tool

    async def call_tool(self: Client, name: str, *args: object, **kwargs: object) -> object:
        result = await original(self, name, *args, **kwargs)  # type: ignore[arg-type]
        check(name, result)
        return result

    monkeypatch.setattr(Client, "call_tool", call_tool)
