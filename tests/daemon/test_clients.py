"""`diagd client add|remove HOST` / `client list`, run as a user runs them: the real command, a temporary
HOME and working directory, each host's real file name and format, and the files a careful user would
not want written: links planted in a checkout, FIFOs, devices, huge files, NaN."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DIAGD, Env, start_daemon

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


def run(home: Path, *args: str, runtime: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`diagd client ARGS` in the project directory; a command that hangs (on a FIFO, say) fails the test.
    `runtime`: a DIAGD_RUNTIME_DIR (where no daemon runs: the served groups are what one would serve)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIAGD_", "XDG_"))}
    env |= {"HOME": str(home)} | ({"DIAGD_RUNTIME_DIR": str(runtime)} if runtime else {})
    return subprocess.run([DIAGD, "client", *args], env=env, cwd=home.parent / "project",
                          capture_output=True, text=True, timeout=60, check=False)


def backups(file: Path) -> list[Path]:
    return sorted(file.parent.glob(file.name + ".diagd-backup-*"))


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
    [backup] = backups(file)  # a fresh name: <file>.diagd-backup-<time>-<random>
    assert backup.read_text() == json.dumps(before) and stat.S_IMODE(backup.stat().st_mode) == 0o640
    assert f"updated 'diagd' in {file}" in done.stdout and f"the old file is {backup}" in done.stdout
    assert sorted(p.name for p in file.parent.iterdir() if p.name.startswith(file.name)) == [file.name, backup.name]


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


@pytest.mark.parametrize("host", list(PROJECT))
def test_an_entry_of_the_same_name_in_the_other_scope_is_said(home: Path, host: str) -> None:
    assert run(home, "add", host).returncode == 0
    done = run(home, "add", host, "--scope", "project")
    assert done.returncode == 0, done.stderr
    user_file = home / HOSTS[host][0]
    assert ("note: " in done.stderr and f"user scope ({user_file}) also has a server named "
            "'diagd'" in done.stderr and f"diagd client remove {host} --scope user" in done.stderr), done.stderr
    back = run(home, "add", host, "--name", "other")  # another name: no note
    assert back.returncode == 0 and "also has a server" not in back.stderr, back.stderr
    again = run(home, "add", host, "--name", "diagd", "--tools", "pcap")  # the user one, the project one there
    assert "project scope" in again.stderr and "--scope project" in again.stderr, again.stderr


def test_a_file_that_is_not_json_is_refused_and_left_as_it_is(home: Path) -> None:
    file = home / ".cursor/mcp.json"
    file.parent.mkdir(parents=True)
    text = '{\n  // my servers\n  "mcpServers": {}\n}\n'  # comments: VS Code's file may have them, Cursor's not
    file.write_text(text)
    done = run(home, "add", "cursor")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"diagd client add: INVALID_ARGUMENT: {file} is not valid JSON (")
    assert "diagd leaves it as it is; add this by hand: {\"mcpServers\": {\"diagd\": {\"command\"" in done.stderr
    assert file.read_text() == text and sorted(p.name for p in file.parent.iterdir()) == ["mcp.json"]
    file.write_text('{"mcpServers": ["a list"]}')
    assert "\"mcpServers\" is not an object" in run(home, "add", "cursor").stderr
    vscode = home / ".config/Code/User/mcp.json"
    vscode.parent.mkdir(parents=True)
    vscode.write_text('{\n  "servers": {\n  // no closing brace\n}\n')
    done = run(home, "add", "vscode")
    assert done.returncode == 1 and f"{vscode} is not valid JSON, comments and trailing commas allowed (" in done.stderr
    assert sorted(p.name for p in vscode.parent.iterdir()) == ["mcp.json"]


def test_unknown_hosts_and_tool_groups_are_refused_with_close_matches(home: Path) -> None:
    host = run(home, "add", "claude")
    assert host.returncode == 2 and "unknown host 'claude' (did you mean" in host.stderr
    groups = run(home, "add", "cursor", "--tools", "pcap,crsh")
    assert groups.returncode == 2 and "unknown tool group 'crsh' (did you mean crash?)" in groups.stderr
    assert list(home.iterdir()) == []


def test_a_group_the_daemon_serves_nothing_of_is_refused_with_its_hint_and_taken_once_on(home: Path) -> None:
    from diagd.actors.capture import OFF_HINT, OFF_REASON

    runtime = home.parent / "run"  # no daemon there: the groups are what a daemon started now would serve
    for print_only in ([], ["--print"]):
        off = run(home, "add", "cursor", *print_only, "--tools", "pcap,capture", runtime=runtime)
        assert off.returncode == 2 and off.stdout == ""  # a usage error, like an unknown host
        assert off.stderr == (f"diagd client add: INVALID_ARGUMENT: --tools: the 'capture' group serves no tool, so "
                              f"the host could not start this entry: {OFF_REASON}; to turn it on: {OFF_HINT}; "
                              "then add the client again\n")
    assert 'add allowed_interfaces = ["eth1", "veth*"]' in OFF_HINT and "`diagd restart`" in OFF_HINT
    assert list(home.iterdir()) == [] and not runtime.exists()
    every = run(home, "add", "cursor", "--print", runtime=runtime)  # every group: taken, the off one named
    assert every.returncode == 0, every.stderr
    [note] = [line for line in every.stderr.splitlines() if "note:" in line]
    assert note == ("diagd client add: note: the host gets every group but capture, off under this config: "
                    f"capture: {OFF_REASON}; to turn it on: {OFF_HINT}")
    config = home / ".config" / "diagd" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[capture]\nallowed_interfaces = ["veth*"]\n')
    on = run(home, "add", "cursor", "--tools", "pcap,capture", runtime=runtime)
    assert on.returncode == 0, on.stderr
    assert "note:" not in on.stderr
    written = json.loads((home / ".cursor" / "mcp.json").read_text())
    assert written["mcpServers"]["diagd"]["args"][-2:] == ["--tools", "pcap,capture"]


@pytest.mark.e2e
def test_the_running_daemon_decides_which_groups_are_served(env: Env, home: Path) -> None:
    """The host's entry reaches the running daemon: until a restart, its groups count, not the config file's."""
    def add() -> subprocess.CompletedProcess[str]:
        return subprocess.run([DIAGD, "client", "add", "cursor", "--print", "--tools", "capture"],
                              env={**env.vars, "HOME": str(home)}, capture_output=True, text=True, timeout=60,
                              check=False)

    daemon = start_daemon(env)
    try:
        assert add().returncode == 2
        env.write_config('[capture]\nallowed_interfaces = ["veth*"]\n')  # not applied: the daemon still runs
        refused = add()
        assert refused.returncode == 2 and "then `diagd restart`" in refused.stderr
    finally:
        assert daemon.stop() == 0, daemon.log()
    accepted = add()  # no daemon: what one started now, with this config, would serve
    assert accepted.returncode == 0, accepted.stderr
    assert json.loads(accepted.stdout)["mcpServers"]["diagd"]["args"][-2:] == ["--tools", "capture"]


def test_a_diagd_inside_uvx_or_pipx_run_caches_is_named_and_one_installed_is_not(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from diagd.daemon.cli import clients

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    monkeypatch.delenv("PIPX_HOME", raising=False)
    uvx = home / ".cache" / "uv" / "archive-v0" / "abc" / "bin" / "diagd"
    pipx_run = home / ".local" / "pipx" / ".cache" / "0123" / "bin" / "diagd"
    installed = home / ".local" / "bin" / "diagd"
    assert clients.in_a_cache(str(uvx)) == "uv's cache (uvx)"
    assert clients.in_a_cache(str(pipx_run)) == "pipx's cache (pipx run)"
    assert clients.in_a_cache(str(installed)) is None
    assert clients.in_a_cache(str(home / ".cache" / "uvx-not-uv" / "diagd")) is None  # a folder, not a prefix
    monkeypatch.setenv("UV_CACHE_DIR", str(home / "elsewhere"))
    assert clients.in_a_cache(str(home / "elsewhere" / "x" / "diagd")) == "uv's cache (uvx)"


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


# -- the files a careful user would not want written, or that would hang or crash a reader


def test_a_backup_link_planted_in_a_checkout_is_never_written_through(home: Path) -> None:
    # A checkout holding `.mcp.json.diagd-backup -> ~/.claude.json`: a fixed backup name made
    # `add --scope project` copy the checkout's file over the user's global host config.
    project = home.parent / "project"
    user_config = home / ".claude.json"
    user_config.write_text('{"mcpServers": {"mine": {"command": "/usr/bin/mine"}}, "numStartups": 12}\n')
    own = user_config.read_text()
    planted = project / ".mcp.json.diagd-backup"
    planted.symlink_to(user_config)
    checkout = '{"mcpServers": {"theirs": {"command": "/tmp/theirs"}}}\n'
    (project / ".mcp.json").write_text(checkout)
    for args in (["add", "claude-code"], ["remove", "claude-code"]):
        done = run(home, *args, "--scope", "project")
        assert done.returncode == 0, done.stderr
        assert user_config.read_text() == own and planted.is_symlink() and planted.readlink() == user_config
    made = backups(project / ".mcp.json")  # the add's (the checkout's file) and the remove's
    assert not any(b.is_symlink() for b in made) and len(made) == 2
    assert checkout in [b.read_text() for b in made]
    assert json.loads((project / ".mcp.json").read_text()) == json.loads(checkout)


def test_links_out_of_the_project_are_not_followed(home: Path) -> None:
    project = home.parent / "project"
    (home / ".claude.json").write_text('{"mcpServers": {}}')
    (project / ".mcp.json").symlink_to(home / ".claude.json")  # the file itself
    (home / ".cursor").mkdir()
    (project / ".cursor").symlink_to(home / ".cursor")  # a directory on the way
    for host, file in (("claude-code", project / ".mcp.json"), ("cursor", project / ".cursor/mcp.json")):
        for action in ("add", "remove"):
            done = run(home, action, host, "--scope", "project")
            assert done.returncode == 1 and "PERMISSION_DENIED" in done.stderr, done.stderr
            assert f"{file} is " in done.stderr and f"outside the project directory {project}" in done.stderr
    assert (home / ".claude.json").read_text() == '{"mcpServers": {}}' and list((home / ".cursor").iterdir()) == []
    rows = {(r["host"], r["scope"]): r for r in json.loads(run(home, "list", "--json").stdout)}
    assert "outside the project directory" in rows["claude-code", "project"]["error"]
    assert rows["claude-code", "user"]["error"] is None


def test_a_link_inside_the_project_is_followed(home: Path) -> None:
    project = home.parent / "project"
    (project / "config").mkdir()
    (project / "config/mcp.json").write_text('{"mcpServers": {}}')
    (project / ".mcp.json").symlink_to("config/mcp.json")
    done = run(home, "add", "claude-code", "--scope", "project")
    assert done.returncode == 0, done.stderr
    assert (project / ".mcp.json").is_symlink() and "diagd" in json.loads((project / "config/mcp.json").read_text())[
        "mcpServers"]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "socket"])
def test_a_file_that_is_not_a_regular_file_is_refused_without_hanging_or_a_traceback(home: Path, kind: str) -> None:
    file = home / ".cursor/mcp.json"
    file.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(file)  # a reader would wait for a writer forever
    elif kind == "dev-zero":
        file.symlink_to("/dev/zero")  # a reader would read until MemoryError
    elif kind == "directory":
        file.mkdir()
    else:
        import socket

        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(file))
    what = {"fifo": f"{file} is a FIFO (named pipe)", "dev-zero": f"{file} is a link to /dev/zero, a character device",
            "directory": f"{file} is a directory", "socket": f"{file} is a socket"}[kind]
    for args in (["add", "cursor"], ["remove", "cursor"], ["remove", "cursor", "--print"]):
        done = run(home, *args)  # times out (and fails) rather than hang
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert f"INVALID_ARGUMENT: {what}, not a regular file; diagd leaves it as it is" in done.stderr
        assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert sorted(p.name for p in file.parent.iterdir()) == ["mcp.json"]
    rows = {(r["host"], r["scope"]): r for r in json.loads(run(home, "list", "--json").stdout)}
    assert what in rows["cursor", "user"]["error"]


def test_a_file_over_16_mib_is_refused(home: Path) -> None:
    file = home / ".cursor/mcp.json"
    file.parent.mkdir()
    with file.open("wb") as f:
        f.truncate(16 * 1024 * 1024 + 1)  # sparse: no 16 MiB written
    done = run(home, "add", "cursor")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (f"{file} is 16777217 bytes or more, over the 16 MiB diagd reads of a host's configuration file"
            in done.stderr)
    assert file.stat().st_size == 16 * 1024 * 1024 + 1 and backups(file) == []


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-2.5E+999"])
def test_nan_infinity_and_numbers_beyond_a_double_are_refused_not_written_back(home: Path, number: str) -> None:
    file = home / ".cursor/mcp.json"
    file.parent.mkdir()
    text = '{"mcpServers": {"x": {"command": "x", "timeout": NUMBER}}}'.replace("NUMBER", number)
    file.write_text(text)
    for action in ("add", "remove"):
        done = run(home, action, "cursor")
        assert done.returncode == 1 and f"{file} is not valid JSON (" in done.stderr, done.stderr
        assert number.lstrip("-") in done.stderr and "Traceback" not in done.stderr
    assert file.read_text() == text and backups(file) == []


def test_a_symlinked_config_file_stays_a_link_and_its_target_is_written(home: Path) -> None:
    dotfiles = home / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "cursor.json").write_text('{"mcpServers": {"other": {"command": "o"}}}\n')
    (dotfiles / "cursor.json").chmod(0o640)
    link = home / ".cursor/mcp.json"
    link.parent.mkdir()
    link.symlink_to("../dotfiles/cursor.json")  # relative, as stow makes them
    done = run(home, "add", "cursor")
    assert done.returncode == 0, done.stderr
    assert f"in {link} (a link: written to {dotfiles / 'cursor.json'})" in done.stdout
    assert link.is_symlink() and os.readlink(link) == "../dotfiles/cursor.json"
    assert list(json.loads(link.read_text())["mcpServers"]) == ["other", "diagd"]
    assert stat.S_IMODE((dotfiles / "cursor.json").stat().st_mode) == 0o640
    [backup] = backups(dotfiles / "cursor.json")  # beside the file it is a copy of
    assert json.loads(backup.read_text()) == {"mcpServers": {"other": {"command": "o"}}}
    assert run(home, "remove", "cursor").returncode == 0
    assert link.is_symlink() and json.loads(link.read_text()) == {"mcpServers": {"other": {"command": "o"}}}
    assert list(link.parent.iterdir()) == [link]


def test_a_link_to_a_link_or_to_nothing_is_refused(home: Path) -> None:
    (home / ".cursor").mkdir()
    (home / "real.json").write_text("{}")
    (home / "hop.json").symlink_to(home / "real.json")
    (home / ".cursor/mcp.json").symlink_to(home / "hop.json")
    done = run(home, "add", "cursor")
    assert done.returncode == 1 and "itself a symbolic link: diagd follows one link, to a regular file" in done.stderr
    (home / ".cursor/mcp.json").unlink()
    (home / ".cursor/mcp.json").symlink_to(home / "missing.json")
    done = run(home, "add", "cursor")
    assert done.returncode == 1 and f"a link to {home / 'missing.json'}, which does not exist" in done.stderr
    assert (home / "real.json").read_text() == "{}" and not (home / "missing.json").exists()


VSCODE_JSONC = """{
\t// my MCP servers
\t"servers": {
\t\t"web": {"type": "http", "url": "http://localhost:8080/mcp"}, /* a string with // is not a comment */
\t\t"fs": {
\t\t\t"command": "npx", // the filesystem server
\t\t\t"args": ["-y", "@modelcontextprotocol/server-filesystem",],
\t\t} // last one
\t},
\t"inputs": [],
}
"""


def test_vscode_comments_and_trailing_commas_are_read_and_kept(home: Path) -> None:
    file = home / ".config/Code/User/mcp.json"
    file.parent.mkdir(parents=True)
    file.write_text(VSCODE_JSONC)
    done = run(home, "add", "vscode", "--tools", "pcap")
    assert done.returncode == 0, done.stderr
    assert "comments were not kept" not in done.stdout
    text = file.read_text()
    for line in VSCODE_JSONC.splitlines():
        if line != '\t\t} // last one':
            assert line in text.splitlines()
    assert '\t\t}, // last one\n\t\t"diagd": {\n\t\t\t"type": "stdio",\n' in text  # the file's tabs
    rows = {(r["host"], r["scope"]): r for r in json.loads(run(home, "list", "--json").stdout)}
    assert rows["vscode", "user"]["servers"] == {"diagd": expected("vscode", ["mcp", "--tools", "pcap"])}
    assert [b.read_text() for b in backups(file)] == [VSCODE_JSONC]
    assert run(home, "add", "vscode", "--tools", "pcap").stdout.endswith("nothing to change\n")
    done = run(home, "remove", "vscode")
    assert done.returncode == 0, done.stderr
    assert file.read_text() == VSCODE_JSONC  # add then remove: the file as it was, byte for byte


def test_a_vscode_file_of_comments_alone_is_rewritten_and_the_output_says_so(home: Path) -> None:
    file = home / ".config/Code/User/mcp.json"
    file.parent.mkdir(parents=True)
    file.write_text("// servers go here\n")
    done = run(home, "add", "vscode")
    assert done.returncode == 0, done.stderr
    assert "its comments were not kept (the old file has them)" in done.stdout
    assert json.loads(file.read_text()) == {"servers": {"diagd": expected("vscode", ["mcp"])}}
    assert [b.read_text() for b in backups(file)] == ["// servers go here\n"]


@pytest.mark.parametrize("host", list(HOSTS))
def test_remove_takes_out_what_add_put_in_and_keeps_the_rest(home: Path, host: str) -> None:
    path, key, _ = HOSTS[host]
    file = home / path
    file.parent.mkdir(parents=True, exist_ok=True)
    before = {"theme": "dark", key: {"other": {"command": "/usr/bin/other", "args": ["--x"]}}, "n": 1.5}
    text = json.dumps(before, indent=2) + "\n"
    file.write_text(text)
    assert run(home, "add", host).returncode == 0
    added = file.read_text()
    printed = run(home, "remove", host, "--dry-run")
    assert printed.returncode == 0 and json.loads(printed.stdout) == {key: {"diagd": expected(host, ["mcp"])}}
    assert f"this would be taken out of {file}" in printed.stderr and file.read_text() == added
    done = run(home, "remove", host)
    assert done.returncode == 0, done.stderr
    assert f"removed 'diagd' from {file}; the old file is " in done.stdout
    assert file.read_text() == text  # byte for byte
    assert sorted(b.read_text() for b in backups(file)) == sorted([text, added])
    again = run(home, "remove", host)
    assert again.returncode == 0 and f"no 'diagd' in \"{key}\"; nothing to remove" in again.stdout
    assert len(backups(file)) == 2  # nothing written


def test_remove_leaves_servers_that_do_not_run_diagd_and_files_that_are_not_there(home: Path) -> None:
    done = run(home, "remove", "cursor")
    assert done.returncode == 0 and "no file; nothing to remove" in done.stdout and list(home.iterdir()) == []
    file = home / ".cursor/mcp.json"
    file.parent.mkdir()
    file.write_text('{"mcpServers": {"fs": {"command": "npx"}}}')
    done = run(home, "remove", "cursor", "--name", "fs")
    assert done.returncode == 1 and "'fs' in " in done.stderr and "does not run diagd" in done.stderr
    assert file.read_text() == '{"mcpServers": {"fs": {"command": "npx"}}}' and backups(file) == []
    assert run(home, "add", "cursor", "--scope", "project", "--name", "diag").returncode == 0
    done = run(home, "remove", "cursor", "--scope", "project", "--name", "diag")
    assert done.returncode == 0, done.stderr
    assert json.loads((home.parent / "project/.cursor/mcp.json").read_text()) == {"mcpServers": {}}
