"""Test support for the bpftrace back end.

- `bpftrace_daemon()`: a real `Daemon` object (registry, supervisor, audit, state dir) inside the
  test's nursery, with the bpftrace back end registered and no sockets. Tools are called through
  `ToolRegistry.call()` exactly as the MCP front end does, and every successful result is checked
  against the tool's output schema (what the MCP SDK client enforces). Leaving the block shuts the
  daemon down the way SIGTERM does, so the actors' cleanup runs.
- `FakeBpftrace`: a scripted stand-in for the bpftrace process (lines at given virtual times, a
  reaction to SIGINT), for timer tests on `MockClock`.
- `needs_bpftrace` / `tracefs`: real-bpftrace tests skip only when not root or bpftrace is absent;
  tracefs is mounted when missing (as scripts/setup.sh does).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
import trio.testing

from diagd.actors import bpftrace, system
from diagd.actors._subprocess import Spawn
from diagd.actors.bpftrace.backend import BpftraceBackend
from diagd.actors.bpftrace.parse import ATTACHED_MARKER, attach_count
from diagd.actors.tooling import CallContext
from diagd.daemon import config as config_mod
from diagd.daemon.server.server import Daemon
from diagd.protocol.errors import DiagdError, ErrorCode

IS_ROOT = os.geteuid() == 0
BPFTRACE = shutil.which("bpftrace")
needs_bpftrace = pytest.mark.skipif(
    not IS_ROOT or BPFTRACE is None,
    reason="real bpftrace tests need root and bpftrace (apt-get install bpftrace; run as root, as "
           "scripts/setup.sh test does)" if BPFTRACE else "bpftrace is not installed (apt-get install bpftrace)",
)


def ensure_tracefs() -> None:
    """Mount tracefs when missing, as scripts/setup.sh does (we are root when this runs)."""
    if system.tracefs_dir() is None:
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=True)


@dataclass
class Harness:
    daemon: Daemon
    backend: BpftraceBackend
    progress: list[tuple[float, float | None, str | None]] = field(default_factory=list)

    async def call(self, name: str, args: dict[str, Any] | None = None, *, progress: bool = False) -> dict[str, Any]:
        async def report(value: float, total: float | None, message: str | None) -> None:
            self.progress.append((value, total, message))

        ctx = CallContext(client="test", progress=report if progress else None)
        result = await self.daemon.registry.call(name, args or {}, ctx)
        if result.is_error:
            raise DiagdError(ErrorCode(result.payload["code"]), result.payload["message"],
                             **result.payload["details"])
        schema = self.daemon.registry.get(name).output_schema
        if schema is not None:
            jsonschema.validate(result.payload, schema)
        return result.payload

    async def error(self, name: str, args: dict[str, Any]) -> DiagdError:
        with pytest.raises(DiagdError) as caught:
            await self.call(name, args)
        return caught.value

    async def run(self, program: str, **args: Any) -> dict[str, Any]:
        """exec_program, then get_result waiting for the end."""
        started = await self.call("exec_program", {"program": program, **args})
        return await self.call("get_result", {"execution_id": started["execution_id"], "wait_s": 70,
                                              "until": "done", "limit": 10000})


@asynccontextmanager
async def bpftrace_daemon(state_dir: Path, settings: dict[str, Any] | None = None,
                          spawn: Spawn | None = None) -> AsyncIterator[Harness]:
    async with trio.open_nursery() as nursery:
        config = config_mod.parse({"daemon": {"idle_timeout_s": 600}, "bpftrace": settings or {}})
        daemon = Daemon(config, nursery, runtime_dir=state_dir, state_dir=state_dir)
        backend = bpftrace.register(daemon.runtime("bpftrace"))
        if spawn is not None:
            backend.spawn = spawn
        try:
            yield Harness(daemon, backend)
        finally:
            daemon.request_shutdown("test finished")
    daemon.audit.close()


# ---------------------------------------------------------------------------------------------
# A scripted bpftrace process


ATTACH = "Attaching {n} probes..."


class FakeBpftrace:
    """Plays `script` ([(virtual time, stdout line or None for exit)]) and reacts to signals.

    SIGINT: writes `on_sigint` lines and exits 0 (unless `ignore_sigint`). SIGKILL: exits -9.
    The pid is beyond any pid_max, so stop_process's killpg fails with ESRCH and falls back to
    `send_signal` here.
    """

    _next_pid = 99_000_000

    def __init__(self, script: Sequence[tuple[float, str | None]], *, on_sigint: Sequence[str] = (),
                 ignore_sigint: bool = False, stderr: str = "", exit_code: int = 0,
                 attach_fails: bool = False) -> None:
        FakeBpftrace._next_pid += 1
        self.pid = FakeBpftrace._next_pid
        self.script = list(script)
        self.on_sigint = list(on_sigint)
        self.ignore_sigint = ignore_sigint
        self.stderr_text = stderr
        self.exit_code = exit_code
        # Like bpftrace: with the marker variable in its environment it says on stderr when its probes
        # are attached, right after the announcement, unless the attach fails.
        self.attach_fails = attach_fails
        self.notify_attached = False
        self.returncode: int | None = None
        self.signals: list[tuple[float, int]] = []
        self.stdin = None  # like a trio.Process started with stdin=DEVNULL
        self._out_send, self.stdout = trio.testing.memory_stream_one_way_pair()
        self._err_send, self.stderr = trio.testing.memory_stream_one_way_pair()
        self._exited = trio.Event()
        self._sigint = trio.Event()

    async def play(self) -> None:
        if self.stderr_text:
            await self._err_send.send_all(self.stderr_text.encode())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._follow_script, trio.current_time())
            nursery.start_soon(self._watch_sigint)
            await self._exited.wait()
            nursery.cancel_scope.cancel()

    async def _follow_script(self, start: float) -> None:
        for at, line in self.script:
            await trio.sleep_until(start + at)
            if line is None:
                await self._exit(self.exit_code)
                return
            await self._out_send.send_all(line.encode() + b"\n")
            if attach_count(line, "json" if line.startswith("{") else "text") is not None \
                    and self.notify_attached and not self.attach_fails:
                await self._err_send.send_all(ATTACHED_MARKER.encode() + b"\n")

    async def _watch_sigint(self) -> None:
        await self._sigint.wait()
        for line in self.on_sigint:
            await self._out_send.send_all(line.encode() + b"\n")
        await self._exit(0)

    async def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            await self._out_send.aclose()
            await self._err_send.aclose()
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append((trio.current_time(), sig))
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL:
            self.returncode = -signal.SIGKILL
            self._out_send.close()
            self._err_send.close()
            self._exited.set()
        elif sig in (signal.SIGINT, signal.SIGTERM) and not self.ignore_sigint:
            self._sigint.set()

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class FakeSpawner:
    """`spawn` for the back end: hands out the next scripted process and plays it in `nursery`."""

    def __init__(self, nursery: trio.Nursery, *fakes: FakeBpftrace) -> None:
        self.nursery = nursery
        self.fakes = list(fakes)
        self.argvs: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Any:
        self.argvs.append(list(argv))
        fake = self.fakes.pop(0)
        fake.notify_attached = env is not None and ATTACHED_MARKER in env
        self.nursery.start_soon(fake.play)
        return fake
