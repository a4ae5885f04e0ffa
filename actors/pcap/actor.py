"""The pcap actor: one warm `sharkd` worker per capture, on Wireshark's own dissectors.

Actor key: the capture's sha256 + decode-as rules + preferences, so the same file opened with the
same decoding by any client shares one loaded worker. The worker loads the file once and answers
filters, frame trees and follows from memory; plain tshark is used where it is the right tool
(sub-capture export with `-w`, timeline values with `-T fields`, capinfos for the count and time
span). Loaded captures are capped (LRU eviction) and expire when idle.

Answers are what Wireshark's command-line tools print for the same question, and `include_command`
shows that command: timeline values come from `tshark -T fields` itself (the protocol tree's filter
strings differ from it for hex widths, bytes and times), frame text is rendered as `tshark -V` renders
it, the time span is capinfos' own text.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors.base import Actor, ActorState, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap import answers, text
from diagd.actors.pcap import ngap as ngap_summary
from diagd.actors.pcap import tshark as _cold
from diagd.actors.pcap.capture import CaptureSpec
from diagd.actors.pcap.messages import (
    Check,
    Detail,
    Export,
    Follow,
    Frames,
    Info,
    NgapSessions,
    PacketList,
    PduSessions,
    TextSearch,
    Timeline,
    cache_key,
)
from diagd.actors.pcap.rows import packet_row
from diagd.actors.pcap.sharkd import Sharkd, SharkdError
from diagd.actors.pcap.wireshark import Catalogue, catalogue, parse_decode_as
from diagd.actors.system import workers
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

KIND = "pcap"
MAX_FILTER_CHARS = 1800  # sharkd 4.0 reads each request line into a 2 KiB buffer


class PcapActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.2)

    def __init__(self, resource: str, settings: CaptureSpec) -> None:
        super().__init__(resource, settings)
        self.spec = settings
        self.sharkd: Sharkd | None = None
        self._nursery: trio.Nursery | None = None
        self._config_dir: Path | None = None
        self.analysis: dict[str, Any] = {}
        self.frame_count = 0
        self.load_s = 0.0
        self.loads = 0
        self.filters: OrderedDict[str, list[int]] = OrderedDict()
        self._trees: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self._results: OrderedDict[object, dict[str, Any]] = OrderedDict()
        self.cache_hits = 0
        self.cat: Catalogue | None = None
        self.load_warning: str | None = None
        self._loading = trio.Event()
        self._load_error: DiagdError | None = None
        self.column_formats: dict[str, int] = {}

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._config_dir = Path(tempfile.mkdtemp(prefix="diagd-wsconf-"))
        lines = []
        cat = self.cat = await catalogue()
        for rule in self.spec.decode_as:
            table, value, proto = parse_decode_as(rule, cat)
            lines.append(f"decode_as_entry: {table},{value},(none),{proto.upper()}")
        (self._config_dir / "decode_as_entries").write_text("\n".join(lines) + "\n")
        # No name resolution, as `tshark -n` (the cold passes and every equivalent command): with
        # it sharkd writes "f2:41:23:4c:99:3b (f2:41:23:4c:99:3b)" in Ethernet items and vendor
        # names in the address columns, and its answers would not match tshark's.
        (self._config_dir / "preferences").write_text(
            "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n")
        # The capture loads in the background: the first request reports progress while it waits,
        # or (frames, info) is answered by one cold tshark pass on the other core meanwhile.
        self._loading = self._begin_load()

    def _begin_load(self) -> trio.Event:
        assert self._nursery is not None
        done = trio.Event()
        self._load_error = None

        async def load() -> None:
            try:
                await self._load()
            except DiagdError as exc:
                self._load_error = exc
            except Exception as exc:
                self._load_error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"sharkd failed to load: {exc}")
            finally:
                done.set()

        self._nursery.start_soon(load)
        return done

    @property
    def worker_state(self) -> ActorState:
        """The sharkd worker's state, from the load in progress (`_loading`, set when it ends), its
        error (`_load_error`, reported once) and the process: STARTING while the capture loads,
        IDLE when loaded and alive, FAILED after a failed load, STOPPED when the worker died."""
        if not self._loading.is_set():
            return ActorState.STARTING
        if self._load_error is not None:
            return ActorState.FAILED
        if self.sharkd is None or not self.sharkd.alive:
            return ActorState.STOPPED
        return ActorState.IDLE

    @property
    def loaded(self) -> bool:
        return self.worker_state is ActorState.IDLE

    def cold_argv(self) -> list[str]:
        return _cold.base_argv(self.spec.path, self.spec.decode_as, self.spec.preferences)

    async def _load(self) -> None:
        assert self._nursery is not None and self._config_dir is not None
        started = time.monotonic()
        self._retire_worker()
        self.sharkd = await Sharkd.start(self._nursery, self._config_dir)
        # Preferences go in before the file is read: some act only in the first, sequential pass
        # (sctp.association_index numbers associations there; set after `load` every frame says 65535).
        for name, value in self.spec.preferences:
            try:
                await self.sharkd.call("setconf", {"name": name, "value": value})
            except SharkdError as exc:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"preference {name}={value}: {exc.message}") from None
        try:
            self.frame_count, self.load_warning = await self.sharkd.load(str(self.spec.path))
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"sharkd cannot read {self.spec.path}: {exc.message}",
                             path=str(self.spec.path)) from None
        self.analysis = {}  # a whole extra pass: computed when first needed, not at load
        info = await self.sharkd.call("info")
        # Column formats are an enum whose order sharkd lists in `info`: map %m, %t, ... to indices.
        self.column_formats = {c["format"]: i for i, c in enumerate(info.get("columns", []))}
        self.load_s = time.monotonic() - started
        self.loads += 1
        self.filters.clear()
        self._trees.clear()

    async def worker(self, request: Request) -> Sharkd:
        if self.worker_state in (ActorState.FAILED, ActorState.STOPPED):
            error = self._take_load_error()
            # A worker that died (killed, crashed, timed out) is replaced by the call that finds it
            # dead; a capture sharkd cannot read is reported once (the file may be fixed later).
            if error is not None and error.code != ErrorCode.BACKEND_UNAVAILABLE:
                raise error
            self._loading = self._begin_load()
        if self.worker_state is ActorState.STARTING:
            await request.report_progress(0, 1, f"loading {self.spec.path.name} ({self.spec.size} bytes)")
            await self._loading.wait()
            error = self._take_load_error()
            if error is not None:
                raise error  # this call waited for that load: it gets its error, the next call retries
            await request.report_progress(1, 1, "capture loaded")
        assert self.sharkd is not None
        return self.sharkd

    def _take_load_error(self) -> DiagdError | None:
        error, self._load_error = self._load_error, None
        if error is not None:
            self._loading = trio.Event()
            self._loading.set()
            self._retire_worker()
        return error

    def _retire_worker(self) -> None:
        """Drop the current worker; stop it in the background (usually it is reaped already)."""
        old, self.sharkd = self.sharkd, None
        if old is not None and self._nursery is not None:
            self._nursery.start_soon(old.close)

    async def stop(self) -> None:
        if self.sharkd is not None:
            await self.sharkd.close()
        if self._config_dir is not None:
            shutil.rmtree(self._config_dir, ignore_errors=True)

    def statistics(self) -> dict[str, Any]:
        return {
            "path": str(self.spec.path),
            "sha256": self.spec.sha256,
            **self.spec.describe(),
            "frames": self.frame_count,
            "load_s": round(self.load_s, 3),
            "loads": self.loads,
            "sharkd_pid": self.sharkd.proc.pid if self.sharkd else None,
            "sharkd_rss_bytes": self.sharkd.rss_bytes() if self.sharkd else None,
            "sharkd_requests": self.sharkd.requests if self.sharkd else 0,
            "cache_hits": self.cache_hits,
            "workers": workers((self.sharkd.proc.pid if self.sharkd else None, "sharkd")),
        }

    # -- sharkd primitives ------------------------------------------------------------------

    async def check_filter(self, request: Request, display_filter: str) -> None:
        if not display_filter:
            return
        self.check_length(display_filter)
        try:
            await (await self.worker(request)).call("check", {"filter": display_filter})
        except SharkdError as exc:
            message = exc.message.removeprefix("Filter invalid - ")
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {message}",
                             display_filter=display_filter) from None

    @staticmethod
    def check_length(display_filter: str) -> None:
        if len(display_filter) > MAX_FILTER_CHARS:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"display filter of {len(display_filter)} characters: sharkd 4.0 takes requests of at "
                             f"most 2 KiB, so filters are limited to {MAX_FILTER_CHARS} characters",
                             display_filter=display_filter[:200] + "...")

    async def matching(self, request: Request, display_filter: str) -> list[int]:
        """Frame numbers matching a filter (all frames for ''), cached per filter."""
        if display_filter in self.filters:
            self.filters.move_to_end(display_filter)
            return self.filters[display_filter]
        await self.check_filter(request, display_filter)
        params: dict[str, Any] = {"column0": "frame.number:0"}
        if display_filter:
            params["filter"] = display_filter
        try:
            rows = await (await self.worker(request)).call("frames", params)
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {exc.message}",
                             display_filter=display_filter) from None
        numbers = [int(r["num"]) for r in rows]
        self.filters[display_filter] = numbers
        if len(self.filters) > 64:
            self.filters.popitem(last=False)
        return numbers

    async def page(self, request: Request, display_filter: str, offset: int, limit: int
                   ) -> tuple[int, list[dict[str, Any]]]:
        """(total matches, one page of default packet-list columns) in two cheap sharkd calls.

        sharkd keeps a bitmap per filter, so the page (`skip`/`limit`) costs one pass the first
        time and milliseconds after; the total comes from `intervals` on the same bitmap.
        """
        await self.check_filter(request, display_filter)
        worker = await self.worker(request)
        params: dict[str, Any] = {"limit": limit}
        if offset:
            params["skip"] = offset  # sharkd refuses skip=0
        if display_filter:
            params["filter"] = display_filter
        try:
            result = await worker.call("frames", params)
            if display_filter:
                counted = await worker.call("intervals", {"filter": display_filter, "interval": 2**31 - 1})
                total = int(counted.get("frames", 0))
            else:
                total = self.frame_count
        except SharkdError as exc:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {exc.message}",
                             display_filter=display_filter) from None
        rows = [packet_row(r["c"]) for r in result]
        return total, rows

    async def tree(self, request: Request, number: int, *, keep: bool = True) -> dict[str, Any]:
        """A frame's protocol tree with its bytes (tshark -V dumps `data` items in hex), cached:
        the bytes always come along, so one frame is one cache entry whatever the caller renders.
        A scan over a whole capture passes keep=False: thousands of trees would hold hundreds of MB."""
        worker = await self.worker(request)  # loads the capture first, so frame_count is known
        if not 1 <= number <= self.frame_count:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"frame {number} does not exist: the capture has frames 1..{self.frame_count}",
                             frame=number, frame_count=self.frame_count)
        key = number
        if key in self._trees:
            self._trees.move_to_end(key)
            return self._trees[key]
        params: dict[str, Any] = {"frame": number, "proto": True, "bytes": True}
        answer = await worker.call("frame", params)
        if keep:
            self._trees[key] = answer
            if len(self._trees) > 4096:
                self._trees.popitem(last=False)
        return dict(answer)

    # -- requests ---------------------------------------------------------------------------

    async def analysed(self, request: Request) -> dict[str, Any]:
        """Protocols and time span of the whole capture (one dissection pass, done once)."""
        if not self.analysis:
            self.analysis = await (await self.worker(request)).call("analyse")
        return self.analysis

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        # Equal questions share one answer: a message is its own cache key (less stop_at, a moment).
        key = cache_key(request.message)
        if key is not None and key in self._results:
            self.cache_hits += 1
            self._results.move_to_end(key)
            return {**self._results[key], "cached": True}
        result = await self._answer(request)
        if key is None or result.get("served_by", "sharkd") != "sharkd":
            return {**result, "cached": False}  # a stand-in answer while loading: ask the worker next time
        if result.get("stopped_because") == "time_budget":
            return {**result, "cached": False}  # another call may have the time to finish it
        self._results[key] = result
        if len(self._results) > 256:
            self._results.popitem(last=False)
        return {**result, "cached": False}

    async def _frames(self, request: Request, message: Frames) -> dict[str, Any]:
        """Fetched here, shaped by answers.frames (which never calls back into the actor)."""
        if self.worker_state is ActorState.STARTING:  # first question while sharkd loads: one tshark pass beside it
            self.check_length(message.display_filter)
            total, rows = await answers.frames_while_loading(request, self.spec, self.cold_argv(), self.filters,
                                                             message)
            served_by = "tshark (capture still loading)"
        else:
            total, rows = await self.page(request, message.display_filter, message.offset, message.limit)
            served_by = "sharkd"
        present = None
        if not total and message.display_filter:
            present = list((await self.analysed(request)).get("protocols", []))
        return answers.frames(message, total, rows, served_by, present, self.cat)

    async def _answer(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Info():
                return await answers.info(self, request)
            case Check(display_filter=display_filter):
                await self.check_filter(request, display_filter)
                return {"valid": True}
            case Frames() as message:
                return await self._frames(request, message)
            case Timeline() as message:
                return await answers.timeline(self, request, message)
            case Detail() as message:
                trees = {n: await self.tree(request, n) for n in sorted(set(message.frame_numbers))}
                return await text.detail(self, message, trees)
            case TextSearch() as message:
                return await text.text_search(self, request, message)
            case Follow() as message:
                return await answers.follow(self, request, message)
            case PacketList() as message:
                return await answers.packet_list(self, request, message)
            case Export() as message:
                return await answers.export(self, message)
            case NgapSessions(display_filter=display_filter):
                pdus = await answers.ngap_pdus(self, request, display_filter)
                return ngap_summary.ue_sessions(pdus, filtered=bool(display_filter))
            case PduSessions(display_filter=display_filter):
                pdus = await answers.ngap_pdus(self, request, display_filter)
                return ngap_summary.pdu_sessions(pdus, filtered=bool(display_filter))
        raise unhandled("pcap", request)
