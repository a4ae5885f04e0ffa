"""Child-process lifecycle: escalation steps, group kill, draining, the waiter that reaps at once, tails and
line splitting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from diagd.actors._subprocess import (
    GRACEFUL_INT,
    STDERR_TAIL_BYTES,
    TERM_THEN_KILL,
    LineSplitter,
    Step,
    Tail,
    describe_exit,
    drain,
    head,
    is_exiting,
    open_process,
    reap,
    run,
    stop_process,
)
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.procs import fd_names, zombies


async def test_sigint_ends_a_cooperative_child_at_the_first_step() -> None:
    proc = await open_process(["sleep", "30"])
    with trio.fail_after(10):
        assert await stop_process(proc, GRACEFUL_INT) == "sigint"
    assert proc.returncode is not None


async def test_a_child_ignoring_sigint_and_sigterm_is_killed_at_the_last_step() -> None:
    script = "trap '' INT TERM; echo ready; while :; do sleep 0.05; done"
    proc = await open_process(["bash", "-c", script])
    assert proc.stdout is not None
    with trio.fail_after(5):
        assert await proc.stdout.receive_some(100) == b"ready\n"
    steps = (Step("sigint", 2, 0.2), Step("sigterm", 15, 0.2), Step("sigkill", 9, 5))
    with trio.fail_after(10):
        assert await stop_process(proc, steps) == "sigkill"


async def test_the_whole_process_group_goes_with_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    proc = await open_process(["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"])
    with trio.fail_after(5):
        while not pidfile.exists() or not pidfile.read_text().strip():
            await trio.sleep(0.01)
    grandchild = int(pidfile.read_text())
    with trio.fail_after(10):
        await stop_process(proc, TERM_THEN_KILL)
        while Path(f"/proc/{grandchild}").exists() and "Z" not in _state(grandchild):
            await trio.sleep(0.01)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return "Z"


async def test_graceful_action_runs_before_signals() -> None:
    proc = await open_process(["cat"], stdin=-1)  # subprocess.PIPE

    async def quit_() -> None:
        assert proc.stdin is not None
        await proc.stdin.aclose()  # cat exits at EOF

    with trio.fail_after(10):
        assert await stop_process(proc, (Step("quit", None, 2), *TERM_THEN_KILL), graceful=quit_) == "quit"


async def test_stop_of_an_exited_child_says_so() -> None:
    proc = await open_process(["true"])
    await proc.wait()
    assert await stop_process(proc) == "exited"


async def test_drain_reads_more_than_a_pipe_holds() -> None:
    proc = await open_process(["head", "-c", "1000000", "/dev/zero"])
    got = bytearray()
    with trio.fail_after(10):
        await drain(proc.stdout, got.extend)
        await proc.wait()
    assert len(got) == 1_000_000


def test_tail_keeps_only_the_end() -> None:
    tail = Tail(limit=10)
    for i in range(100):
        tail.feed(f"{i:03d}\n".encode())
    assert tail.text().endswith("098\n099\n") and len(tail.text()) <= 10


def test_line_splitter_handles_split_chunks_and_crlf() -> None:
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    for chunk in (b"ab", b"c\r\nde", b"f\n", b"tail"):
        splitter.feed(chunk)
    splitter.flush()
    assert lines == ["abc", "def", "tail"]


def _fds() -> set[str]:
    return fd_names(os.getpid())


def _zombies() -> set[tuple[int, str]]:
    return {(p.pid, p.comm) for p in zombies(os.getpid())}


async def test_the_waiter_reaps_a_child_the_moment_it_exits_and_closes_its_pipes() -> None:
    # Zombies an earlier test left (its Popen collected before the child ended) are not this test's; a
    # child of this test that is not reaped shows as a new one.
    before, zombies_before = _fds(), _zombies()
    async with trio.open_nursery() as nursery:
        proc = await open_process(["sh", "-c", "echo out; echo err >&2; exit 3"], stdin=subprocess.PIPE)
        out, err = bytearray(), bytearray()
        out_done, err_done = trio.Event(), trio.Event()
        nursery.start_soon(drain, proc.stdout, out.extend, out_done)
        nursery.start_soon(drain, proc.stderr, err.extend, err_done)
        with trio.fail_after(10):
            assert await reap(proc, readers_done=(out_done, err_done)) == 3
    assert (out, err) == (b"out\n", b"err\n")  # the readers got everything before the pipes closed
    assert _zombies() - zombies_before == set() and _fds() == before
    assert proc.returncode == 3 and not any(pid == proc.pid for pid, _ in _zombies())


async def test_a_grandchild_holding_the_pipe_does_not_keep_it_open_past_the_grace() -> None:
    before = _fds()
    async with trio.open_nursery() as nursery:
        proc = await open_process(["sh", "-c", "sleep 30 & exit 0"])
        done = trio.Event()
        nursery.start_soon(drain, proc.stdout, lambda _: None, done)
        with trio.fail_after(10):
            assert await reap(proc, readers_done=(done,), eof_grace_s=0.2) == 0
            await done.wait()  # the reader was released by the close, not by an EOF
        assert _fds() == before
        os.killpg(proc.pid, signal.SIGKILL)


async def test_a_killed_child_counts_as_exiting_before_it_can_be_reaped() -> None:
    proc = await open_process(["sleep", "30"])
    assert not is_exiting(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    assert is_exiting(proc.pid)  # the kill is pending, or the child is already on its way out
    with trio.fail_after(10):
        assert await reap(proc) == -signal.SIGKILL
    assert is_exiting(proc.pid)  # gone entirely
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL" and describe_exit(3) == "exited with status 3"


# -- run: commands to completion -----------------------------------------------------------------


async def test_run_returns_the_exit_code_the_output_and_the_stderr_tail() -> None:
    done = await run([sys.executable, "-c", "import sys; print('out'); sys.stderr.write('e' * 70000); sys.exit(3)"])
    assert done.returncode == 3 and done.out == "out\n" and done.stderr == "e" * STDERR_TAIL_BYTES


async def test_run_stops_a_command_past_its_timeout_or_its_output_bound() -> None:
    with pytest.raises(DiagdError) as slow:
        await run(["sleep", "30"], timeout_s=0.2)
    assert slow.value.code == ErrorCode.TIMEOUT
    with pytest.raises(DiagdError) as big:
        await run(["yes"], max_output_bytes=100_000)
    assert big.value.code == ErrorCode.OUTPUT_TOO_LARGE


async def test_run_says_a_missing_command_cannot_run_and_how_to_install_it() -> None:
    with pytest.raises(DiagdError) as info:
        await run(["/nonexistent/tool", "-v"], fix="apt-get install tool")
    assert info.value.code == ErrorCode.BACKEND_UNAVAILABLE and info.value.details["fix"] == "apt-get install tool"


async def test_a_cancelled_run_stops_its_command_and_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, ["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"])
            while not pid_file.exists() or not pid_file.read_text().strip():
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
    grandchild = int(pid_file.read_text())
    with trio.fail_after(5):
        while _alive(grandchild):  # the whole process group was signalled, not only the shell
            await trio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _records_model(text: str, limit: int) -> str:
    """The first `limit` records of `text`'s complete lines, found line by line (head's rule)."""
    lines = text.split("\n")[:-1]
    starts = [i for i, line in enumerate(lines) if line.startswith("Frame ")]
    return "\n".join(lines[:starts[limit]] if len(starts) > limit else lines)


@pytest.mark.parametrize("cut", [1, 9, 11, 12, 13, 24, 25, 26])  # in a line, at its newline, at a record's start
@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_head_records_cut_at_the_same_line_wherever_the_chunks_end(cut: int, limit: int) -> None:
    text = "Frame 1: x\n  a\n\nFrame 2: y\n\n  b\nFrame 3: z\nFrame 4: w\n  c\n"
    # The child writes the text in two pieces, a pause between, so they arrive as two chunks.
    script = ("import sys, time; t = sys.argv[1]; sys.stdout.write(t[:int(sys.argv[2])]); sys.stdout.flush(); "
              "time.sleep(0.05); sys.stdout.write(t[int(sys.argv[2]):]); sys.stdout.flush(); time.sleep(30)")
    done = await head([sys.executable, "-c", script, text, str(cut)], limit, records=r"Frame \d+: ")
    assert done.stopped and done.text == _records_model(text, limit)


async def test_head_counts_records_of_many_lines_and_stops_when_the_next_one_begins() -> None:
    script = "for i in 1 2 3 4 5; do printf 'Frame %s: x\\n  a\\n  b\\n\\n' $i; done; sleep 30"
    two = await head(["sh", "-c", script], 2, records=r"Frame \d+: ")
    assert two.stopped and two.returncode is not None  # the third record began: stopped, reaped
    assert two.text == "Frame 1: x\n  a\n  b\n\nFrame 2: x\n  a\n  b\n" and two.lines == []
    every = await head(["sh", "-c", "printf 'Frame 1: x\\n  a\\n'"], 5, records=r"Frame \d+: ")
    assert every.text == "Frame 1: x\n  a" and not every.stopped  # fewer records: all, ended by itself


async def test_head_stops_a_long_output_at_its_first_lines_and_reaps_it() -> None:
    first = await head(["seq", "1", "10000000"], 3)
    assert first.lines == ["1", "2", "3"] and first.stopped
    assert first.returncode is not None  # reaped, not left running
    whole = await head(["sh", "-c", "printf '1\\n2\\nlast'; echo oops >&2; exit 3"], None)
    assert whole.lines == ["1", "2", "last"] and not whole.stopped
    assert whole.returncode == 3 and "oops" in whole.stderr


async def test_head_hands_on_at_most_its_limit_and_stops_a_long_output_there() -> None:
    """Lines handed to on_line (none kept) count towards the limit as kept lines do: a caller refusing
    more than n matches reads n + 1, not the whole output first (the narrowed filter, a cut's columns)."""
    handed: list[str] = []
    first = await head(["seq", "1", "10000000"], 3, on_line=handed.append)
    assert handed == ["1", "2", "3"] and first.stopped and first.lines == []
    assert first.returncode is not None  # reaped, not left running
    for limit, stopped in ((2, True), (3, False), (None, False)):  # the last lines, after the output's end
        handed.clear()
        done = await head(["printf", "1\\n2\\nlast"], limit, on_line=handed.append)
        assert handed == ["1", "2", "last"][:limit] and done.stopped == stopped, (limit, done)


async def test_head_keeps_what_a_failing_command_wrote_last_to_stderr() -> None:
    """A command that writes why it failed and exits at once: its stdout ends with it, and the stderr still
    in the pipe is read to its end, not cut off with the reading (seen: tshark refused by the loader under a
    memory bound, its one line lost about one time in three)."""
    for _ in range(30):
        done = await head(["sh", "-c", "echo why it failed >&2; exit 3"], 10)
        assert done.returncode == 3 and done.stderr == "why it failed\n", done
