"""The daemon's side of a drgn worker (`drgn_worker`): spawn, typed requests, timeouts, stop.

One request at a time (the session actor serializes them). Replies are matched by id, so a late
reply to an abandoned request is skipped instead of being taken for the next one. A request past
its timeout gets SIGINT (the worker turns it into KeyboardInterrupt inside the user's code); if
the worker does not answer within the grace period it is declared stuck.

The worker sends each output back in Output frames, which the daemon writes to the file the request
names (in the session directory: the worker, in namespaces of its own, cannot see it); the reply
carries only its first bytes and counts. A waiter reaps the worker as soon as it exits and closes
its pipes; `death()` says how it ended.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from pathlib import Path
from typing import TypeVar

import trio

from diagd.actors import interpreter, sandbox
from diagd.actors._subprocess import Step, Tail, close_pipes, describe_exit, drain, open_process, reap, stop_process
from diagd.actors.crash import proto as proto
from diagd.actors.crash.output import OutputWriter
from diagd.actors.sandbox import namespaces
from diagd.protocol import framing
from diagd.protocol.errors import DiagdError, ErrorCode

_Reply = TypeVar("_Reply", bound=proto.Message)

WORKER_MODULE = "diagd.actors.crash.drgn_worker"
STOP_STEPS = (Step("quit", None, 2.0), Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 3.0))


class DrgnStuck(Exception):
    """The worker ignored SIGINT past the grace period: only killing it helps."""


class DrgnClient:
    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.stderr = Tail(8192)
        self._frames = framing.FrameReader(proto.CODEC)
        self._ids = itertools.count(1)
        self.hello: proto.Hello | None = None
        self.expected_exit = False
        self.requests = 0
        self.exited = trio.Event()  # reaped; `exit_code` is set
        self.exit_code: int | None = None
        self._stderr_eof = trio.Event()
        self.jailed = False  # runs inside namespaces of its own (bubblewrap in front)

    @classmethod
    async def spawn(cls, nursery: trio.Nursery, *, cwd: Path | None = None,
                    policy: sandbox.Policy | None = None) -> DrgnClient:
        """Start the worker; with a policy, inside that sandbox (see `sandbox.drgn_policy`)."""
        argv = interpreter.module_argv(WORKER_MODULE)  # `-P`: its cwd (the session dir) is not on its path
        proc = await open_process(sandbox.wrap(argv, policy) if policy else argv, stdin=subprocess.PIPE,
                                  cwd=str(cwd) if cwd else None)
        client = cls(proc)
        client.jailed = bool(policy and policy.namespaces)
        nursery.start_soon(drain, proc.stderr, client.stderr.feed, client._stderr_eof)
        nursery.start_soon(client._wait)
        return client

    async def _wait(self) -> None:
        self.exit_code = await reap(self.proc, readers_done=(self._stderr_eof,))
        self.exited.set()

    async def death(self) -> str:
        """How the worker ended ("killed by SIGKILL"), waiting briefly for the waiter to reap it."""
        with trio.move_on_after(2.0):
            await self.exited.wait()
        return describe_exit(self.exit_code if self.exit_code is not None else self.proc.returncode)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    # -- framing ------------------------------------------------------------------------------------

    async def receive(self) -> proto.Message:
        assert self.proc.stdout is not None
        try:
            body = await self._frames.receive(self.proc.stdout)
        except (trio.BrokenResourceError, trio.ClosedResourceError, framing.StreamEnded):
            body = None  # closed, or ended inside a frame: the worker died while writing it
        if body is None:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "the drgn worker exited",
                             stderr=self.stderr.text()[-2000:])
        return proto.decode(body)

    async def send(self, msg: proto.Message) -> None:
        assert self.proc.stdin is not None
        try:
            await self.proc.stdin.send_all(proto.encode(msg))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "the drgn worker exited",
                             stderr=self.stderr.text()[-2000:]) from None

    async def _reply(self, request_id: int) -> proto.Message:
        while True:
            msg = await self.receive()
            if getattr(msg, "id", None) == request_id:
                return msg
            if isinstance(msg, proto.Error) and msg.id == -1:
                raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"drgn worker: {msg.message}")
            # a late reply to an abandoned request: skip it

    # -- requests -----------------------------------------------------------------------------------

    async def greet(self) -> proto.Hello:
        msg = await self.receive()
        if not isinstance(msg, proto.Hello):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"drgn worker spoke {msg.tag!r} before hello")
        if msg.version != proto.PROTOCOL_VERSION:
            raise DiagdError(ErrorCode.PROTOCOL_ERROR,
                             f"drgn worker speaks protocol {msg.version}, the daemon {proto.PROTOCOL_VERSION}")
        self.hello = msg
        return msg

    async def load(self, vmcore: str, debug_files: list[str]) -> proto.Loaded:
        request_id = next(self._ids)
        await self.send(proto.Load(id=request_id, version=proto.PROTOCOL_VERSION, vmcore=vmcore,
                                   debug_files=debug_files))
        return await self._expect(request_id, proto.Loaded, "load")

    async def execute(self, code: str, *, filename: str, timeout_s: float, grace_s: float, max_output_bytes: int,
                      output_path: str, isolated: bool = False) -> proto.ExecResult:
        """Run code, its output going to `output_path`; past timeout_s the worker gets SIGINT, past
        timeout_s + grace_s DrgnStuck."""
        request_id = next(self._ids)
        self.requests += 1
        # The worker bounds the output at max_output_bytes plus its traceback; the daemon holds it to that
        # too (user code could write frames of its own on the worker's stdout).
        writer = OutputWriter(output_path, max_output_bytes + 4 * proto.MAX_ERROR_CHARS)
        try:
            await self.send(proto.Exec(id=request_id, code=code, filename=filename, max_output_bytes=max_output_bytes,
                                       isolated=isolated))
            try:
                with trio.move_on_after(timeout_s):
                    return await self._exec_reply(request_id, writer)
                self.interrupt()
                with trio.move_on_after(grace_s):
                    return await self._exec_reply(request_id, writer)
            except trio.Cancelled:
                self.interrupt()  # abandoned: stop the user's code; its reply is skipped later
                raise
            raise DrgnStuck(f"drgn code ignored SIGINT for {grace_s:g} s after its {timeout_s:g} s timeout")
        finally:
            writer.close()

    async def _exec_reply(self, request_id: int, writer: OutputWriter) -> proto.ExecResult:
        """The Exec's result, its Output frames written to the output file on the way."""
        while True:
            reply = await self._reply(request_id)
            if not isinstance(reply, proto.Output):
                break
            writer.write(reply.data)
        if isinstance(reply, proto.Error):
            raise DiagdError.from_wire(reply.code, reply.message)
        if not isinstance(reply, proto.ExecResult):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"drgn worker answered exec with {reply.tag!r}")
        return reply

    async def _expect(self, request_id: int, kind: type[_Reply], what: str) -> _Reply:
        """The reply to one request, as the expected type; a worker error keeps its code."""
        reply = await self._reply(request_id)
        if isinstance(reply, proto.Error):
            raise DiagdError.from_wire(reply.code, reply.message)
        if not isinstance(reply, kind):
            raise DiagdError(ErrorCode.PROTOCOL_ERROR, f"drgn worker answered {what} with {reply.tag!r}")
        return reply

    def interrupt(self) -> None:
        """SIGINT to the worker itself: inside namespaces that is bubblewrap's grandchild (a signal to
        bubblewrap would end the sandbox), found by its host pid."""
        if self.proc.returncode is not None:
            return
        pid = namespaces.tool_pid(self.proc.pid) if self.jailed else self.proc.pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            pass

    async def close(self) -> str:
        self.expected_exit = True

        async def quit_() -> None:
            await self.send(proto.Quit(id=next(self._ids)))
            await self.proc.wait()

        async def graceful() -> None:
            try:
                await quit_()
            except DiagdError:
                pass

        step = await stop_process(self.proc, STOP_STEPS, graceful=graceful)
        await close_pipes(self.proc)
        return step
