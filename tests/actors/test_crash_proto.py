"""The drgn worker protocol: typed frames, validation, and the real worker process (no dump needed)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import trio

from diagd.actors import _crash_proto as proto
from diagd.actors._crash_drgn import DrgnClient, DrgnStuck
from diagd.protocol.errors import DiagdError, ErrorCode


def test_messages_round_trip_and_malformed_frames_are_protocol_errors() -> None:
    msg = proto.Exec(id=3, code="print(1)", filename="<t>")
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


async def test_the_worker_runs_code_survives_exceptions_and_is_interrupted_by_timeouts(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        with trio.fail_after(30):
            hello = await client.greet()
            assert hello.version == proto.PROTOCOL_VERSION and hello.pid == client.pid
            with pytest.raises(DiagdError) as err:
                await client.load(str(tmp_path / "no-such-vmcore"), [])
            assert err.value.code == ErrorCode.INVALID_ARGUMENT
            first = await client.execute("x = 6\nprint('hello')\nx * 7", filename="<t>", timeout_s=10, grace_s=5,
                                         max_output_bytes=1000)
            assert first.output == "hello\n42\n" and first.error is None
            failed = await client.execute("print('before')\n1/0", filename="<t>", timeout_s=10, grace_s=5,
                                          max_output_bytes=1000)
            assert failed.output == "before\n" and failed.error is not None
            assert failed.error.endswith("ZeroDivisionError: division by zero") and "_drgn_worker" not in failed.error
            exited = await client.execute("raise SystemExit(3)", filename="<t>", timeout_s=10, grace_s=5,
                                          max_output_bytes=1000)
            assert exited.error is not None and "SystemExit" in exited.error
            spin = await client.execute("while True: pass", filename="<t>", timeout_s=0.3, grace_s=5,
                                        max_output_bytes=1000)
            assert spin.interrupted and spin.error is not None and "KeyboardInterrupt" in spin.error
            capped = await client.execute("print('y' * 5000)", filename="<t>", timeout_s=10, grace_s=5,
                                          max_output_bytes=100)
            assert capped.truncated and len(capped.output) == 100
            again = await client.execute("x", filename="<t>", timeout_s=10, grace_s=5, max_output_bytes=1000)
            assert again.output == "6\n"  # the namespace survived all of the above
            fresh = await client.execute("print('x' in dir())", filename="<t>", timeout_s=10, grace_s=5,
                                         max_output_bytes=1000, isolated=True)
            assert fresh.output == "False\n"
            assert await client.close() == "quit"


async def test_a_worker_that_ignores_sigint_is_declared_stuck(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        client = await DrgnClient.spawn(nursery, cwd=tmp_path)
        with trio.fail_after(30):
            await client.greet()
            with pytest.raises(DrgnStuck):
                await client.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                     "time.sleep(30)", filename="<t>", timeout_s=0.2, grace_s=0.3,
                                     max_output_bytes=100)
            assert await client.close() in ("sigterm", "quit")
