"""The actor of one live capture: it owns the dumpcap process, reads dumpcap's child-mode messages
into the capture's record (files, packets, drops), enforces the byte limit and the disk budget while it
runs, stops dumpcap (SIGINT, then SIGKILL) and records why it ended. See the package docstring."""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio

from diagd.actors import statefile, system
from diagd.actors._subprocess import Spawn, Step, Tail, close_pipes, describe_exit, drain, stop_process
from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy, unhandled
from diagd.actors.capture.childmode import Event, SyncReader, interface_statistics, parse_drops
from diagd.actors.capture.messages import Stop
from diagd.actors.capture.record import Capture, CaptureStore
from diagd.actors.capture.replies import CaptureSummary
from diagd.actors.capture.settings import CaptureSettings
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.capture")

KIND = "capture"
FLUSH_INTERVAL_S = 0.5  # how often the files are measured, the limits checked and the record saved
PIPE_EOF_GRACE_S = 2.0
SHUTDOWN_STEPS = (Step("sigint", 2, 3.0), Step("sigkill", 9, 5.0))
STOP_WAIT_MAX_S = 20.0


class Host(Protocol):
    """What a capture's actor needs of the back end that owns it and that it reports to
    (backend.CaptureBackend, which imports this module)."""

    store: CaptureStore
    spawn: Spawn

    def shutting_down(self) -> bool: ...

    def accepted(self, actor: CaptureActor) -> None: ...

    def finished(self, actor: CaptureActor) -> None: ...

    def forget(self, actor: CaptureActor) -> None: ...

    def retire(self, actor: CaptureActor) -> None: ...

    async def enforce_budget(self, *, room_for: int = 0) -> dict[str, Any]: ...

    def check_owner(self, cap: Capture, client: str, force: bool) -> str | None: ...

    def describe(self, cap: Capture) -> CaptureSummary: ...


