"""`diagd call` shows a long call's progress on a terminal, and nothing anywhere else; the control
protocol carries it as `progress` frames for calls that ask (version 2), version 1 still served."""

from __future__ import annotations

import json
import os
import pty
import socket
import subprocess

import pytest

from diagd.protocol import control
from tests.conftest import DIAGD, DaemonProcess
from tests.e2e.test_daemon import control_connect, frame, read_frame

pytestmark = pytest.mark.e2e

CALL = ("call", "echo", "message=p", "progress_steps=3", "delay_s=0.3", "--visibility", "simple")


def call_with_stderr_on_a_terminal(daemon: DaemonProcess) -> tuple[str, str, int]:
    """(stdout, what the terminal showed, exit status) of `diagd call` with stderr on a real pty."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([DIAGD, *CALL], env=daemon.env.vars, stdout=subprocess.PIPE, stderr=slave,
                                stdin=subprocess.DEVNULL)
        os.close(slave)
        shown = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            shown += chunk
        stdout, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    return stdout.decode(), shown.decode(), proc.returncode


def test_a_long_call_draws_one_updating_progress_line_on_a_terminal(daemon: DaemonProcess) -> None:
    stdout, shown, status = call_with_stderr_on_a_terminal(daemon)
    assert status == 0
    assert json.loads(stdout)["message"] == "p"
    for step, percent in ((1, "33%"), (2, "67%"), (3, "100%")):
        assert f"\r\x1b[K⏳ step {step} {percent} (" in shown
    # Redrawn in place, then erased: what follows (nothing, with --visibility simple) starts clean.
    banner, _, after = shown.partition("⏳")
    assert banner.startswith("📡 calling tool: echo")
    assert after.endswith("\r\x1b[K") and "\n" not in after


def test_with_stderr_not_a_terminal_nothing_is_drawn_and_stdout_is_the_same(daemon: DaemonProcess) -> None:
    piped = subprocess.run([DIAGD, *CALL], env=daemon.env.vars, capture_output=True, text=True, timeout=30,
                           check=False)
    assert piped.returncode == 0
    assert "⏳" not in piped.stderr and "\x1b" not in piped.stderr and "\r" not in piped.stderr
    on_terminal, _shown, _status = call_with_stderr_on_a_terminal(daemon)
    assert piped.stdout == on_terminal  # stdout carries the result only, either way


def test_progress_frames_come_before_the_reply_only_for_a_call_that_asked(daemon: DaemonProcess) -> None:
    seen: list[control.Progress] = []
    with control.BlockingClient(str(daemon.control_socket), client="test", timeout=10) as client:
        result = client.request(control.CallRequest, tool="echo", progress=True, on_progress=seen.append,
                                arguments={"message": "p", "progress_steps": 2, "delay_s": 0.02})
        assert result["result"]["message"] == "p"
        assert [(p.progress, p.total, p.message) for p in seen] == [(1.0, 2.0, "step 1"), (2.0, 2.0, "step 2")]
        seen.clear()
        client.request(control.CallRequest, tool="echo", on_progress=seen.append,
                       arguments={"message": "p", "progress_steps": 2, "delay_s": 0.02})
        assert seen == []


def test_a_version_1_client_is_still_served(daemon: DaemonProcess) -> None:
    sock: socket.socket = control_connect(daemon)
    with sock:
        sock.sendall(frame({"t": "hello", "version": 1, "client": "old"}))
        hello = read_frame(sock)
        assert isinstance(hello, control.Hello) and hello.version == 1
        sock.sendall(frame({"t": "call", "id": 3, "tool": "echo",
                            "arguments": {"message": "p", "progress_steps": 2, "delay_s": 0.02}}))
        reply = read_frame(sock)  # no progress frame first: it did not ask
        assert isinstance(reply, control.Reply) and reply.id == 3 and reply.result["result"]["message"] == "p"
