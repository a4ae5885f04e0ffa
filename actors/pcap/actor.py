"""The pcap actor: warm `sharkd` workers per capture (pool.py), on Wireshark's own dissectors.

Actor key: the file version (device, inode, size, mtime) + decode-as rules + preferences, so the
same file opened with the same decoding by any client (any path or link) shares its workers. A
worker loads the file once and answers filters, frame trees and follows from memory; a second one
serves a busy capture; plain tshark is used where it is the right tool (a new filter's first
matches, sub-capture export with `-w`, timeline values with `-T fields`, capinfos for the count and
time span). Loaded captures are bounded by count and memory (LRU eviction) and expire when idle.

The actor owns one `CaptureSession` (session.py: the pool, passes and caches of the capture) and
serves each message by fetching through it and shaping with the answer builders (answers.py,
stats.py, text.py), which never see the actor.

Answers are what Wireshark's command-line tools print for the same question, and `include_command`
shows that command: timeline values come from `tshark -T fields` itself (the protocol tree's filter
strings differ from it for hex widths, bytes and times), frame text is rendered as `tshark -V` renders
it, the time span is capinfos' own text.
"""

from __future__ import annotations

import re
from typing import Any

import structlog
import trio

from diagd.actors._subprocess import RunHead, head
from diagd.actors.base import Actor, ActorState, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap import ngap as ngap_summary
from diagd.actors.pcap.answer_types import DetailAnswer, FramesAnswer
from diagd.actors.pcap.answers import answers, stats, text
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.passes import Cores, EarlyNumbers, EarlyRows, Page
from diagd.actors.pcap.engine.pool import CaptureState, Headroom, Launch
from diagd.actors.pcap.engine.session import CaptureSession, check_length
from diagd.actors.pcap.messages import (
    Check,
    Detail,
    Export,
    Follow,
    Frames,
    Info,
    NgapProcedures,
    NgapSessions,
    PacketList,
    PduSessions,
    Stats,
    TextSearch,
    Timeline,
    cache_key,
)
from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.sharkd import Sharkd
from diagd.actors.pcap.shark.wireshark import Digests

log = structlog.get_logger("diagd.pcap")

KIND = "pcap"
_STATES = {CaptureState.LOADING: ActorState.STARTING, CaptureState.FAILED: ActorState.FAILED,
           CaptureState.STOPPED: ActorState.STOPPED, CaptureState.READY: ActorState.IDLE}


class PcapActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.2)
    # Calls on one capture run together: they share its sharkd workers (pool.py), so a frame tree
    # is not queued behind another call's filter pass when a second worker is free.
    concurrency = 8

    def __init__(self, resource: str, settings: CaptureSpec, *, max_workers: int = 2,
                 headroom: Headroom = lambda: None, cores: Cores | None = None, launch: Launch = Sharkd.start,
                 early_numbers: EarlyNumbers | None = None, early_rows: EarlyRows | None = None,
                 run_head: RunHead = head, memory_budget: int | None = None, digests: Digests | None = None,
                 wireshark: Wireshark | None = None) -> None:
        super().__init__(resource, settings)
        self.spec = settings
        self.session = CaptureSession(settings, max_workers=max_workers, headroom=headroom, cores=cores,
                                      launch=launch, early_numbers=early_numbers, early_rows=early_rows,
                                      run_head=run_head, memory_budget=memory_budget, digests=digests,
                                      wireshark=wireshark)

    async def start(self, nursery: trio.Nursery) -> None:
        await self.session.start(nursery)

    async def stop(self) -> None:
        await self.session.close()

    @property
    def worker_state(self) -> ActorState:
        """STARTING while the capture loads, IDLE when a worker is loaded and alive, FAILED after a
        failed load, STOPPED when every worker died."""
        return _STATES[self.session.state]

    def statistics(self) -> dict[str, Any]:
        return self.session.statistics()

    def __repr__(self) -> str:
        return f"<PcapActor {self.session!r}>"

    # -- requests ---------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        # Equal questions share one answer: a message is its own cache key (less stop_at, a moment).
        key = cache_key(request.message)
        cached = self.session.cached_answer(key) if key is not None else None
        if cached is not None:
            return {**cached, "cached": True}
        async with self.session.foreground():
            result = await self._answer(request)
        if key is None or result.get("served_by", "sharkd") != "sharkd" or result.get("total_exact") is False:
            return {**result, "cached": False}  # a stand-in answer while loading: ask the worker next time
        if result.get("stopped_because") == "time_budget":
            return {**result, "cached": False}  # another call may have the time to finish it
        self.session.keep_answer(key, result)
        return {**result, "cached": False}

    async def _frames(self, request: Request, message: Frames) -> FramesAnswer:
        """Fetched here, shaped by answers.frames (which never calls back)."""
        session, display_filter = self.session, message.display_filter
        if session.state is CaptureState.LOADING and display_filter and not session.raceable(
                display_filter, message.offset, message.limit, message.kinds):
            # A filter only a two-pass read answers, asked while sharkd loads: one tshark pass beside it.
            check_length(display_filter)
            total, rows = await answers.frames_while_loading(session, request, message)
            page = Page(total, True, rows, "tshark (capture still loading)")
        else:
            page = await session.page(request, display_filter, message.offset, message.limit, message.kinds)
        present = None
        if not page.total and display_filter and session.tshark_only is None:  # the protocols are sharkd's
            present = await session.protocols(request)
        sbi = (await session.sbi_hint() if present is not None and message.display_filter
               and answers.needs_sbi_hint(message.display_filter, present) else None)
        result = answers.frames(message, page, present, session.cat, sbi)
        if session.tshark_only is not None and "note" in result:  # no sharkd page will come: say why
            kept = re.split(r"[;:] the same call again", result["note"])[0]
            result["note"] = f"{kept}; {session.tshark_only.message}"
        return result

    async def _detail(self, request: Request, message: Detail) -> DetailAnswer:
        numbers = sorted(set(message.frame_numbers))
        trees = dict(zip(numbers, await self.session.trees_of(request, numbers), strict=True))
        assert self.session.cat is not None  # loaded when the session started
        return text.detail(self.session.cat, message, trees)

    async def _answer(self, request: Request) -> dict[str, Any]:
        session = self.session
        match request.message:
            case Info() as message:
                return message.reply(await answers.info(session, request))
            case Check(display_filter=display_filter) as message:
                await session.check_filter(request, display_filter)
                return message.reply({"valid": True})
            case Frames() as message:
                return message.reply(await self._frames(request, message))
            case Timeline() as message:
                return message.reply(await answers.timeline(session, request, message))
            case Detail() as message:
                return message.reply(await self._detail(request, message))
            case TextSearch() as message:
                return message.reply(await text.text_search(session, request, message))
            case Follow() as message:
                return message.reply(await answers.follow(session, request, message))
            case PacketList() as message:
                return message.reply(await answers.packet_list(session, request, message))
            case Export() as message:
                return message.reply(await answers.export(session, message))
            case NgapSessions(display_filter=display_filter) as message:
                model = await answers.ngap_model(session, request, display_filter)
                return message.reply(ngap_summary.ue_sessions(model, filtered=bool(display_filter)))
            case PduSessions(display_filter=display_filter) as message:
                model = await answers.ngap_model(session, request, display_filter)
                return message.reply(ngap_summary.pdu_sessions(model, filtered=bool(display_filter)))
            case NgapProcedures(display_filter=display_filter) as message:
                model = await answers.ngap_model(session, request, display_filter)
                return message.reply(ngap_summary.procedures(
                    model, filtered=bool(display_filter),
                    core_rows=await answers.core_rows(session) if model.pdus else []))
            case Stats() as message:
                return message.reply(await stats.answer(session, request, message))
        raise unhandled("pcap", request)