class CaptureActor(Actor):
    kind = KIND
    # A capture is never restarted: a crash ends it (its files and counters are kept).
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY, max_restarts=0, stop_grace_s=15.0)

    def __init__(self, capture: Capture, backend: Host, settings: CaptureSettings,
                 argv: Sequence[str]) -> None:
        super().__init__(capture.id, settings)
        self.capture = capture
        self.backend = backend
        self.config = settings
        self.argv = list(argv)
        self.proc: trio.Process | None = None
        self.reader = SyncReader()
        self.stderr = Tail()  # dumpcap's own prints (not messages), for errors
        self.errors: list[str] = []
        self.bad_filter: str | None = None
        self.accepted = False
        self.stop_step: str | None = None
        self._first_file = trio.Event()
        self._wake = trio.Event()
        self._stderr_eof = trio.Event()
        self._stdout_eof = trio.Event()
        self._decided = trio.Event()
        self._finished = False

    # -- lifecycle

    async def start(self, nursery: trio.Nursery) -> None:
        cap = self.capture
        try:
            try:
                self.proc = await self.backend.spawn(self.argv)
            except FileNotFoundError:
                raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"dumpcap not found: {self.argv[0]!r}",
                                 fix=system.APT_HINT.format(pkg="wireshark-common")) from None
            cap.pid = self.proc.pid
            nursery.start_soon(self._run)
            with trio.move_on_after(self.config.start_timeout_s):
                await self._first_file.wait()
            if not cap.files:
                if self.proc.returncode is None:
                    self.request_stop("start_timeout")
                    raise DiagdError(ErrorCode.TIMEOUT, f"dumpcap opened no capture file within "
                                     f"{self.config.start_timeout_s:g} s", setting="[capture] start_timeout_s")
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stderr_eof.wait()
                raise self._start_failure()
            cap.status, cap.started_at = "running", time.time()
            self.accepted = True
            self.backend.accepted(self)
            nursery.start_soon(self._watch)
        finally:
            self._decided.set()

    def _start_failure(self) -> DiagdError:
        rc = self.proc.returncode if self.proc is not None else None
        if self.bad_filter is not None:
            return DiagdError(ErrorCode.INVALID_FILTER, f"the capture filter was refused: {self.bad_filter}",
                              filter=self.capture.filter)
        message = " ".join(self.errors) or self.stderr.text().strip() or describe_exit(rc)
        lowered = message.lower()
        if "no device named" in lowered or "no such device" in lowered:
            return DiagdError(ErrorCode.NOT_FOUND, f"dumpcap: {message}", interfaces=self.capture.interfaces,
                              hint="list_interfaces shows what there is")
        if "permission" in lowered or "not permitted" in lowered:
            return DiagdError(ErrorCode.PERMISSION_DENIED, f"dumpcap: {message}")
        return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"dumpcap could not start the capture "
                          f"({describe_exit(rc)}): {message}")

    async def _run(self) -> None:
        proc = self.proc
        assert proc is not None
        try:
            async with trio.open_nursery() as pipes:
                pipes.start_soon(self._read_stderr)
                pipes.start_soon(drain, proc.stdout, self.stderr.feed, self._stdout_eof)
                pipes.start_soon(self._reap)
                await self._wake.wait()
                if proc.returncode is None:
                    self.stop_step = await stop_process(proc, self.config.stop_steps())
                with trio.move_on_after(PIPE_EOF_GRACE_S):
                    await self._stderr_eof.wait()
                    await self._stdout_eof.wait()
                pipes.cancel_scope.cancel(reason="dumpcap exited")
            await close_pipes(proc)
            await self._decided.wait()
            if self.accepted:
                await self._finish()
                await trio.sleep(self.config.linger_s)
                self.backend.retire(self)
        finally:
            if not self._finished:
                with trio.CancelScope(shield=True):
                    await self._abort()

    async def _abort(self) -> None:
        """The actor is being stopped (daemon shutdown, diagd_stop_actor, start failure): bounded cleanup."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            self.request_stop("shutdown" if self.backend.shutting_down() else "actor_stopped")
            with trio.move_on_after(sum(s.wait_s for s in SHUTDOWN_STEPS) + PIPE_EOF_GRACE_S):
                async with trio.open_nursery() as pipes:
                    if not self._stderr_eof.is_set():  # its reader was cancelled with the actor:
                        pipes.start_soon(self._read_stderr)  # dumpcap reports its drops as it stops
                    self.stop_step = await stop_process(proc, SHUTDOWN_STEPS)
                    with trio.move_on_after(PIPE_EOF_GRACE_S):
                        await self._stderr_eof.wait()
                    pipes.cancel_scope.cancel()
        if proc is not None:
            await close_pipes(proc)
        if self.accepted:
            await self._finish()

    async def stop(self) -> None:
        if self.proc is not None:
            if self.proc.returncode is None:  # start() failed before _run took charge
                await stop_process(self.proc, (Step("sigkill", 9, 5.0),))
            await close_pipes(self.proc)
        self.backend.forget(self)

    async def _reap(self) -> None:
        assert self.proc is not None
        await self.proc.wait()
        self._first_file.set()
        self._wake.set()

    async def _read_stderr(self) -> None:
        assert self.proc is not None
        await drain(self.proc.stderr, self._on_stderr)
        self._stderr_eof.set()  # at EOF only: a reader cancelled with the actor leaves it unset

    def _on_stderr(self, chunk: bytes | bytearray) -> None:
        for event in self.reader.feed(chunk):
            self._on_event(event)

    def _on_event(self, event: Event) -> None:
        cap = self.capture
        match event.kind:
            case "F":
                cap.files.append(event.text)
                cap.file_sizes.setdefault(event.text, 0)
                self._first_file.set()
            case "P":
                cap.packets += int(event.text) if event.text.isdigit() else 0
            case "D":
                name, count = parse_drops(event.text)
                cap.drops_kernel = {**(cap.drops_kernel or {}), name: count}
            case "B":
                self.bad_filter = event.text.partition(":")[2] or event.text
            case "E":
                self.errors.append(event.text)
            case "text":
                self.stderr.feed(event.text.encode())
        cap.notify()

    async def _watch(self) -> None:
        """Measure the files, check the byte limit and the disk budget, save the record."""
        cap = self.capture
        while not self._finished and cap.running:
            await trio.sleep(FLUSH_INTERVAL_S)
            if self._finished or not cap.running:
                return
            await trio.to_thread.run_sync(cap.refresh_files)
            limit = cap.stop_on.get("bytes")
            if limit is not None and cap.bytes_written >= limit:
                self.request_stop("bytes")
            await self.backend.enforce_budget()
            await trio.to_thread.run_sync(self.backend.store.save, cap)
            cap.notify()

    def request_stop(self, reason: str, by: str | None = None) -> None:
        cap = self.capture
        if cap.stop_reason is None and cap.running:
            cap.stop_reason, cap.stopped_by = reason, by
            log.info("stopping capture", capture_id=cap.id, reason=reason)
            cap.notify()
        self._wake.set()

    async def _finish(self) -> None:
        """Record how the capture ended (dumpcap is gone) and persist it."""
        if self._finished:
            return
        self._finished = True
        cap = self.capture
        rc = None if self.proc is None else self.proc.returncode
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(cap.refresh_files)
            if cap.files:
                cap.interface_stats = await trio.to_thread.run_sync(_statistics, cap.files[-1]) or None
        if cap.stop_reason is None:
            cap.stop_reason = self._own_reason() if rc == 0 else "failed"
        if rc not in (0, None) and cap.stop_reason == "failed":
            cap.status = "failed"
            cap.error = f"dumpcap {describe_exit(rc)}: {' '.join(self.errors) or self.stderr.text().strip()}"
        else:
            cap.status = "stopped"
            if self.stop_step == "sigkill":
                cap.error = "dumpcap did not exit after SIGINT and was killed: its last file has no statistics"
        cap.ended_at = time.time()
        cap.pid = None
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.backend.store.save, cap)
        self.backend.finished(self)
        cap.notify()

    def _own_reason(self) -> str:
        """dumpcap ended by itself: which of the stop conditions it passed to it was reached."""
        packets = self.capture.stop_on.get("packets")
        if packets is not None and self.capture.packets >= packets:
            return "packets"
        cap = self.capture
        # dumpcap's kB is 1000 bytes (the reservation counts 1024: it only over-reserves).
        if cap.autostop_kb is not None and cap.bytes_written >= cap.autostop_kb * 1000:
            stop_bytes = cap.stop_on.get("bytes")
            return "bytes" if stop_bytes is not None and cap.bytes_written >= stop_bytes else "disk_budget"
        return "duration"

    # -- requests

    async def handle(self, request: Request) -> dict[str, Any]:
        cap = self.capture
        match request.message:
            case Stop(client=client, force=force) as stop:
                took_over = self.backend.check_owner(cap, client, force)
                self.request_stop("requested", by=client)
                return stop.reply({**self.backend.describe(cap), "took_over_from": took_over})
        raise unhandled("capture", request)

    def statistics(self) -> dict[str, Any]:
        cap = self.capture
        return {"capture_id": cap.id, "status": cap.status, "packets": cap.packets, "owner": cap.owner,
                "interfaces": cap.interfaces, "files": len(cap.files),
                "workers": system.workers((self.proc.pid if self.proc and self.proc.returncode is None else None,
                                           "dumpcap"))}

    def __repr__(self) -> str:
        return f"<CaptureActor {self.capture.id} [{self.capture.status}, packets: {self.capture.packets}]>"


def _statistics(path: str) -> dict[str, dict[str, int]]:
    try:
        with open(statefile.open_file(Path(path), os.O_RDONLY), "rb") as f:
            return interface_statistics(f)
    except (OSError, ValueError, struct.error, DiagdError):
        return {}
