"""The official MCP Inspector's command-line clients against a real daemon, as a user would run them.

- `inspector --cli` over stdio (`diagd mcp`, which Inspector starts with only HOME, PATH, PWD, SHELL and
  TERM: diagd's variables go in with `-e`) and over HTTP with a bearer header: tools/list, tools/call.
- Without a token Inspector gets a clear refusal, never an OAuth flow: with `--stored-auth-only` (its
  mode for scripts) it quotes diagd's 401 message; with a terminal it tries to register an OAuth
  client, and quotes diagd's 404 saying to send a bearer token.
- `mcpdo` (Inspector's connection CLI, which keeps one connection across commands) goes on calling
  across `diagd restart` with no new `connect`.

`scripts/setup.sh test` installs Inspector and the Node it needs (>= 22.19) into
~/.cache/diagd/inspector (DIAGD_INSPECTOR_DIR); without them this skips.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DIAGD, Env
from tests.e2e.test_http import add_token, free_port

pytestmark = pytest.mark.e2e

INSPECTOR_VERSION = "2.12.0"  # as scripts/setup.sh installs it
INSPECTOR_DIR = Path(os.environ.get("DIAGD_INSPECTOR_DIR", Path.home() / ".cache" / "diagd" / "inspector"))
DIAGD_VARS = ("DIAGD_RUNTIME_DIR", "DIAGD_STATE_DIR", "DIAGD_CONFIG", "PYTHONPATH")
MCPDO_TOKEN = secrets.token_urlsafe(32)  # what `mcpdo private` makes: the test's own mcpdo daemon, token-gated


def installed() -> Path:
    bindir = INSPECTOR_DIR / "node_modules" / ".bin"
    package = INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "package.json"
    if not (bindir / "inspector").exists() or not (bindir / "node").exists():
        pytest.skip(f"MCP Inspector is not installed in {INSPECTOR_DIR} (scripts/setup.sh test installs it)")
    assert json.loads(package.read_text())["version"] == INSPECTOR_VERSION, "re-run scripts/setup.sh test"
    return bindir


@dataclass
class Inspector:
    env: Env
    bindir: Path
    url: str
    token: str
    mcpdo_dir: Path  # short: mcpdo's socket goes there

    def vars(self) -> dict[str, str]:
        """Its own node first on PATH; its catalog, secrets and mcpdo daemon kept in the test's directory."""
        home = self.env.root / "inspector-home"
        home.mkdir(exist_ok=True)
        return {**self.env.vars, "PATH": f"{self.bindir}{os.pathsep}{self.env.vars['PATH']}", "HOME": str(home),
                "MCP_INSPECTOR_SECRET_STORE": "file", "MCP_INSPECTOR_DAEMON_DIR": str(self.mcpdo_dir),
                "MCP_INSPECTOR_DAEMON_TOKEN": MCPDO_TOKEN}

    def run(self, *args: str, tool: str = "inspector", tty: bool = False) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / tool), *args]
        if tty:  # Inspector decides on an interactive OAuth flow only with a terminal
            argv = ["script", "-qec", " ".join(_quoted(a) for a in argv), "/dev/null"]
        return subprocess.run(argv, env=self.vars(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120, check=False)

    def stdio(self, *args: str) -> subprocess.CompletedProcess[str]:
        passed = [arg for name in DIAGD_VARS if name in self.env.vars
                  for arg in ("-e", f"{name}={self.env.vars[name]}")]
        return self.run("--cli", *passed, "--format", "json", *args, DIAGD, "mcp", "--no-autostart")

    def http(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        header = ["--header", f"Authorization: Bearer {token or self.token}"] if token != "" else []
        return self.run("--cli", self.url, *header, "--format", "json", *args)


def _quoted(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def answer(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    result: dict[str, object] = json.loads(done.stdout)["result"]
    return result


def refusal(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Inspector's error envelope ({"error": {code, message}}, on stderr), whatever else it printed."""
    assert done.returncode != 0, done.stdout
    lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip().startswith('{"error"')]
    assert lines, (done.stdout, done.stderr)
    error: dict[str, str] = json.loads(lines[-1])["error"]
    return error


@pytest.fixture
def inspector(env: Env) -> Iterator[Inspector]:
    bindir = installed()
    port = free_port()
    env.write_config(f'[daemon]\nextra_backends = ["echo_actor"]\nidle_timeout_s = 600\n'
                     f'[http]\nlisten = "127.0.0.1:{port}"\n')
    token = add_token(env, "inspector")
    done = env.run("start", timeout=60)
    assert done.returncode == 0, done.stderr
    mcpdo_dir = Path(tempfile.mkdtemp(prefix="mcpdo-", dir="/tmp"))
    try:
        yield Inspector(env, bindir, f"http://127.0.0.1:{port}/mcp", token, mcpdo_dir)
    finally:
        env.run("stop", timeout=60)
        shutil.rmtree(mcpdo_dir, ignore_errors=True)


ECHO = ("--method", "tools/call", "--tool-name", "echo", "--tool-args-json", '{"message": "from inspector"}')


def test_inspector_lists_and_calls_over_stdio_and_over_http_with_a_header_token(inspector: Inspector) -> None:
    for transport in (inspector.stdio, inspector.http):
        listed = answer(transport("--method", "tools/list"))
        names = {t["name"] for t in listed["tools"]}  # type: ignore[attr-defined]
        assert {"echo", "diagd_status", "pcap_info"} <= names, transport
        called = answer(transport(*ECHO))
        assert called["isError"] is False
        assert called["structuredContent"] == {"message": "from inspector", "resource": "default"}
    records = [json.loads(line) for line in (inspector.env.state / "audit.jsonl").read_text().splitlines()]
    assert sorted(r["client"].split(":")[0] for r in records if r["tool"] == "echo" and r["outcome"] == "ok") == [
        "http", "mcp"]


def test_inspector_without_a_token_gets_diagds_reason_and_no_oauth_flow(inspector: Inspector) -> None:
    scripted = refusal(inspector.http("--stored-auth-only", "--method", "tools/list", token=""))
    assert scripted["code"] == "auth_required"
    assert "diagd needs a bearer token: send `Authorization: Bearer <token>`" in scripted["message"]
    wrong = refusal(inspector.http("--stored-auth-only", "--method", "tools/list", token="diagd_not-a-token"))
    assert "diagd token add NAME" in wrong["message"]
    # At a terminal it tries to register an OAuth client; diagd's 404 says what to do instead.
    at_a_terminal = refusal(inspector.run("--cli", inspector.url, "--method", "tools/list", tty=True))
    assert at_a_terminal["message"].startswith("Dynamic Client Registration rejected (HTTP 404): diagd serves MCP "
                                               "at /mcp and has no OAuth authorization server: send `Authorization: "
                                               "Bearer <token>`"), at_a_terminal
    assert answer(inspector.http("--method", "tools/list"))["tools"]  # and with the header it works


def test_mcpdo_goes_on_calling_across_diagd_restart(inspector: Inspector) -> None:
    try:
        connected = inspector.run("--format", "json", "connect", inspector.url, "--header",
                                  f"Authorization: Bearer {inspector.token}", tool="mcpdo")
        assert connected.returncode == 0, connected.stderr
        call = ("--format", "json", "--connection", inspector.url, "tools/call", "echo")
        before = inspector.run(*call, "message:=before", tool="mcpdo")
        assert json.loads(before.stdout)["structuredContent"]["message"] == "before", before.stderr
        restarted = inspector.env.run("restart", timeout=90)
        assert restarted.returncode == 0, restarted.stderr
        after = inspector.run(*call, "message:=after", tool="mcpdo")  # no new `connect`
        assert after.returncode == 0 and json.loads(after.stdout)["structuredContent"]["message"] == "after", (
            after.stdout, after.stderr)
    finally:
        stop_mcpdo(inspector)


def stop_mcpdo(inspector: Inspector) -> None:
    """Its background daemon (mcpdod), asked to stop, then ended by its pid if it did not."""
    status = inspector.run("--format", "json", "daemon", "status", tool="mcpdo")
    try:
        pid = int(json.loads(status.stdout)["pid"])
    except (ValueError, KeyError, TypeError):
        pid = None
    inspector.run("daemon", "stop", tool="mcpdo")
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)  # gone already after `daemon stop`, normally
        except ProcessLookupError:
            pass
