"""One daemon per user, whatever the environment: `diagd mcp` started by an MCP host's launcher, which
passes only HOME, PATH and a few more (no XDG_RUNTIME_DIR, no DIAGD_CONFIG), reaches the daemon
`diagd status` shows in the user's shell, and an autostart from there runs on the shell's config.

The real launchers: the Python SDK's stdio_client and the TypeScript SDK's StdioClientTransport, each
with its default environment. The user is a fresh uid with its own /run/user/$UID (as systemd-logind
makes it), so this user's real daemon is never met (tests/support/fresh_user.py: needs root), and runs
diagd installed from a wheel (tests/support/wheel_venv.py), which any uid can run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import SUPPORT
from tests.support.fresh_user import FreshUser, fresh_user

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs diagd as a fresh uid with its own /run/user/$UID (needs "
                       "root); as this user it would meet the user's real daemon"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is absent"),
]

NODE_SDK = Path.home() / ".cache" / "diagd" / "node-sdk"  # npm install --prefix it @modelcontextprotocol/sdk


@dataclass
class Installed:
    """A fresh user, and the diagd it runs (the tool venv's bin first on its PATH)."""

    user: FreshUser
    diagd: str

    @property
    def path(self) -> str:
        return f"{Path(self.diagd).parent}:/usr/bin:/bin"

    def run(self, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        return self.user.run([self.diagd, *args], env)


@pytest.fixture
def me(installed_diagd: Path) -> Iterator[Installed]:
    with fresh_user() as user:
        yield Installed(user, str(installed_diagd))


def shell_env(me: Installed, config: Path) -> dict[str, str]:
    """A login shell's environment: XDG_RUNTIME_DIR set, and a config that is not the default one."""
    return {"HOME": str(me.user.home), "PATH": me.path, "XDG_RUNTIME_DIR": str(me.user.run_user),
            "DIAGD_CONFIG": str(config)}


def status(me: Installed, env: dict[str, str]) -> dict[str, Any]:
    done = me.run(env, "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout)["daemon"])


def config_elsewhere(user: FreshUser) -> Path:
    config = user.base / "elsewhere.toml"
    config.write_text("[daemon]\nidle_timeout_s = 600\n")
    config.chmod(0o644)
    return config


def stripped_launcher_env(monkeypatch: pytest.MonkeyPatch, me: Installed) -> None:
    """What the SDKs' default environment will take from us: HOME and PATH of the user (plus USER,
    LOGNAME, SHELL, TERM as they are)."""
    monkeypatch.setenv("HOME", str(me.user.home))
    monkeypatch.setenv("PATH", me.path)
    for name in ("XDG_RUNTIME_DIR", "DIAGD_CONFIG", "DIAGD_STATE_DIR", "DIAGD_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)


async def status_through_python_sdk(me: Installed, *flags: str) -> dict[str, Any]:
    argv = me.user.setpriv(me.diagd, "mcp", *flags)
    params = StdioServerParameters(command=argv[0], args=argv[1:], cwd=me.user.home)
    assert params.env is None  # the SDK's default environment
    async with Client(params, mode="legacy") as client:
        with trio.fail_after(60):
            result = await client.call_tool("diagd_status", {})
    assert not result.is_error, result.content
    return dict(json.loads(result.content[0].text)["daemon"])


async def test_python_sdk_stdio_default_env_reaches_the_shells_daemon(me: Installed,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config = config_elsewhere(me.user)
    shell = shell_env(me, config)
    started = me.run(shell, "start")
    assert started.returncode == 0, started.stderr
    first = status(me, shell)
    assert first["config"] == str(config) and first["sockets"]["mcp"].endswith("/diagd/mcp.sock")
    assert Path(f"/run/user/{me.user.uid}/diagd/mcp.sock").exists()

    stripped_launcher_env(monkeypatch, me)
    assert (await status_through_python_sdk(me, "--no-autostart"))["pid"] == first["pid"]
    assert (await status_through_python_sdk(me))["pid"] == first["pid"]  # as hosts run it: autostart on
    assert not Path(f"/tmp/diagd-{me.user.uid}").exists()  # no second runtime dir, so no second daemon

    # The daemon stopped, the stripped shim starts one: on the shell's config (recorded by the last daemon).
    assert me.run(shell, "stop").returncode == 0
    again = await status_through_python_sdk(me)
    assert again["pid"] != first["pid"] and again["config"] == str(config)
    assert again["state_dir"] == first["state_dir"]
    assert status(me, shell)["pid"] == again["pid"]


@pytest.mark.skipif(not (NODE_SDK / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(),
                    reason=f"the TypeScript MCP SDK is not in {NODE_SDK} (npm install --prefix {NODE_SDK} "
                           "@modelcontextprotocol/sdk@1.32.2; scripts/setup.sh test does it)")
@pytest.mark.skipif(shutil.which("node") is None, reason="node is absent")
def test_typescript_sdk_stdio_default_env_reaches_the_shells_daemon(me: Installed) -> None:
    config = config_elsewhere(me.user)
    shell = shell_env(me, config)
    assert me.run(shell, "start").returncode == 0
    pid = status(me, shell)["pid"]
    # node runs as us, with only HOME and PATH; the SDK launches the shim with its default environment.
    done = subprocess.run(["node", str(SUPPORT / "ts_stdio_status.mjs"), str(NODE_SDK),
                           *me.user.setpriv(me.diagd, "mcp")],
                          env={"HOME": str(me.user.home), "PATH": me.path}, cwd=me.user.home,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout)
    assert seen["daemon"]["pid"] == pid
    assert set(seen["launcher_env"]) <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}
