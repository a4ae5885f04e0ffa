"""The capture back end's state: the live captures and their owners, the store on disk and the disk
budget, and the short dumpcap commands (interface lists, the capture filter's compile check).
Only the event loop writes it; the actors report to it when a capture starts, ends and retires."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors import system
from diagd.actors._subprocess import Completed, Spawn, open_process, run
from diagd.actors.capture.actor import KIND, CaptureActor
from diagd.actors.capture.interfaces import kernel_state, parse_link_types, parse_list
from diagd.actors.capture.record import Capture, CaptureStore
from diagd.actors.capture.replies import CaptureSummary, InterfaceInfo, LinkTypes
from diagd.actors.capture.settings import CaptureSettings
from diagd.actors.runtime import ActorRef, Runtime
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.capture")

COMMAND_TIMEOUT_S = 30.0


class CaptureBackend:
    def __init__(self, runtime: Runtime, *, spawn: Spawn = open_process) -> None:
        self.runtime = runtime
        self.spawn = spawn
        self.store = CaptureStore(runtime.state_dir)
        self.live: dict[str, CaptureActor] = {}
        self.starting = 0
        self._budget = trio.Lock()
        # recording_id -> the lock diagd_record_stop holds while it stops that recording (record_tools.py):
        # a second stop waits, then answers the stored bundle. Made on a stop's first use, dropped after it.
        self.recording_stops: dict[str, trio.Lock] = {}

    def settings(self) -> CaptureSettings:
        # Parsed per call: `diagd reload` applies to the next call.
        return CaptureSettings.parse(self.runtime.config().table)

    def shutting_down(self) -> bool:
        return self.runtime.shutting_down

    def recover(self) -> None:
        interrupted = self.store.recover()
        if interrupted:
            log.info("captures interrupted by the last daemon exit", captures=interrupted)

    # -- owners

    def owner_connected(self, owner: str | None) -> bool:
        """Whether `owner` is still connected (as serial ports count it: an exited `diagd call` is not)."""
        if owner is None:
            return False
        kind, _, pid = owner.rpartition(":")
        if not any(str(c.pid) == pid for c in self.runtime.clients()):
            return False
        return kind != "cli" or _process_running(pid)

    def check_owner(self, cap: Capture, client: str, force: bool) -> str | None:
        """May `client` stop `cap`? BUSY while another connected client owns it (unless `force`);
        returns the owner it takes over from, if another."""
        if cap.owner == client:
            return None
        if self.owner_connected(cap.owner) and not force:
            raise DiagdError(ErrorCode.BUSY, f"capture {cap.id} belongs to another connected diagd client "
                             f"({cap.owner})", capture_id=cap.id, owner=cap.owner,
                             hint="only its owner stops it while connected; stop_capture(force=true) takes it over")
        return cap.owner

    def may_stop(self, ref: ActorRef, client: str) -> None:
        """diagd_stop_actor on a capture's actor: refused like stop_capture while another client owns it."""
        actor = self.live.get(ref.resource)
        if actor is not None and actor.capture.running:
            self.check_owner(actor.capture, client, force=False)

    def describe(self, cap: Capture) -> CaptureSummary:
        return cap.summary(self.owner_connected(cap.owner) if cap.running else None)

    # -- captures

    def reserve(self, settings: CaptureSettings) -> None:
        running = [a.capture.id for a in self.live.values() if a.capture.running]
        if len(running) + self.starting >= settings.max_concurrent:
            raise DiagdError(ErrorCode.BUSY, f"{len(running) + self.starting} captures are running (max_concurrent "
                             f"= {settings.max_concurrent}): stop one with stop_capture", running=running,
                             max_concurrent=settings.max_concurrent)

    def new_capture(self, **fields: Any) -> Capture:
        capture_id = self.store.new_id(set(self.live))
        directory = self.store.make_dir(capture_id)
        return Capture(id=capture_id, dir=str(directory), **fields)

    def accepted(self, actor: CaptureActor) -> None:
        self.live[actor.capture.id] = actor
        self.store.save(actor.capture)

    def finished(self, actor: CaptureActor) -> None:
        cap = actor.capture
        log.info("capture ended", capture_id=cap.id, status=cap.status, reason=cap.stop_reason,
                 packets=cap.packets, bytes=cap.bytes_written)

    def forget(self, actor: CaptureActor) -> None:
        if self.live.get(actor.capture.id) is actor:
            del self.live[actor.capture.id]

    def retire(self, actor: CaptureActor) -> None:
        """A finished capture's actor leaves after linger_s; its record and files stay on disk."""
        ref = self.runtime.find(KIND, actor.capture.id)
        if ref is not None and ref.actor is actor:
            self.runtime.stop(ref, reason="capture finished")

    def running(self, capture_id: str) -> CaptureActor | None:
        return self.live.get(capture_id)

    async def capture(self, capture_id: str) -> Capture:
        self.store.meta_path(capture_id)  # validates the id
        actor = self.live.get(capture_id)
        if actor is not None:
            return actor.capture
        found = await trio.to_thread.run_sync(self.store.load, capture_id)
        if found is None:
            raise DiagdError(ErrorCode.NOT_FOUND, f"no capture {capture_id!r}", hint="list_captures shows them")
        return found

    async def all(self) -> list[Capture]:
        stored = {c.id: c for c in await trio.to_thread.run_sync(self.store.all)}
        stored.update({cid: a.capture for cid, a in self.live.items()})
        return sorted(stored.values(), key=lambda c: c.created_at)

    # -- the disk budget

    async def enforce_budget(self, *, room_for: int = 0, keep: str | None = None) -> dict[str, Any]:
        """Keep every capture's files and views within max_bytes (minus `room_for`): the oldest finished
        captures' files go first (their views with them); if the running ones alone are over, they are
        stopped, saying why (disk_budget). Also keeps at most keep_captures finished records."""
        settings = self.settings()
        async with self._budget:
            captures = await self.all()
            for cap in captures:
                if not cap.running:
                    await trio.to_thread.run_sync(cap.refresh_files)
            evicted, stopped = [], []
            total = await self.bytes_on_disk(captures)
            # What running captures reserved and have not written yet is theirs: room_for comes after it.
            pending = sum(max(0, c.reserved_bytes - c.bytes_on_disk()) for c in captures if c.running)
            for cap in captures:  # oldest first
                if total + pending + room_for <= settings.max_bytes:
                    break
                if not cap.running and cap.files and cap.id != keep:
                    total -= await trio.to_thread.run_sync(self.store.evict_files, cap)
                    evicted.append(cap.id)
            if total > settings.max_bytes:
                for actor in list(self.live.values()):
                    if actor.capture.running:
                        actor.request_stop("disk_budget")
                        stopped.append(actor.capture.id)
            finished = [c for c in captures if not c.running]
            for cap in finished[:max(0, len(finished) - settings.keep_captures)]:
                await trio.to_thread.run_sync(self.store.forget, cap)
            if evicted or stopped:
                log.info("capture disk budget", max_bytes=settings.max_bytes, evicted=evicted, stopped=stopped)
            return {"evicted": evicted, "stopped": stopped, "bytes_on_disk": total, "max_bytes": settings.max_bytes}

    async def room(self) -> int:
        """What a new capture or view may still take of the budget: max_bytes less every capture's files
        and views and what the running captures have reserved but not yet written."""
        settings = self.settings()
        captures = await self.all()
        pending = sum(max(0, c.reserved_bytes - c.bytes_on_disk()) for c in captures if c.running)
        return settings.max_bytes - await self.bytes_on_disk(captures) - pending

    async def make_room(self, size: int, what: str, *, keep: str) -> None:
        """Evict the oldest finished captures' files (never `keep`'s, the capture a view is made of) until
        `size` more bytes fit, else BUSY: a view is made only when it fits (a merged ring is a second copy
        of the files)."""
        await self.enforce_budget(room_for=size, keep=keep)
        free = await self.room()
        if size > free:
            raise DiagdError(ErrorCode.BUSY, f"{what} needs {size} bytes and the captures' disk budget has {free} free",
                             needed_bytes=size, free_bytes=free,
                             hint="stop the capture first (a finished one needs no copy), or raise [capture] max_bytes")

    async def bytes_on_disk(self, captures: list[Capture]) -> int:
        """What the budget counts: every capture's ring files and the views the pcap tools read
        (a merged ring is a whole second copy)."""
        views = await trio.to_thread.run_sync(lambda: sum(c.views_bytes() for c in captures))
        return sum(c.bytes_on_disk() for c in captures) + views

    # -- short dumpcap commands

    async def dumpcap(self, settings: CaptureSettings, args: Sequence[str]) -> Completed:
        return await run(settings.command(args), timeout_s=COMMAND_TIMEOUT_S, spawn=self.spawn,
                         fix=system.APT_HINT.format(pkg="wireshark-common"))

    async def interfaces(self, settings: CaptureSettings, with_link_types: bool) -> list[InterfaceInfo]:
        done = await self.dumpcap(settings, ["-D", "-M"])
        if done.returncode != 0:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"dumpcap -D failed: {done.stderr.strip()[:500]}")
        unasked: LinkTypes = {}  # each entry's link types are added below when asked for
        found: list[InterfaceInfo] = [{**listed, **kernel_state(listed["name"]), **unasked,
                                       "allowed": settings.allows(listed["name"])} for listed in parse_list(done.out)]
        limiter = trio.CapacityLimiter(4)

        async def link_types(entry: InterfaceInfo) -> None:
            async with limiter:
                listed = await self.dumpcap(settings, ["-L", "-M", "-i", entry["name"]])
            if listed.returncode == 0:
                entry["monitor_mode"], entry["link_types"] = parse_link_types(listed.out)
            else:
                entry["link_types"], entry["link_types_error"] = [], _message(listed.stderr)

        if with_link_types:
            async with trio.open_nursery() as nursery:
                for entry in found:
                    nursery.start_soon(link_types, entry)
        return found

    async def check_filter(self, settings: CaptureSettings, interfaces: Sequence[str], capture_filter: str,
                           snaplen: int, given: str | None = None) -> None:
        """Compile the filter for each interface's link type (`dumpcap -d`) before anything starts:
        INVALID_FILTER with dumpcap's own message, NOT_FOUND for an interface that is not there.
        `given`: the filter the caller wrote, named in the error (capture_filter adds diagd's own)."""
        given = capture_filter if given is None else given
        for interface in interfaces:
            done = await self.dumpcap(settings, ["-d", "-i", interface, "-s", str(snaplen),
                                                 *(["-f", capture_filter] if capture_filter else [])])
            message = _message(done.stderr)
            if "no device named" in message.lower() or "no such device" in message.lower():
                raise DiagdError(ErrorCode.NOT_FOUND, f"no interface {interface!r}: {message}", interface=interface,
                                 hint="list_interfaces shows what there is")
            failed = done.returncode != 0 or "(000)" not in done.out
            if failed and given != capture_filter and "rejects all packets" in message:
                # libpcap refuses a filter that matches nothing: here, one that asks for diagd's own traffic only.
                raise DiagdError(ErrorCode.INVALID_FILTER, f"capture filter {given!r} selects only traffic diagd "
                                 f"never captures (its own, left out as {capture_filter!r}: the requests of its "
                                 "HTTP listener carry bearer tokens)", filter=given, applied_filter=capture_filter,
                                 interface=interface)
            if failed:
                raise DiagdError(ErrorCode.INVALID_FILTER, f"capture filter {given!r} does not compile "
                                 f"for {interface}: {message or 'dumpcap printed no program'}",
                                 filter=given, applied_filter=capture_filter, interface=interface,
                                 hint="capture filters are BPF (pcap-filter(7)): 'udp port 38412', 'host 10.0.0.1 "
                                      "and sctp', not display filters")


def _message(stderr: str) -> str:
    """dumpcap's error text without its banners ("Capturing on ...", the User's Guide pointer)."""
    lines = [line.strip() for line in stderr.splitlines()]
    kept = [line.removeprefix("dumpcap: ") for line in lines if line and not line.startswith(("Capturing on", "See "))]
    return " ".join(kept)[:1000]


def _process_running(pid: str) -> bool:
    """The process exists and has not exited (a zombie has)."""
    try:
        stat_line = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return False
    fields = stat_line.rpartition(")")[2].split()
    return bool(fields) and fields[0] not in ("Z", "X")


