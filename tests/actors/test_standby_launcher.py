"""The standby launcher (`sandbox.standby`) on real launcher processes: one kept waiting, handed a run (it
becomes the run's process, the caller's to reap), replaced, reaped and replaced when killed while it waits
(no more after MAX_FAILURES in a row), retired when unused, stopped in named steps, and never left behind
by a cancelled hand-over. What the run is confined by is tests/actors/test_confine.py's (both ways)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from diagd.actors import sandbox
from diagd.actors._subprocess import close_pipes
from diagd.actors.sandbox import standby

POLICY = sandbox.Policy(landlock=False, die_with=None)  # no Landlock: test_confine checks the rules


def tool_argv(code: str) -> list[str]:
    return sandbox.wrap([sys.executable, "-I", "-c", code], POLICY)


def args_of(code: str) -> list[str]:
    args = standby.request_of(tool_argv(code))
    assert args is not None
    return args


@asynccontextmanager
async def running(launcher: standby.Launcher) -> AsyncIterator[standby.Launcher]:
    async with trio.open_nursery() as nursery:
        await launcher.start(nursery)
        try:
            yield launcher
        finally:
            with trio.CancelScope(shield=True):
                await launcher.stop()
            nursery.cancel_scope.cancel()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.02)


def waiting_pid(launcher: standby.Launcher) -> int | None:
    workers = launcher.statistics()["workers"]
    return workers[0]["pid"] if workers and launcher.statistics()["waiting"] else None


def reaped(pid: int) -> bool:
    """Gone for good: not running, and no zombie left for anyone to reap."""
    return not Path(f"/proc/{pid}").exists()


async def output_of(proc: trio.Process) -> tuple[int, str, str]:
    out, err = bytearray(), bytearray()
    async with trio.open_nursery() as nursery:
        async def read(stream: trio.abc.ReceiveStream | None, into: bytearray) -> None:
            assert stream is not None
            while chunk := await stream.receive_some(65536):
                into.extend(chunk)
        nursery.start_soon(read, proc.stdout, out)
        nursery.start_soon(read, proc.stderr, err)
    code = await proc.wait()
    await close_pipes(proc)
    return code, out.decode(), err.decode()


def test_only_a_launcher_outside_namespaces_is_a_standbys_run() -> None:
    argv = tool_argv("pass")
    assert standby.request_of(argv) == argv[4:] and argv[:4] == sandbox.launcher_prefix()
    assert standby.request_of([sys.executable, "-I", "-c", "pass"]) is None  # the tool run bare
    assert standby.request_of(["sudo", "-n", "bpftrace", "-e", "BEGIN {}"]) is None  # privileged_helper
    jailed = [*argv[:4], json.dumps({**json.loads(argv[4]), "namespaces": True}), *argv[5:]]
    assert standby.request_of(jailed) is None  # behind bubblewrap's supervisor: cold
    supervisor = [*argv[:4], json.dumps({"supervise": True, "die_with": 1}), "--", "/usr/bin/bwrap"]
    assert standby.request_of(supervisor) is None


async def test_a_run_on_the_standby_is_the_standbys_process_and_a_replacement_waits_after_it() -> None:
    async with running(standby.Launcher("test", first_after_s=0, replace_after_s=60)) as launcher:
        await until(lambda: waiting_pid(launcher) is not None, "a standby waits")
        pid = waiting_pid(launcher)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "DIAGD_TEST_SECRET": "x"}
        proc = await launcher.launch(args_of("import os, sys; print(sorted(os.environ)); "
                                             "print('err', file=sys.stderr); sys.exit(3)"), env)
        assert proc is not None and proc.pid == pid
        code, out, err = await output_of(proc)
        # The run's environment is the request's, through the policy's allow-list (not the standby's own).
        assert (code, out, err) == (3, "['DIAGD_SANDBOX', 'HOME', 'LANG', 'PATH']\n", "err\n")
        assert launcher.statistics()["served"] == 1 and waiting_pid(launcher) is None
        launcher.replace_soon()  # the run is past its start: the replacement need not wait for its fallback
        await until(lambda: waiting_pid(launcher) is not None, "a replacement waits")
        replacement = waiting_pid(launcher)
        assert replacement != pid
    assert replacement is not None and reaped(replacement)  # stopped with the actor (EOF), and reaped


async def test_a_run_that_finds_no_standby_is_told_so_and_starts_the_next() -> None:
    async with running(standby.Launcher("test", first_after_s=math.inf, replace_after_s=0)) as launcher:
        assert await launcher.launch(args_of("pass"), dict(os.environ)) is None
        assert launcher.statistics()["missed"] == 1
        await until(lambda: waiting_pid(launcher) is not None, "the miss started one")


async def test_a_standby_killed_while_it_waits_is_reaped_and_replaced_until_too_many_fail() -> None:
    async with running(standby.Launcher("test", first_after_s=0, replace_after_s=0)) as launcher:
        killed = []
        for _ in range(standby.MAX_FAILURES):
            await until(lambda: waiting_pid(launcher) not in (None, *killed), "a standby waits")
            pid = waiting_pid(launcher)
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            await until(lambda pid=pid: reaped(pid), "the killed standby was reaped")
        await until(lambda: launcher.off_because is not None, "it gave up")
        assert "ended before their run" in str(launcher.off_because) and waiting_pid(launcher) is None
        assert await launcher.launch(args_of("pass"), dict(os.environ)) is None  # runs go cold now


async def test_an_unused_standby_is_retired_and_the_next_run_starts_another() -> None:
    async with running(standby.Launcher("test", first_after_s=0, replace_after_s=0, idle_s=0.3)) as launcher:
        await until(lambda: waiting_pid(launcher) is not None, "a standby waits")
        pid = waiting_pid(launcher)
        assert pid is not None
        await until(lambda: reaped(pid), "the unused standby was retired")
        assert launcher.statistics()["waiting"] is False and launcher.off_because is None
        assert await launcher.launch(args_of("pass"), dict(os.environ)) is None
        await until(lambda: waiting_pid(launcher) is not None, "the next run started another")


async def test_a_standby_is_stopped_by_eof_first() -> None:
    waiting = await standby.Standby.start()
    assert await waiting.close() == "eof" and waiting.proc.returncode == 0  # it left by itself, ran nothing


async def test_a_hand_over_cut_short_leaves_no_standby_behind() -> None:
    async with running(standby.Launcher("test", first_after_s=math.inf)) as launcher:
        # A stand-in that never reads its stdin, and a request bigger than a pipe holds: the write blocks.
        proc = await trio.lowlevel.open_process([sys.executable, "-c", "import time; time.sleep(60)"],
                                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE)
        launcher._waiting = standby.Standby(proc)
        with trio.move_on_after(0.2) as cut:
            await launcher.launch(args_of("pass"), {"BIG": "x" * (1 << 20)})
        assert cut.cancelled_caught
        assert proc.returncode == -signal.SIGTERM  # EOF did not end it; SIGTERM did, and it was reaped
