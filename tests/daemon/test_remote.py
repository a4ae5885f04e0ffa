"""daemon/cli/remote.py without a network: targets, our options in a command line, quoting, ssh's verdicts."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from diagd import __version__
from diagd.daemon.cli import remote
from diagd.daemon.cli.remote import Request, Target
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.conftest import DIAGD


@pytest.mark.parametrize(("text", "target"), [
    ("host", Target("host")),
    ("alice@host", Target("host", "alice")),
    ("alice@host:2222", Target("host", "alice", 2222)),
    ("10.0.0.1:22", Target("10.0.0.1", None, 22)),
    ("fe80::1", Target("fe80::1")),
    ("bob@[::1]:2222", Target("::1", "bob", 2222)),
    ("[::1]", Target("::1")),
    ("a@b@host", Target("host", "a@b")),
])
def test_targets_parse_and_print_back(text: str, target: Target) -> None:
    assert remote.parse_target(text) == target
    assert remote.parse_target(str(target)) == target


@pytest.mark.parametrize("text", ["", "@host", "-oProxyCommand=x", "-x@host", "host:0", "host:99999", "host:ssh",
                                  "[::1", "[::1]x", "a b", "host\n"])
def test_bad_targets_are_invalid_arguments(text: str) -> None:
    with pytest.raises(DiagdError) as caught:
        remote.parse_target(text)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT


def test_our_options_come_out_anywhere_and_the_rest_is_forwarded_in_order() -> None:
    request = remote.split_argv(["call", "--ssh", "h:2", "echo", "message=--ssh", "--ssh-option", "Compression=yes",
                                 "--visibility", "off", "--remote-diagd=/opt/diagd", "--ssh-option=A=b"])
    assert request is not None
    assert request.target == Target("h", None, 2)
    assert request.command == ["call", "echo", "message=--ssh", "--visibility", "off"]
    assert request.options == ["Compression=yes", "A=b"]
    assert request.remote_diagd == "/opt/diagd"


def test_a_local_command_is_no_request_and_half_a_request_is_an_error() -> None:
    assert remote.split_argv(["status", "--json"]) is None
    assert remote.split_argv(["reload", "--ssh", "h"]) is None
    for argv in (["status", "--ssh"], ["status", "--remote-diagd", "x"], ["status", "--ssh", "a", "--ssh", "b"]):
        with pytest.raises(DiagdError):
            remote.split_argv(argv)


def test_the_remote_command_line_carries_every_word_in_a_form_no_shell_reads() -> None:
    # `x\\'` closes a single-quoted word in fish (shlex.quote's quoting is sh's), `!` is csh history.
    words = ["call", "echo", "message=; touch /tmp/x", "m=$(id)", "m=`id`", "m='q'\"d\"", "m=\n", "*", "",
             "a=x\\", "b=;id;", "m=!!", "m=~root", "m=\u00e9\u4e2d"]
    line = remote.remote_command("diagd", words)
    assert re.fullmatch(r"diagd --argv-hex [0-9a-f]+", line)
    assert remote.decode_argv(line.split()[1:]) == words
    sh = subprocess.run(["sh", "-c", f"printf '%s\\0' {line}"], capture_output=True, check=True)
    assert sh.stdout.split(b"\0")[:-1] == line.encode().split()


def test_the_remote_diagd_path_must_be_plain_path_characters() -> None:
    assert remote.remote_command("~/bin/diagd", ["version"]).startswith("~/bin/diagd --argv-hex ")
    assert remote.remote_command("/opt/diagd-1.0/bin/diagd", ["version"]).startswith("/opt/diagd-1.0/bin/diagd ")
    for bad in ("diagd; id", "$(id)", "/opt/my diagd", "diagd\\", "'diagd'", "-oProxyCommand=x", ""):
        with pytest.raises(DiagdError) as refused:
            remote.remote_command(bad, ["version"])
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT


def test_the_remote_side_decodes_the_words_and_refuses_anything_else() -> None:
    encoded = remote.remote_command("diagd", ["version"]).split()[2]
    done = subprocess.run([DIAGD, "--argv-hex", encoded], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("diagd "), done.stderr
    for bad in (["--argv-hex"], ["--argv-hex", "zz"], ["--argv-hex", b'{"a": 1}'.hex()], ["--argv-hex", "00", "x"]):
        done = subprocess.run([DIAGD, *bad], capture_output=True, text=True, check=False)
        assert done.returncode == 2 and done.stderr.startswith("diagd: INVALID_ARGUMENT: --argv-hex"), done.stderr


REQUEST = Request(Target("h", "u"), ["status"])


@pytest.mark.parametrize(("status", "stderr", "code"), [
    (255, "ssh: connect to host h port 22: Connection refused\n", ErrorCode.SSH_UNREACHABLE),
    (255, "ssh: Could not resolve hostname h: Name or service not known\n", ErrorCode.SSH_UNREACHABLE),
    (255, "ssh: connect to host h port 22: No route to host\n", ErrorCode.SSH_UNREACHABLE),
    (255, "Connection to h port 22 timed out\n", ErrorCode.SSH_UNREACHABLE),
    (255, "u@h: Permission denied (publickey).\n", ErrorCode.SSH_AUTH_FAILED),
    (255, "Host key verification failed.\n", ErrorCode.SSH_AUTH_FAILED),
    (255, "something else\n", ErrorCode.SSH_FAILED),
    (127, "bash: line 1: diagd: command not found\n", ErrorCode.REMOTE_DIAGD_NOT_FOUND),
    (2, "usage: diagd\n", ErrorCode.VERSION_MISMATCH),
])
def test_ssh_failures_are_classified_from_the_exit_status_and_stderr(status: int, stderr: str,
                                                                    code: ErrorCode) -> None:
    with pytest.raises(DiagdError) as caught:
        remote.classify(REQUEST, status, "", stderr)
    assert caught.value.code == code
    assert "\n" not in caught.value.message


def test_the_same_version_passes_and_another_is_named() -> None:
    remote.classify(REQUEST, 0, f"diagd {__version__}\n", "")
    with pytest.raises(DiagdError) as caught:
        remote.classify(REQUEST, 0, "diagd 9.9\n", "")
    assert caught.value.code == ErrorCode.VERSION_MISMATCH and "9.9" in caught.value.message


def test_a_remote_shell_that_prints_on_stdout_is_named_not_taken_for_another_version() -> None:
    with pytest.raises(DiagdError) as caught:
        remote.classify(REQUEST, 0, f"Welcome to h!\ndiagd {__version__}\n", "")
    assert caught.value.code == ErrorCode.SSH_FAILED, caught.value.message
    assert "writes to stdout" in caught.value.message and "Welcome to h!" in caught.value.message
    assert "\n" not in caught.value.message


def test_ssh_is_rejected_where_it_means_nothing() -> None:
    out = subprocess.run([DIAGD, "reload", "--ssh", "somewhere"], capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "--ssh works with mcp, status, call, logs, doctor" in out.stderr


def test_a_bad_target_is_a_usage_error_before_any_ssh() -> None:
    out = subprocess.run([DIAGD, "status", "--ssh", "-oProxyCommand=touch /tmp/x"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 2 and out.stderr.startswith("diagd: INVALID_ARGUMENT: --ssh")


def test_the_remote_path_stays_stdlib_only() -> None:
    # `diagd mcp --ssh` starts ssh from a CLI that must start fast: no trio, no mcp, not even msgpack.
    probe = ("import sys\nfrom diagd.daemon.cli import cli, remote\n"
             "print(' '.join(n for n, m in sys.modules.items() if m is not None))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert not {m.split(".")[0] for m in done.stdout.split()} & {"trio", "mcp", "msgpack", "anyio", "structlog"}
