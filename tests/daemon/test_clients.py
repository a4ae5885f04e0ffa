"""`diagd client add HOST` / `client list`, run as a user runs them: the real command, a temporary HOME
and working directory, each host's real file name and format."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIAGD

# host -> (its user file under HOME, the key holding servers, whether entries say "type": "stdio")
HOSTS = {
    "claude-desktop": (".config/Claude/claude_desktop_config.json", "mcpServers", False),
    "claude-code": (".claude.json", "mcpServers", True),
    "cursor": (".cursor/mcp.json", "mcpServers", False),
    "vscode": (".config/Code/User/mcp.json", "servers", True),
    "windsurf": (".codeium/windsurf/mcp_config.json", "mcpServers", False),
}
PROJECT = {"claude-code": ".mcp.json", "cursor": ".cursor/mcp.json", "vscode": ".vscode/mcp.json"}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    return tmp_path / "home"


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGD_", "XDG_"))}
    return subprocess.run([DIAGD, "client", *args], env={**env, "HOME": str(home)}, cwd=home.parent / "project",
                          capture_output=True, text=True, timeout=60, check=False)


def expected(host: str, args: list[str]) -> dict[str, Any]:
    typed = HOSTS[host][2]
    out: dict[str, Any] = {"type": "stdio"} if typed else {}
    out |= {"command": str(Path(DIAGD).absolute()), "args": args}
    return out | ({"env": {}} if host == "claude-code" else {})


@pytest.mark.parametrize("host", list(HOSTS))
def test_add_writes_the_hosts_own_file_and_format(home: Path, host: str) -> None:
    done = run(home, "add", host, "--tools", "pcap,crash")
    assert done.returncode == 0, done.stderr
    path, key, _ = HOSTS[host]
    written = json.loads((home / path).read_text())
    assert written == {key: {"diagd": expected(host, ["mcp", "--tools", "pcap,crash"])}}
    assert Path(written[key]["diagd"]["command"]).is_absolute()
    assert stat.S_IMODE((home / path).stat().st_mode) == 0o600  # a new file may hold env: owner only
    assert f"in {home / path}" in done.stdout
    again = run(home, "add", host, "--tools", "pcap,crash")
    assert again.returncode == 0 and "nothing to change" in again.stdout


@pytest.mark.parametrize("host", list(HOSTS))
def test_add_merges_into_a_file_with_other_servers_and_keys_and_keeps_a_backup(home: Path, host: str) -> None:
    path, key, _ = HOSTS[host]
    file = home / path
    file.parent.mkdir(parents=True, exist_ok=True)
    before = {"theme": "dark", key: {"other": {"command": "/usr/bin/other", "args": ["--x"]},
                                     "diagd": {"command": "/old/diagd", "args": ["mcp"]}},
              "projects": {"/p": {"mcpServers": {"kept": {"command": "k"}}}}}
    file.write_text(json.dumps(before))
    file.chmod(0o640)
    done = run(home, "add", host)
    assert done.returncode == 0, done.stderr
    after = json.loads(file.read_text())
    assert after == {**before, key: {"other": before[key]["other"], "diagd": expected(host, ["mcp"])}}
    assert list(after[key]) == ["other", "diagd"] and list(after) == list(before)  # order kept
    assert stat.S_IMODE(file.stat().st_mode) == 0o640
    backup = file.with_name(file.name + ".diagd-backup")
    assert json.loads(backup.read_text()) == before and "updated 'diagd'" in done.stdout


@pytest.mark.parametrize("host", list(HOSTS))
def test_print_mode_prints_the_entry_and_writes_nothing(home: Path, host: str) -> None:
    done = run(home, "add", host, "--print", "--tools", "serial")
    assert done.returncode == 0, done.stderr
    path, key, _ = HOSTS[host]
    assert json.loads(done.stdout) == {key: {"diagd": expected(host, ["mcp", "--tools", "serial"])}}
    assert str(home / path) in done.stderr
    assert list(home.iterdir()) == []


@pytest.mark.parametrize("host", list(PROJECT))
def test_project_scope_writes_in_the_working_directory(home: Path, host: str) -> None:
    done = run(home, "add", host, "--scope", "project", "--name", "diag")
    assert done.returncode == 0, done.stderr
    written = json.loads((home.parent / "project" / PROJECT[host]).read_text())
    assert written == {HOSTS[host][1]: {"diag": expected(host, ["mcp"])}}
    assert list(home.iterdir()) == []


def test_a_file_that_is_not_json_is_refused_and_left_as_it_is(home: Path) -> None:
    file = home / ".config/Code/User/mcp.json"
    file.parent.mkdir(parents=True)
    text = '{\n  // my servers\n  "servers": {}\n}\n'  # VS Code allows comments; diagd could not keep them
    file.write_text(text)
    done = run(home, "add", "vscode")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"diagd client add: INVALID_ARGUMENT: {file} is not valid JSON (")
    assert "diagd leaves it as it is; add this by hand: {\"servers\": {\"diagd\": {\"type\": \"stdio\"" in done.stderr
    assert file.read_text() == text and sorted(p.name for p in file.parent.iterdir()) == ["mcp.json"]
    (home / ".cursor").mkdir()
    (home / ".cursor/mcp.json").write_text('{"mcpServers": ["a list"]}')
    assert "\"mcpServers\" is not an object" in run(home, "add", "cursor").stderr


def test_unknown_hosts_and_tool_groups_are_refused_with_close_matches(home: Path) -> None:
    host = run(home, "add", "claude")
    assert host.returncode == 2 and "unknown host 'claude' (did you mean" in host.stderr
    groups = run(home, "add", "cursor", "--tools", "pcap,crsh")
    assert groups.returncode == 1 and "unknown tool group 'crsh' (did you mean crash?)" in groups.stderr
    assert list(home.iterdir()) == []


def test_list_shows_where_diagd_is_configured(home: Path) -> None:
    assert run(home, "add", "cursor").returncode == 0
    assert run(home, "add", "vscode", "--scope", "project", "--tools", "pcap").returncode == 0
    (home / ".claude.json").write_text(json.dumps({"mcpServers": {"fs": {"command": "npx"}}}))
    (home / ".codeium/windsurf").mkdir(parents=True)
    (home / ".codeium/windsurf/mcp_config.json").write_text("{broken")
    rows = {(r["host"], r["scope"]): r for r in json.loads(run(home, "list", "--json").stdout)}
    assert set(rows) == {(h, "user") for h in HOSTS} | {(h, "project") for h in PROJECT}
    assert list(rows["cursor", "user"]["servers"]) == ["diagd"]
    assert rows["vscode", "project"]["servers"]["diagd"]["args"] == ["mcp", "--tools", "pcap"]
    assert rows["claude-code", "user"]["servers"] == {} and rows["claude-code", "user"]["exists"]
    assert "not valid JSON" in rows["windsurf", "user"]["error"]
    text = run(home, "list").stdout
    assert "Cursor (user)" in text and f"{home / '.cursor/mcp.json'}: diagd: " in text
    assert f"{home / '.claude.json'}: no diagd" in text
