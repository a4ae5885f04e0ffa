"""The drgn worker protocol: typed frames, validation, and the real worker process (no dump needed)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from diagd.actors.crash import proto as proto
from diagd.actors.crash.drgn import DrgnClient, DrgnStuck
from diagd.actors.crash.output import HEAD_BYTES
from diagd.protocol.errors import DiagdError, ErrorCode


def test_messages_round_trip_and_malformed_frames_are_protocol_errors() -> None:
    for msg in (proto.Exec(id=3, code="print(1)", filename="<t>"), proto.Output(id=3, data=b"\x00\xffbytes\n")):
        frame = proto.encode(msg)
        assert proto.frame_length(frame[:4]) == len(frame) - 4
        assert proto.decode(frame[4:]) == msg
    for body in (b"\xc1", proto.encode(proto.Ping(id=1))[4:].replace(b"ping", b"pong2"),
                 b"\x82\xa1t\xa4exec\xa2id\xa1x"):
        with pytest.raises(DiagdError) as err:
            proto.decode(body)
        assert err.value.code == ErrorCode.PROTOCOL_ERROR
    with pytest.raises(DiagdError):
        proto.frame_length(struct.pack(">I", proto.MAX_FRAME_BYTES + 1))


class Runner:
    """Runs code in the worker, each output to its own file under `workdir`."""

    def __init__(self, client: DrgnClient, workdir: Path) -> None:
        self.client = client
        self.workdir = workdir
        self.n = 0
        self.path = workdir

    async def __call__(self, code: str, *, timeout_s: float = 10, max_output_bytes: int = 1000,
                       isolated: bool = False) -> proto.ExecResult:
        self.n += 1
        self.path = self.workdir / f"cmd-{self.n:06d}.out"
        return await self.client.execute(code, filename="<t>", timeout_s=timeout_s, grace_s=5,
                                         max_output_bytes=max_output_bytes, output_path=str(self.path),
                                         isolated=isolated)


async def test_the_worker_runs_code_survives_exceptions_and_is_interrupted_by_timeouts(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        run = Runner(client, tmp_path)
        with trio.fail_after(30):
            hello = await client.greet()
            assert hello.version == proto.PROTOCOL_VERSION and hello.pid == client.pid
            with pytest.raises(DiagdError) as err:
                await client.load(str(tmp_path / "no-such-vmcore"), [])
            assert err.value.code == ErrorCode.INVALID_ARGUMENT
            first = await run("x = 6\nprint('hello')\nx * 7")
            assert first.head == "hello\n42\n" and first.error is None and first.lines == 2
            assert run.path.read_text() == "hello\n42\n"
            failed = await run("print('before')\n1/0")
            assert failed.error is not None and failed.head == "before\n" + failed.error + "\n"
            assert failed.error.endswith("ZeroDivisionError: division by zero") and "drgn_worker" not in failed.error
            exited = await run("raise SystemExit(3)")
            assert exited.error is not None and "SystemExit" in exited.error
            spin = await run("while True: pass", timeout_s=0.3)
            assert spin.interrupted and spin.error is not None and "KeyboardInterrupt" in spin.error
            capped = await run("print('y' * 5000)", max_output_bytes=100)
            assert capped.truncated and capped.head == "y" * 100 and capped.output_bytes == 100
            assert run.path.read_text() == "y" * 100
            again = await run("x")
            assert again.head == "6\n"  # the namespace survived all of the above
            fresh = await run("print('x' in dir())", isolated=True)
            assert fresh.head == "False\n"
            assert await client.close() == "quit"


async def test_a_big_output_goes_to_the_file_and_only_its_head_comes_back(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        run = Runner(client, tmp_path)
        with trio.fail_after(30):
            await client.greet()
            big = await run("for i in range(200000): print(f'line {i:06d}')", max_output_bytes=1 << 30)
            assert big.lines == 200000 and big.output_bytes == 200000 * 12 and not big.truncated
            assert not big.head_complete and len(big.head.encode()) == HEAD_BYTES
            assert run.path.stat().st_size == big.output_bytes
            cut = await run("print('z' * (1 << 20))\n1/0", max_output_bytes=1 << 16)
            assert cut.truncated and cut.error is not None
            assert run.path.read_text().startswith("z" * (1 << 16) + "\nTraceback")  # the traceback survives the cap
            assert await client.close() == "quit"


async def test_the_worker_refuses_to_write_its_output_through_a_planted_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("precious\n")
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        with trio.fail_after(30):
            await client.greet()
            planted = tmp_path / "cmd-000001.out"
            planted.symlink_to(target)
            result = await client.execute("print('overwrite')", filename="<t>", timeout_s=10, grace_s=5,
                                          max_output_bytes=1000, output_path=str(planted))
            assert result.head == "overwrite\n" and not planted.is_symlink()
            assert target.read_text() == "precious\n"
            assert await client.close() == "quit"


async def test_a_worker_that_ignores_sigint_is_declared_stuck(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        with trio.fail_after(30):
            await client.greet()
            with pytest.raises(DrgnStuck):
                await client.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                     "time.sleep(30)", filename="<t>", timeout_s=0.2, grace_s=0.3,
                                     max_output_bytes=100, output_path=str(tmp_path / "cmd-000001.out"))
            assert await client.close() in ("sigterm", "quit")
