"""One actor per capture index (kind `pcap-index`, resource: the capture's key): it finds the index on
disk or builds it (index/build.py, a child process), then answers from it (index/query.py).

The build goes on in the actor's own nursery whoever asked: a call waits for it at most its `wait_s`
and is told how far it is. Pages of the whole capture (pcap_frames_by_filter without a filter) come
from a ready index at any offset in milliseconds, whether or not sharkd holds the capture.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import structlog
import trio

from diagd.actors._subprocess import Tail, head
from diagd.actors.base import Actor, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap.answer_types import (
    FramesAnswer,
    IndexAnswer,
    IndexSummary,
    PduSessionsAnswer,
    ProceduresAnswer,
    StatsAnswer,
    TimelineAnswer,
    UeSessionsAnswer,
)
from diagd.actors.pcap.answers import answers, index_srt
from diagd.actors.pcap.answers.answers import MAX_SORTED_ROWS
from diagd.actors.pcap.engine.passes import Page
from diagd.actors.pcap.index import cut_columns, filters, narrowing, partial, query, timelines
from diagd.actors.pcap.index import stats as index_stats
from diagd.actors.pcap.index.build import SEGMENT_FRAMES
from diagd.actors.pcap.index.build import command as build_command
from diagd.actors.pcap.index.ngap_pdus import Decoding
from diagd.actors.pcap.index.ngap_views import NgapViews
from diagd.actors.pcap.index.readings import Readings
from diagd.actors.pcap.index.schema import SCHEMA_VERSION
from diagd.actors.pcap.index.store import IndexStore, Stored
from diagd.actors.pcap.index.tables import PROTOCOLS as LAYERED_PROTOCOLS
from diagd.actors.pcap.messages import (
    Frames,
    IndexNgapProcedures,
    IndexNgapSessions,
    IndexPduSessions,
    IndexStats,
    IndexStatus,
    Stats,
    Timeline,
)
from diagd.actors.pcap.shark.rows import sort_key
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

KIND = "pcap-index"
PROGRESS_S = 1.0  # a call waiting for a build is told how far it is this often (when it moved)
M = TypeVar("M")  # a question, and its answer, from an index still being built (_building)
A = TypeVar("A")
RETRY_AFTER_S = 60.0  # a failed build is tried again by a call this long after it failed
# A build says its progress every block of rows (~10-20k frames, a second or two); one silent this long is
# stopped (its process group) and fails: a dissector looping on a crafted frame would otherwise hold the
# daemon-wide build slot, and a tshark, for good. Generous: the conversation tables written at the end of a
# 10 GB build take well under it.
BUILD_STALL_S = 900.0
# A filter's matches kept for its next pages (query.Matches): the numbers of up to a million frames
# (8 MB), or, when more match, a count per block of frames (bytes); the last few filters asked.
MATCHES_KEPT = 1_000_000
MATCH_LISTS_KEPT = 4
LOCATE_WAIT_S = 2.0  # a call waits this long (or its wait_s) for the index to be found before saying "locating"


class IndexActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=0)
    concurrency = 8  # a call waiting for the build does not hold up the pages of another

    def __init__(self, resource: str, capture: Path, tshark_argv: list[str], store: IndexStore,
                 locate: Callable[[], Awaitable[Path]], *, remember: Callable[[Path], None] = lambda path: None,
                 builds: trio.CapacityLimiter | None = None, cuts: trio.CapacityLimiter | None = None,
                 in_use: Callable[[], frozenset[Path]] = frozenset,
                 chunk_bytes: int = 0, segment_frames: int = SEGMENT_FRAMES) -> None:
        super().__init__(resource)
        self.capture = capture
        self.tshark_argv = tshark_argv  # the capture's own tshark command (file, decoding), two-pass
        self.store = store
        self.chunk_bytes = chunk_bytes  # a capture bigger than this is read in chunks (index/stitch.py); 0: never
        self.segment_frames = segment_frames  # frames per file of the frames table (index/build.py)
        self._locate = locate  # where the index of this file version and decoding lives (may hash the file)
        self._remember = remember  # records where this file version's index is (IndexStore.remember)
        # Builds at once, daemon-wide (the back end's): each is a tshark whose memory grows with its capture.
        self._builds = builds or trio.CapacityLimiter(1)
        # Readings of a cut beside the index at once, daemon-wide (the back end's): each a bounded child.
        self._cuts = cuts or trio.CapacityLimiter(1)
        self._in_use = in_use  # the indexes running actors answer from: never evicted under them
        self.path: Path | None = None
        self.stored: Stored | None = None
        self.error: DiagdError | None = None
        self.failed_at = 0.0
        self.built_here = False
        self.building: partial.Building | None = None  # a running build's files closed so far (index/partial.py)
        self._partial_reads = trio.CapacityLimiter(1)  # ... read one question at a time, beside the build
        # Recent answers' material, least recently used first: matching frame numbers, table rows.
        self._matches: dict[tuple[Path, str], query.Matches] = {}
        # ... and of filters it does not translate, matched by tshark over a cut (index/narrowing.py).
        # Read once (readings.py), a few, or why not (the loaded capture answers): a refusal that holds for good
        # (cut_columns.Lasting) is never read again, any other failure not for a while.
        self._narrowings: Readings[tuple[Path, str], tuple[narrowing.Narrowed, query.Matches]] = Readings(
            "the frames this filter matches", MATCH_LISTS_KEPT, permanent=(cut_columns.Lasting,),
            limiter=self._cuts)
        # Response times per protocol (answers/index_srt.py), read once too.
        self._srts: Readings[tuple[Path, str, str], StatsAnswer] = Readings(
            "the response times", MATCH_LISTS_KEPT, permanent=(cut_columns.Lasting,), limiter=self._cuts)
        # The NGAP views (UE contexts, procedures, PDU sessions) of the index's capture.
        self.ngap = NgapViews(capture, tshark_argv, self._on_disk, store.touch, self._cuts)
        self._nursery: trio.Nursery | None = None
        self._reset()

    def _reset(self) -> None:
        self._located = trio.Event()
        self.done = trio.Event()
        self.queued = False  # waiting for a build slot
        self.frames_indexed = 0
        self._summary: IndexSummary | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.ngap.start(nursery)
        self._srts.start(nursery)
        self._narrowings.start(nursery)
        nursery.start_soon(self._find_or_build)
        # What a daemon killed mid-build or mid-reading left (partial folders nobody holds the lock of).
        nursery.start_soon(trio.to_thread.run_sync, self.store.sweep)

    def _retry(self) -> bool:
        """A failed build is tried again by the first call RETRY_AFTER_S after it failed (a full disk,
        tshark out of memory: may pass now); sooner, every poll would start one more tshark pass."""
        if self.error is None or trio.current_time() - self.failed_at < RETRY_AFTER_S or self._nursery is None:
            return False
        self.error = None
        self._reset()
        self._nursery.start_soon(self._find_or_build)
        return True

    async def _find_or_build(self) -> None:
        try:
            try:
                self.path = await self._locate()
                self.stored = self.store.ready(self.path)
            finally:
                self._located.set()
            path = self.path
            if self.stored is None:
                try:
                    self._builds.acquire_nowait()
                except trio.WouldBlock:  # another capture's build runs: said `queued` meanwhile
                    self.queued = True
                    await self._builds.acquire()
                    self.queued = False
                try:
                    self.stored = self.store.ready(path)  # built by another meanwhile?
                    if self.stored is None:
                        self.stored = await self._build(path)
                        self.built_here = True
                finally:
                    self._builds.release()
                await trio.to_thread.run_sync(lambda: self.store.evict(path, self._in_use()))
            self._remember(path)
        except DiagdError as exc:
            self.error = exc
            self.failed_at = trio.current_time()
        finally:
            self.queued = False
            self._located.set()
            self.done.set()

    @property
    def located(self) -> bool:
        """Found on disk, or known to need a build (a new big file: after its hash)."""
        return self._located.is_set()

    async def wait_located(self) -> None:
        await self._located.wait()

    async def _build(self, path: Path) -> Stored:
        path.parent.mkdir(parents=True, exist_ok=True)
        argv = build_command(path, self.tshark_argv, self.chunk_bytes, self.segment_frames)
        meta: dict[str, Any] = {}

        def take(line: str) -> None:
            try:
                said = json.loads(line)
            except ValueError:
                return
            if "frames" in said:
                self.frames_indexed = int(said["frames"])
                stall.deadline = trio.current_time() + BUILD_STALL_S
                if said.get("indexed"):
                    self.building = partial.Building(Path(said["folder"]), int(said["indexed"]),
                                                     bool(said.get("chunked")))
            elif "done" in said:
                meta.update(said["done"])

        try:
            with trio.move_on_after(BUILD_STALL_S) as stall:
                done = await head(argv, None, max_line=1 << 20, on_line=take)
        finally:
            self.building = None
        if stall.cancelled_caught:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"the index of {self.capture.name} could not be built: "
                             f"no progress for {BUILD_STALL_S:g} s after frame {self.frames_indexed} (stopped)",
                             path=str(self.capture), frames_indexed=self.frames_indexed)
        stored = self.store.ready(path)
        if done.returncode != 0 or stored is None or not meta:
            said = Tail()
            said.feed(done.stderr.encode())
            last = [x for x in said.text().splitlines() if x.strip()][-1:] or [f"exit status {done.returncode}"]
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"the index of {self.capture.name} could not be built: "
                             f"{last[0]}", path=str(self.capture))
        self.frames_indexed = int(meta.get("frames", self.frames_indexed))
        return stored

    # -- requests -------------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case IndexStatus() as message:
                return message.reply(await self._status(request, message.wait_s))
            case Frames() as message:
                return message.reply(await (self._page(message) if self.stored is not None
                                            else self._building(partial.frames, self._page, message)))
            case IndexStats() as message:
                return message.reply(await self._stats(message))
            case Timeline() as message:
                return message.reply(await (self._timeline(message) if self.stored is not None
                                            else self._building(partial.timeline, self._timeline, message)))
            case IndexNgapSessions(display_filter=flt) as message:
                decoding = Decoding(message.decode_as_entries, message.preferences)
                return message.reply(cast("UeSessionsAnswer", await self.ngap.ue_sessions(decoding, flt)))
            case IndexNgapProcedures(display_filter=flt) as message:
                decoding = Decoding(message.decode_as_entries, message.preferences)
                return message.reply(cast("ProceduresAnswer", await self.ngap.procedures(decoding, flt)))
            case IndexPduSessions(display_filter=flt) as message:
                decoding = Decoding(message.decode_as_entries, message.preferences)
                return message.reply(cast("PduSessionsAnswer", await self.ngap.pdu_sessions(decoding, flt)))
        raise unhandled(KIND, request)

    def ngap_unanswered(self, decoding: Decoding) -> str | None:
        """Why this capture's NGAP model does not come from its index (known after a first try), or None."""
        return self.ngap.unanswered(self.stored, decoding)

    def tables_from_sharkd(self) -> dict[str, str]:
        """The protocols whose conversation and endpoint tables the index does not answer, and why."""
        meta = self.stored.meta if self.stored is not None else {}
        if failed := meta.get("tables_failed"):
            return dict.fromkeys(LAYERED_PROTOCOLS, f"the tables could not be written: {failed}")
        return {layer: f"{noted['frames']} frame(s) whose {layer} layers cannot be read as its tap counts them "
                       f"(first: {', '.join(map(str, noted['first']))})"
                for layer, noted in (meta.get("unaligned") or {}).items()}

    def answers(self, message: Frames | Stats | Timeline) -> bool:
        """Whether a ready index answers this question exactly (else sharkd does): the whole capture's
        pages; a timeline of fields it holds, with their own filter (frames holding any of them); the
        conversations and endpoints of the layers it holds, unless some frame's fields of that protocol
        could not be aligned with its layers (tables.py: meta.json's `unaligned`); I/O intervals, unfiltered
        or with a filter it translates; the whole capture's response times of a protocol answers/index_srt.py reads."""
        stored = self.stored
        if stored is None:
            return False
        if isinstance(message, Frames):
            return filters.to_sql(message.display_filter) is not None or self.narrowed_to(message) is not None
        if isinstance(message, Timeline):
            return timelines.where(message) is not None
        if message.kind == "io":
            return filters.to_sql(message.display_filter) is not None
        if message.kind == "srt":
            return index_srt.answers(message)
        unaligned = stored.meta.get("unaligned") or {}
        return (message.kind in ("conversations", "endpoints") and message.protocol in LAYERED_PROTOCOLS
                and not message.display_filter and message.protocol not in unaligned
                and not stored.meta.get("tables_failed"))

    @staticmethod
    def narrowed_to(message: Frames) -> tuple[str, ...] | None:
        """The layers a filter the index does not translate is matched on (tshark over a cut of the frames
        carrying them: index/narrowing.py); None: not so (`kinds` unknown, or no layer every match carries)."""
        if message.kinds is None or filters.to_sql(message.display_filter) is not None:
            return None
        return narrowing.required_layers(message.display_filter, message.kinds)

    @property
    def ready(self) -> bool:
        return self.stored is not None

    @property
    def tshark_version(self) -> str | None:
        """The version of the tshark that built the index (index/build.py records it)."""
        return str(self.stored.meta.get("tshark_version", "unknown")) if self.stored is not None else None

    async def _status(self, request: Request, wait_s: float) -> IndexAnswer:
        retried = self._retry()
        with trio.move_on_after(max(wait_s, LOCATE_WAIT_S)):
            await self._located.wait()  # found on disk or not: what the first answer after a restart says
        if wait_s > 0 and not self.done.is_set():
            with trio.move_on_after(wait_s):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._tell_progress, request)
                    await self.done.wait()
                    nursery.cancel_scope.cancel()
        stored = self.stored
        answer: IndexAnswer = {"state": "building", "frames_indexed": self.frames_indexed,
                               "index": self.path.name if self.path else None,
                               "index_bytes": stored.bytes if stored else None,
                               "build_s": stored.meta.get("build_s") if stored else None,
                               "schema_version": SCHEMA_VERSION}
        if self.error is not None:
            answer |= {"state": "failed", "error": self.error.message,
                       "note": f"the next call {RETRY_AFTER_S:.0f} s after the failure builds it again"}
        elif stored is not None:
            answer["state"] = "ready"
            answer["summary"] = await self.summary()
            if (how := query.chunked(stored.meta)) is not None:
                answer["chunked"] = how
            if deferred := self.tables_from_sharkd():
                answer["tables_from_sharkd"] = deferred
            self.store.touch(stored.path)
            if not self.built_here:
                answer["note"] = "found on disk: built before (by this daemon or an earlier one)"
        elif not self._located.is_set():
            answer |= {"state": "locating", "note": "hashing the capture to find its index (a big file takes "
                                                    "seconds per GB); the same call again tells"}
        elif self.queued:
            answer |= {"state": "queued", "note": "another capture's index is being built (one at a time: "
                                                  "each tshark's memory grows with its capture); this one follows"}
        else:
            answer["note"] = ("one tshark pass over the capture is writing it: frames_indexed says how far; "
                              "the same call again (or wait_s) tells when it is ready")
            if (building := self.building) is not None:
                answer["pages_from_frames"] = building.indexed
                answer["note"] += (f"; pcap_frames_by_filter and pcap_timeline pages within its first "
                                   f"{building.indexed} frames (unfiltered, or with a filter it translates) come "
                                   "from it already, unless sharkd holds the capture (its exact pages first)")
            if retried:
                answer["note"] += "; the last build failed, this is a new one"
        return answer

    async def _tell_progress(self, request: Request) -> None:
        """While a call waits for the build: how many frames are written, every PROGRESS_S."""
        told = -1
        while True:
            if self.frames_indexed != told:
                told = self.frames_indexed
                await request.report_progress(told, None, f"{told} frames indexed")
            await trio.sleep(PROGRESS_S)

    async def summary(self) -> IndexSummary:
        assert self.stored is not None
        if self._summary is None:
            found = await trio.to_thread.run_sync(query.summary, self.stored.path, self.stored.meta)
            protocols = list(found["protocols"])
            # sharkd's `analyse` names the frame layer first; frame.protocols starts below it.
            self._summary = {"frames": int(found["frames"]), "first_epoch": found["first_epoch"],
                             "last_epoch": found["last_epoch"],
                             "protocols": ["frame", *protocols] if found["frames"] else []}
        return self._summary

    def _on_disk(self) -> Stored:
        """The ready index, still on disk (a coded error otherwise)."""
        stored = self.stored
        if stored is None:
            raise DiagdError(ErrorCode.BUSY, "the capture's index is not built yet", retry_after_s=1)
        if self.store.ready(stored.path) is None:  # removed under it (by hand, or another daemon's budget)
            self.stored, self._summary = None, None
            raise DiagdError(ErrorCode.NOT_FOUND, "the capture's index was removed; pcap_index builds it again",
                             index=stored.path.name)
        return stored

    async def _page(self, message: Frames) -> FramesAnswer:
        where = filters.to_sql(message.display_filter)
        layers = self.narrowed_to(message)
        if where is None and layers is None:
            # Asked of it while it was built (the tool chose it then): the loaded capture answers.
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "the index does not answer this filter (sharkd does)",
                             index_unanswered=True)
        stored = self._on_disk()
        summary = await self.summary()
        narrowed = None
        if where is None:
            assert layers is not None
            narrowed, matches = await self._narrowed(stored, message.display_filter, layers)
            total = matches.total
            rows = await trio.to_thread.run_sync(query.listed_page, stored.path, "FALSE", matches, message.offset,
                                                 message.limit)
        elif message.display_filter:
            matches = await self._matches_of(stored, where)
            total = matches.total
            rows = await trio.to_thread.run_sync(query.listed_page, stored.path, where, matches, message.offset,
                                                 message.limit)
        else:
            total = summary["frames"]
            rows = await trio.to_thread.run_sync(query.page, stored.path, message.offset, message.limit)
        self.store.touch(stored.path)
        seams = await self._seams(stored, [row["number"] for row in rows])
        for row in rows:
            if row["number"] in seams:
                row["provisional"] = query.SEAM_COLUMNS
        result = answers.frames(message, Page(total, True, rows, "index", rows_exact=not seams),
                                summary["protocols"], None)
        notes = [query.filter_note(stored.meta)] if message.display_filter and narrowed is None else []
        if narrowed is not None:
            notes += [narrowed.note(summary["frames"]), narrowing.seam_note(stored.meta)]
        if seams:
            notes.append(self._seam_note(stored, len(seams)))
        if notes := [n for n in notes if n]:
            result["note"] = "; ".join(notes)
        return result

    async def _building(self, answer: Callable[[partial.Building, M], A], ready: Callable[[M], Awaitable[A]],
                        message: M) -> A:
        """An answer from the frames a running build has indexed so far (index/partial.py; one read at a
        time beside the build), the ready index's if the build ended meanwhile, or why not
        (`index_unanswered`: the loaded capture answers)."""
        if (building := self.building) is not None:
            try:
                return await trio.to_thread.run_sync(answer, building, message, limiter=self._partial_reads)
            except DiagdError as exc:
                if self.stored is None or not exc.details.get("index_unanswered"):
                    raise
        if self.stored is not None:  # built meanwhile (the folder renamed under the read)
            return await ready(message)
        raise DiagdError(ErrorCode.NOT_FOUND, "the index is not being built, or holds no frame yet",
                         index_unanswered=True)

    async def _seams(self, stored: Stored, numbers: list[int]) -> dict[int, str]:
        """The seam frames among these (a chunked build's: index/stitch.py), with why."""
        if not stored.meta.get("seam_frames"):
            return {}
        return await trio.to_thread.run_sync(query.seams, stored.path, numbers)

    @staticmethod
    def _seam_note(stored: Stored, listed: int) -> str:
        how = query.chunked(stored.meta)
        assert how is not None
        return query.SEAM_NOTE.format(listed=listed, **how)

    async def _narrowed(self, stored: Stored, display_filter: str, layers: tuple[str, ...]
                        ) -> tuple[narrowing.Narrowed, query.Matches]:
        """The frames a filter the index does not translate matches (index/narrowing.py), kept as the
        translated filters' matches are (at most MATCHES_KEPT: more are refused)."""
        import pyarrow as pa

        frames = int(stored.meta.get("frames") or 0)

        async def read() -> tuple[narrowing.Narrowed, query.Matches]:
            found = await narrowing.matching(self.capture, stored.path, frames, self.tshark_argv, display_filter,
                                             layers, MATCHES_KEPT)
            return found, query.Matches(len(found.numbers), numbers=pa.array(found.numbers, pa.int64()))
        return await self._narrowings.get((stored.path, display_filter), read)

    async def _matches_of(self, stored: Stored, where: str) -> query.Matches:
        """What is learnt of the frames meeting `where` (query.Matches), kept for the filter's next pages
        (a few filters, bounded)."""
        key = (stored.path, where)
        matches = self._matches.pop(key, None)
        if matches is None:
            matches = await trio.to_thread.run_sync(query.matching, stored.path, where, MATCHES_KEPT)
        self._matches[key] = matches
        while len(self._matches) > MATCH_LISTS_KEPT:
            self._matches.pop(next(iter(self._matches)))
        return matches

    async def _stats(self, paged: IndexStats) -> StatsAnswer:
        """A page of conversations, endpoints or I/O intervals (index/stats.py), paged in SQL; the answer
        says how many rows there are (`total`)."""
        stored = self._on_disk()
        if not self.answers(paged.question):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"the index holds no {paged.question.kind} of {paged.question.protocol}")
        if paged.question.kind == "srt":
            answer = await self._srt(stored, paged)
        else:
            answer = await (index_stats.io(stored, paged) if paged.question.kind == "io"
                            else index_stats.table(stored, paged, self.summary))
        self.store.touch(stored.path)
        return answer

    async def _srt(self, stored: Stored, paged: IndexStats) -> StatsAnswer:
        """A page of a protocol's response times (answers/index_srt.py: its messages read from a cut, paired), the
        whole answer kept for the next pages (a few), or why the index does not give it (the tool then asks
        the loaded capture, not this actor again for a cut)."""
        protocol, flt = paged.question.protocol or "", paged.question.display_filter

        async def read() -> StatsAnswer:
            answer = await index_srt.srt(self.capture, stored.path, stored.meta, self.tshark_argv, protocol, flt)
            if not answer["rows"] and "reason" not in answer:  # as the loaded capture says it
                answer["reason"] = paged.question.why_empty((await self.summary())["protocols"])
            return answer
        kept = await self._srts.get((stored.path, protocol, flt), read)
        rows = kept["rows"]
        return {**kept, "rows": rows[paged.offset:paged.offset + paged.limit], "total": len(rows)}

    async def _timeline(self, message: Timeline) -> TimelineAnswer:
        """Values of fields the index holds, per frame holding any of them (the timeline's own filter)."""
        stored = self._on_disk()
        fields = timelines.columns(message.fields)
        if fields is None or not self.answers(message):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "the index holds not every one of these fields",
                             index_unanswered=True)
        asked = [(f, col) for f, col in fields if f != "frame.number"]
        where = timelines.where(message)
        assert where is not None  # self.answers
        name = message.sort_by or ""
        by = dict(fields).get(name) if name else None
        if by is None:  # frame order: a page cut from the matching frames' numbers (kept for the next page)
            matches = await self._matches_of(stored, where)
            total = matches.total
            rows = await trio.to_thread.run_sync(query.timeline_page, stored.path, asked, where, matches,
                                                 message.offset, message.limit)
        else:
            total, rows = await trio.to_thread.run_sync(query.timeline, stored.path, asked, where, message.offset,
                                                        message.limit, by, MAX_SORTED_ROWS)
        self.store.touch(stored.path)
        if by is not None and query.sort_order(by) is None:  # sorted here (sort_key), within the row limit
            if total > MAX_SORTED_ROWS:
                raise DiagdError(ErrorCode.OUTPUT_TOO_LARGE,
                                 f"sort_by needs every matching frame: {total} match, the limit is "
                                 f"{MAX_SORTED_ROWS}; narrow display_filter or drop sort_by", total=total)
            rows = sorted(rows, key=lambda r: sort_key(r.get(name)))[message.offset:message.offset + message.limit]
        result: TimelineAnswer = {"total": total, "total_exact": True, "rows": rows,
                                  "has_more": message.offset + len(rows) < total, "served_by": "index"}
        seams = await self._seams(stored, [row["frame.number"] for row in rows if "frame.number" in row])
        if seams:
            may_differ = sorted(field for field, col in asked if col.name not in query.PER_FRAME)
            for row in rows:
                if row.get("frame.number") in seams and may_differ:
                    row["provisional"] = may_differ
            if may_differ:
                result["note"] = self._seam_note(stored, len(seams))
        if filter_note := query.filter_note(stored.meta):  # the timeline's own filter (its fields' frames) too
            result["note"] = "; ".join(x for x in (filter_note, result.get("note")) if x)
        if not total:
            result["hint"] = (f"no frame matches display_filter {message.display_filter!r}" if message.display_filter
                              else "the capture holds no frames")
        elif not rows:
            result["hint"] = f"offset {message.offset} is past the last of {total} matching frames"
        return result

    def working(self) -> bool:
        # A 10 GB capture's build outlasts the idle timeout, as an NGAP reading may: neither is cut short.
        return not self.done.is_set() or self.ngap.reading or self._srts.busy or self._narrowings.busy

    def statistics(self) -> dict[str, Any]:
        stored = self.stored
        state = ("failed" if self.error else "ready" if stored else "queued" if self.queued
                 else "building" if self._located.is_set() else "locating")
        out: dict[str, Any] = {"path": str(self.capture), "state": state, "frames_indexed": self.frames_indexed}
        if stored is not None:
            out |= stored.describe()
        return out
