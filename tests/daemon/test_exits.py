"""Exit statuses: each named once (daemon/exits.py) and returned by name, the same status for the same
kind of outcome whatever the command (an unknown name is USAGE, a refused operation FAILED, no daemon
NO_DAEMON), and docs/cli.md's table equal to them."""

from __future__ import annotations

import ast
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagd.daemon import exits
from diagd.daemon.cli import cli, remote, toolscli
from diagd.daemon.exits import EXIT_FAILED, EXIT_NO_DAEMON, EXIT_USAGE
from diagd.protocol import control
from diagd.protocol.errors import ErrorCode
from diagd.samples import SAMPLES
from tests.conftest import REPO, DaemonProcess

STATUSES = {name.removeprefix("EXIT_"): value for name, value in vars(exits).items() if name.startswith("EXIT_")}
# What returns exit statuses: the `diagd` command and the stdio shim behind `diagd mcp`.
CHECKED = sorted([*(REPO / "daemon" / "cli").glob("*.py"), *(REPO / "daemon" / "shim").glob("*.py")])


def bare_statuses(source: str) -> list[str]:
    """`return 1`, `return 0 if ok else 1`, `EXIT_X = 1` (or `EXIT_A, EXIT_B = 0, 1`), `sys.exit(2)`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            if any(_is_int(b) for b in branches):
                found.append((node.lineno, f"return {ast.unparse(value)}"))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t])
                     if isinstance(n, ast.Name)]
            if any(n.startswith("EXIT_") for n in names) and any(_is_int(v) for v in ast.walk(node.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit", "os._exit")
              and node.args and _is_int(node.args[0])):
            found.append((node.lineno, ast.unparse(node)))
    return [f"line {line}: {text}" for line, text in sorted(found)]


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def test_the_check_finds_each_way_of_writing_a_bare_status() -> None:
    source = ("def f(ok):\n    if ok:\n        return 0\n    return 2 if ok is None else 1\n"
              "EXIT_OK, EXIT_ERROR = 0, 1\nEXIT_USAGE: int = 2\nsys.exit(3)\n"
              "def g():\n    return EXIT_OK\nwidth = 80\n")
    assert [line.split(":")[0] for line in bare_statuses(source)] == ["line 3", "line 4", "line 5", "line 6", "line 7"]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_module_returns_or_defines_an_exit_status_by_number(path: Path) -> None:
    assert bare_statuses(path.read_text()) == [], f"name it from daemon/exits.py instead in {path}"


def test_each_status_is_named_once() -> None:
    assert len(set(STATUSES.values())) == len(STATUSES)
    assert (STATUSES["OK"], STATUSES["FAILED"], STATUSES["USAGE"], STATUSES["NO_DAEMON"]) == (0, 1, 2, 3)


def test_every_remote_status_is_a_named_one() -> None:
    assert set(remote.EXIT_BY_CODE.values()) <= set(STATUSES.values())
    assert remote.EXIT_BY_CODE[ErrorCode.INVALID_ARGUMENT] == EXIT_USAGE


def section(page: Path, heading: str) -> str:
    text = page.read_text()
    start = text.index(f"\n{heading}\n")
    following = re.search(r"\n#{1,2} ", text[start + len(heading) + 2:])
    return text[start:start + len(heading) + 2 + following.start()] if following else text[start:]


def test_the_table_in_docs_cli_is_exits() -> None:
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", section(REPO / "docs" / "cli.md", "## Exit status"), re.MULTILINE)
    assert {name: int(value) for value, name in rows} == STATUSES
    assert len(rows) == len(STATUSES)  # each once


def test_the_ssh_table_in_docs_is_remotes() -> None:
    rows = re.findall(r"^\| `(\w+)`[^|]* \| (\d+) \|", (REPO / "docs" / "ssh.md").read_text(), re.MULTILINE)
    by_code = {str(code): status for code, status in remote.EXIT_BY_CODE.items() if code != ErrorCode.INVALID_ARGUMENT}
    assert {code: int(status) for code, status in rows} == by_code


# -- the same kind of outcome, the same status, whatever the command ---------------------------------


@pytest.fixture
def nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment of its own (HOME, config, state and runtime dirs) where no daemon runs."""
    for name, where in (("HOME", "home"), ("DIAGD_RUNTIME_DIR", "run"), ("DIAGD_STATE_DIR", "state")):
        (tmp_path / where).mkdir(mode=0o700)
        monkeypatch.setenv(name, str(tmp_path / where))
    monkeypatch.setenv("DIAGD_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path / "home")
    return tmp_path


def test_each_way_of_naming_what_is_not_there_is_a_usage_error(nowhere: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in ((["setup", "pcapp"], "unknown back end pcapp"),
                       (["client", "add", "claude"], "unknown host 'claude'"),
                       (["client", "add", "cursor", "--tools", "pcap,crsh"], "unknown tool group 'crsh'"),
                       (["mcp", "--tools", "crsh"], "unknown tool group 'crsh'"),
                       (["token", "add"], "needs a name"),
                       (["status", "--ssh", "-oProxyCommand=x"], "INVALID_ARGUMENT: --ssh")):
        assert (cli.main(argv), argv) == (EXIT_USAGE, argv)
        assert said in capsys.readouterr().err
    catalogue = {"groups": ["diagd"], "configured": None, "tools": [{"name": "diagd_status", "group": "diagd"}]}
    assert toolscli.show(catalogue, "diagd_stats") == EXIT_USAGE
    with pytest.raises(SystemExit) as parsed:  # argparse's own, for an unknown sub-command
        cli.main(["stauts"])
    assert parsed.value.code == EXIT_USAGE
    assert list((nowhere / "home").iterdir()) == []


def test_an_operation_refused_is_failed(nowhere: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["token", "revoke", "ci"]) == EXIT_FAILED  # a token that does not exist (now)
    assert "NOT_FOUND: no token named 'ci'" in capsys.readouterr().err
    (nowhere / SAMPLES[0].name).write_text("mine")
    assert cli.main(["examples", "--copy", str(nowhere)]) == EXIT_FAILED  # never over a file
    assert "never overwrites a file" in capsys.readouterr().err
    assert (nowhere / SAMPLES[0].name).read_text() == "mine"
    # `client add` onto a file that is not JSON: tests/daemon/test_clients.py


NO_DAEMON_COMMANDS = (["status"], ["status", "--json"], ["call", "echo", "message=x"], ["reload"],
                      ["stop-actor", "serial-1"], ["mcp", "--no-autostart"])


@pytest.mark.parametrize("argv", NO_DAEMON_COMMANDS, ids=" ".join)
def test_no_daemon_is_no_daemon_for_every_command_that_needs_one(nowhere: Path, argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == EXIT_NO_DAEMON
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) <= 1


@pytest.fixture(params=["busy", "hang up"])
def unserving(request: pytest.FixtureRequest, nowhere: Path) -> Iterator[str]:
    """A control socket whose daemon refuses every connection (BUSY) or closes it without a word."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(nowhere / "run" / "control.sock"))
    server.listen(8)
    refusal = control.REPLIES.encode(control.ErrorReply(id=0, code=str(ErrorCode.BUSY),
                                                        message="every connection is busy"))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                if request.param == "busy":
                    conn.sendall(refusal)

    threading.Thread(target=serve, daemon=True).start()
    yield request.param
    server.shutdown(socket.SHUT_RDWR)
    server.close()


@pytest.mark.parametrize("argv", [*NO_DAEMON_COMMANDS[:5], ["tools"], ["stop"], ["restart"]], ids=" ".join)
def test_a_daemon_that_does_not_serve_the_command_is_no_daemon_too(unserving: str, argv: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`reload` and `stop-actor` said FAILED for this once, as for a refusal of their request."""
    assert cli.main(argv) == EXIT_NO_DAEMON
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert ("BUSY: every connection is busy" if unserving == "busy" else "BACKEND_UNAVAILABLE: ") in err


def test_with_a_daemon_an_unknown_tool_is_usage_and_a_refusal_failed(daemon: DaemonProcess) -> None:
    unknown = daemon.env.run("call", "ecoh", "message=x", "--visibility=off")
    assert unknown.returncode == EXIT_USAGE, unknown.stderr  # as `diagd tools ecoh`
    assert json.loads(unknown.stdout)["code"] == "INVALID_ARGUMENT" and "did you mean" not in unknown.stderr
    refused = daemon.env.run("call", "echo", "message=x", "nosuch=1", "--visibility=off")
    assert refused.returncode == EXIT_FAILED and json.loads(refused.stdout)["code"] == "INVALID_ARGUMENT"
    gone = daemon.env.run("stop-actor", "serial-1")  # understood, refused: no such actor now
    assert gone.returncode == EXIT_FAILED and "NOT_FOUND" in gone.stderr
    assert daemon.env.run("tools", "ecoh").returncode == EXIT_USAGE
