"""The pcap back end's own state, shared by its tools: settings, capture specs, the loaded captures.

One `PcapBackend` per daemon, used only from tool handlers (Trio tasks of one thread): its tables
change only between checkpoints, so concurrent calls never see them half-updated. Which captures
stay loaded, and which one is evicted for a new one, is captures.py's rule.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NotRequired, cast

import structlog
import trio
from typing_extensions import TypedDict

from diagd.actors._paths import create_new, made_stem, resolve_allowed
from diagd.actors.base import ProgressFn
from diagd.actors.message import Message, ReplyT
from diagd.actors.pcap.actor import KIND, PcapActor
from diagd.actors.pcap.engine.capture import CaptureSpec
from diagd.actors.pcap.engine.captures import Evict, LoadedCaptures
from diagd.actors.pcap.engine.passes import Cores
from diagd.actors.pcap.index import filters
from diagd.actors.pcap.index.ngap_pdus import Decoding
from diagd.actors.pcap.index.store import IndexStore, decoding_digest, tshark_identity
from diagd.actors.pcap.index_actor import KIND as INDEX_KIND
from diagd.actors.pcap.index_actor import IndexActor
from diagd.actors.pcap.messages import (
    Frames,
    IndexNgapProcedures,
    IndexNgapSessions,
    IndexPduSessions,
    NgapProcedures,
    NgapSessions,
    PduSessions,
    Stats,
    Timeline,
)
from diagd.actors.pcap.replies import Source
from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.shark import decode_check
from diagd.actors.pcap.shark import tshark as _cold
from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.wireshark import Catalogue, Digests, decode_as_entries, file_identity, parse_decode_as
from diagd.actors.pcap.warm import first_page, standby
from diagd.actors.runtime import ActorRef, BackendConfig, Runtime
from diagd.actors.tooling import CallContext, caller_cwd, caller_selects
from diagd.protocol import utc
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.pcap")

# The capture spec the running call's handler built from its arguments (a call is one Trio task):
# the masking guard reads the identities of that very capture without hashing and probing it again.
_built: ContextVar[tuple[dict[str, Any], CaptureSpec] | None] = ContextVar("pcap_spec_built", default=None)
# When a new capture's standby of a template only a loaded capture runs starts: after the text
# template's second one (standby.REPLACE_AFTER_S), so that no two tshark start-ups overlap.
LATER_STANDBY_S = 2 * standby.REPLACE_AFTER_S


class ShownSource(Source):
    """An answer's source; pcap_timeline's names its fields too."""

    fields: NotRequired[list[str]]


class _Hashed(TypedDict, total=False):
    sha256: str
    sha256_pending: bool


class _Named(TypedDict, total=False):
    display_filter: str
    fields: list[str]


class _Tail(TypedDict, total=False):
    live: dict[str, Any]
    equivalent_command: list[str]
    equivalent_command_line: str


class PcapBackend:
    """Daemon-side state of the pcap back end: settings, capture keys, the loaded captures, what its tshark said."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.captures = LoadedCaptures()
        self.cores = Cores()  # the daemon's cores, shared by every capture's passes and early tshark runs
        self._parsed: tuple[BackendConfig, PcapSettings] | None = None
        # What the daemon's tshark has said (facts.py): its field catalogue, capinfos' counts per file
        # version, the decode-as probes; handed to the tools, the captures' sessions and the warm tsharks.
        self.wireshark = Wireshark(kept=runtime.state_dir)
        # The warm tshark each capture's early passes run on (standby.py): the actors ask it directly.
        self.warm = standby.WarmTsharks(runtime, self.wireshark)
        self.digests = Digests()  # each capture file version's sha256, hashed once (its sessions' too)
        self._beginning: set[str] = set()  # captures whose actor `begin` is starting in the background
        # Index builds at once, daemon-wide: each is a tshark whose memory grows with its capture
        # (~0.9-2.8 GB for 1 GB, docs/pcap-index.md); the others wait, said `queued`.
        self.index_builds = trio.CapacityLimiter(1)
        # Readings of a capture cut beside its index at once, daemon-wide (a narrowed filter, response times, the
        # NGAP model and rows): each a tshark or sharkd under a 1.28 GB bound (index/workspace.py).
        self.index_cuts = trio.CapacityLimiter(1)

    @property
    def settings(self) -> PcapSettings:
        """The [pcap] table as it is now: `diagd reload` applies at once. Parsed once per config
        (a reload gives a new BackendConfig object); a table that does not parse never gets here:
        the start and `diagd reload` refuse it (`check_reload`)."""
        config = self.runtime.config()
        if self._parsed is None or self._parsed[0] is not config:
            self._parsed = (config, PcapSettings.from_config(config, self.runtime.state_dir))
        return self._parsed[1]

    def check_reload(self, old: BackendConfig, new: BackendConfig) -> list[dict[str, Any]]:
        """Refuse a broken [pcap] table (DiagdError: the old config stays); every change applies at once."""
        PcapSettings.from_config(new, self.runtime.state_dir)
        return []

    async def spec_for(self, args: dict[str, Any], *, force_prefs: dict[str, str] | None = None) -> CaptureSpec:
        settings = self.settings
        config = self.runtime.config()
        # What diagd wrote itself (sub-captures, packet lists, and the exports of the groups the client
        # selected too: serial sessions) can be analysed next without widening allowed_dirs; the rest
        # of diagd's own directories never (an empty allow-list means no restriction, except there).
        shared = [str(settings.output_dir), *(d for g, d in config.exports_dirs.items() if caller_selects(g))]
        hints = {d: f"the exports of the {g!r} tool group: a client that selected {g!r} too reads them "
                    f"(diagd mcp --tools pcap,{g})" for g, d in config.exports_dirs.items() if not caller_selects(g)}
        readable = (*settings.allowed_dirs, *shared) if settings.allowed_dirs else ()
        named = str(args["pcap_path"])
        # `capture:<id>` (a back end's declared reference): the file it names now, checked as any path.
        resolved = await self.runtime.resolve_reference(named)
        path = resolve_allowed(resolved.path if resolved else named, readable, what="capture", cwd=caller_cwd(),
                               private_dirs=config.private_dirs, shared_dirs=shared, hints=hints)
        profile_name = args.get("profile")
        profile: dict[str, Any] = {}
        if profile_name:
            if profile_name not in settings.profiles:
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown profile {profile_name!r}",
                                 profiles=sorted(settings.profiles))
            profile = settings.profiles[profile_name]
        decode_as = [*profile.get("decode_as", []), *_as_list(args.get("decode_as"))]
        prefs = {**{k: str(v) for k, v in profile.get("preferences", {}).items()}, **(force_prefs or {})}
        applied: list[str] = []
        checks: list[decode_check.PortCheck] = []
        if decode_as:
            # The field catalogue (a fresh daemon reads it in ~1 s) is needed here only to parse rules:
            # a call without any (a restarted daemon's first answer from an index) does not wait for it.
            cat = await self.catalogue()
            # Refused before loading:
            parsed = [(rule, *parse_decode_as(rule, cat)) for rule in dict.fromkeys(decode_as)]
        identity, size = await file_identity(path)
        if size < _cold.BIG_FILE:  # every answer names it; a big file's is read after its first answer's head start
            self.digests.begin(path, identity)
        # Every tool refuses a file that is no capture before a worker is started for it.
        await self.wireshark.capinfos.check_capture(path, identity, size)
        if decode_as:
            # A port rule to HTTP/2 or HTTP goes only where the conversations carry it (decode_check.py).
            applied, checks = await decode_check.check(path, identity, parsed, cat, self.wireshark.probes)
        spec = CaptureSpec(path=path, identity=identity, decode_as=tuple(applied),
                           preferences=tuple(sorted(prefs.items())), size=size, decode_checks=tuple(checks),
                           reference=named if resolved else None, about=resolved.about if resolved else None)
        if force_prefs is None:
            _built.set((args, spec))
        return spec

    async def ask(self, ctx: CallContext, spec: CaptureSpec, message: Message[ReplyT]) -> ReplyT:
        """Start the capture's actor (making room for it under max_loaded: captures.py), then ask it.
        The capture is in use, never evicted, until the answer is back."""
        return await self._start_and_ask(spec, message, ctx.progress)

    def is_started(self, spec: CaptureSpec) -> bool:
        """Whether the capture's actor runs, or a background start of it (`begin`) is under way."""
        return spec.key in self._beginning or self.runtime.find(KIND, spec.key) is not None

    def begin(self, spec: CaptureSpec, message: Message[Any]) -> None:
        """Start the capture's actor and ask it `message` in the background, for a call whose answer
        needs nothing of it yet (pcap_info on a big fresh capture): the actor's start (sharkd, standbys,
        the summary pass) then runs beside that answer instead of before it. A failure is logged; the
        next call that waits for the capture meets it with its coded error."""
        async def start() -> None:
            try:
                await self._start_and_ask(spec, message, None)
            except Exception as exc:  # a background start must not take the daemon down
                log.warning("background capture start failed", capture=str(spec.path), error=str(exc))
            finally:
                self._beginning.discard(spec.key)
        # Begun from now: the next call on it waits for that start (ask), instead of beginning another.
        self._beginning.add(spec.key)
        trio.lowlevel.spawn_system_task(start)

    async def _start_and_ask(self, spec: CaptureSpec, message: Message[ReplyT], progress: ProgressFn | None
                             ) -> ReplyT:
        settings = self.settings
        deadline = trio.current_effective_deadline()
        while (room := self.captures.room_for(spec.key, self._loaded(), settings.max_loaded)) is not True:
            if isinstance(room, Evict):
                self._evict(room)
            else:
                await self.captures.wait_for_change(spec.key, settings.max_loaded, deadline)
        with self.captures.in_call(spec.key):
            if settings.warm_tshark and self.runtime.find(KIND, spec.key) is None:
                # A new capture: its first page, a new filter's first matches and a text search are
                # early passes (first_page.early_rows, early_numbers, early_text) a standby may run (a
                # template already warm is only marked as used).
                argv = _cold.base_argv(spec.path, spec.decode_as, spec.preferences)
                # One only a loaded capture needs starts later: three tshark start-ups at once would
                # slow the one the first call waits for (on 2 cores).
                for early, first_call in first_page.early_argvs(argv):
                    if (found := standby.template_of(early)) is not None:
                        await self.warm.start(found[0], settings.idle_timeout_s, capture_own=True,
                                              after_s=0.0 if first_call else LATER_STANDBY_S)
                # A first timeline (of any field list) is rarer than a first page: its standby starts
                # between the first call's two and the loaded capture's one.
                if (found := standby.template_of(first_page.timeline_argv(argv))) is not None and (
                        any_list := standby.any_fields_of(found[0])) is not None:
                    await self.warm.start(any_list[0], settings.idle_timeout_s, capture_own=True,
                                          after_s=standby.REPLACE_AFTER_S)
            ref = await self.runtime.start(
                KIND, spec.key, lambda: PcapActor(spec.key, spec, max_workers=self.settings.workers_per_capture,
                                                  headroom=self.headroom, cores=self.cores,
                                                  run_head=self.warm.runner(enabled=settings.warm_tshark,
                                                                            idle_timeout_s=settings.idle_timeout_s),
                                                  memory_budget=self.settings.max_memory_mb * 2**20,
                                                  digests=self.digests, wireshark=self.wireshark),
                idle_timeout_s=lambda: self.settings.idle_timeout_s)  # follows a reload
            for victim in self.captures.over_memory(self._held(), settings.max_memory_mb * 2**20, keep=spec.key):
                self._evict(victim)
            return await self.runtime.ask(ref, message, progress=progress)

    @property
    def index_store(self) -> IndexStore:
        return IndexStore(self.runtime.state_dir / "index", self.settings.index_max_mb * 2**20)

    async def index(self, spec: CaptureSpec) -> ActorRef:
        """The actor of the capture's persistent index (index_actor.py): started, and its build begun
        if it is on no disk, when it is not running yet."""
        about = spec.about or {}
        if about.get("running") or about.get("status") in ("starting", "running"):
            raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                             f"{spec.reference} is still capturing: an index is of a capture that has ended (its "
                             "file grows, and each version would be a new build); stop it first",
                             reference=spec.reference)
        store = self.index_store
        decoding = decoding_digest(spec.decode_as, spec.preferences, tshark_identity())

        async def locate() -> Path:
            known = store.by_identity(spec.identity, decoding)  # no hashing when this file version was seen
            if known is None:
                sha256, _ = await self.digests.sha256(spec.path, spec.identity)
                known = store.path_for(sha256, decoding)
            return known

        argv = _cold.base_argv(spec.path, spec.decode_as, spec.preferences)
        return await self.runtime.start(
            INDEX_KIND, spec.key,
            lambda: IndexActor(spec.key, spec.path, argv, store, locate,
                               remember=lambda path: store.remember(spec.identity, decoding, path),
                               builds=self.index_builds, cuts=self.index_cuts, in_use=self._indexes_in_use,
                               chunk_bytes=self.settings.index_chunk_mb * 2**20,
                               segment_frames=self.settings.index_segment_frames),
            idle_timeout_s=lambda: self.settings.idle_timeout_s)

    def status_section(self) -> dict[str, list[dict[str, Any]]]:
        """`diagd status`: every capture index on disk, whether an actor answers from it now or not."""
        in_use = self._indexes_in_use()
        rows = []
        for stored in self.index_store.listing():
            described = stored.describe()
            rows.append({"capture": stored.capture, "frames": described.get("frames"),
                         "disk_bytes": stored.disk_bytes(), "age_s": described.get("age_s"),
                         "last_used_s_ago": described.get("last_used_s_ago"), "in_use": stored.path in in_use,
                         "index": stored.path.name[:12] + "…" + stored.path.name[-13:]})
        return {"indexes": rows}

    def _indexes_in_use(self) -> frozenset[Path]:
        return frozenset(ref.actor.stored.path for ref in self.runtime.actors(INDEX_KIND)
                         if isinstance(ref.actor, IndexActor) and ref.actor.stored is not None)

    def index_version(self, ref: ActorRef) -> str | None:
        """The tshark version that built a ready index (None: not built yet)."""
        return ref.actor.tshark_version if isinstance(ref.actor, IndexActor) else None

    async def ready_index(self, spec: CaptureSpec) -> ActorRef | None:
        """The capture's index actor when its index is ready to answer: the running one, or one started
        now for an index a daemon built before and that is still on disk (None: none, or still being
        found or built: the call is answered without it, never kept waiting for a hash or a build)."""
        ref = self.runtime.find(INDEX_KIND, spec.key)
        if ref is None:
            store = self.index_store
            if store.by_identity(spec.identity, decoding_digest(spec.decode_as, spec.preferences,
                                                                tshark_identity())) is None:
                return None
            ref = await self.index(spec)  # found by its file version: located at once, no build
            actor = ref.actor
            if isinstance(actor, IndexActor):
                with trio.move_on_after(1.0):
                    await actor.wait_located()
        actor = ref.actor
        if (ref.accepting and isinstance(actor, IndexActor) and actor.located and actor.stored is not None
                and actor.store.ready(actor.stored.path) is not None):
            return ref
        return None

    async def index_for(self, spec: CaptureSpec, message: Frames | Stats | Timeline) -> ActorRef | None:
        """The capture's ready index actor when it answers this question exactly (IndexActor.answers):
        None sends it to sharkd."""
        ref = await self.ready_index(spec)
        if ref is not None and isinstance(ref.actor, IndexActor) and ref.actor.answers(message):
            return ref
        return None

    def building_index(self, spec: CaptureSpec) -> ActorRef | None:
        """The capture's index actor while its build runs and has indexed some frames (index/partial.py:
        pages within them), unless sharkd holds the capture (its exact pages and totals come first)."""
        ref = self.runtime.find(INDEX_KIND, spec.key)
        if ref is None or not ref.accepting or not isinstance(ref.actor, IndexActor) or ref.actor.building is None:
            return None
        loaded = self._sessions().get(spec.key)
        return None if loaded is not None and loaded.session.loaded else ref

    async def ask_index(self, ref: ActorRef, message: Message[ReplyT], progress: ProgressFn | None
                        ) -> tuple[ReplyT, str | None] | None:
        """`message` answered by a capture's index actor, and the tshark that built the index (None while it
        is built); None when the actor says the loaded capture answers instead (`index_unanswered`: a file it
        cannot cut, a page past what a build has indexed so far, a question asked as its build ended...)."""
        try:
            answer = await self.runtime.ask(ref, message, progress=progress)
        except DiagdError as exc:
            if exc.details.get("index_unanswered"):
                return None
            raise
        return answer, self.index_version(ref)

    async def ngap_from_index(self, args: dict[str, Any], spec: CaptureSpec, message: Message[ReplyT],
                              progress: ProgressFn | None) -> tuple[ReplyT, str] | None:
        """The UE contexts, their procedures or the PDU sessions from the capture's ready index
        (index/ngap_views.py: sharkd reads only the SCTP frames cut from the file, once, kept beside the
        index; the procedures' PFCP and SBI rows, tshark those frames cut), of all frames or of those a
        filter the index translates selects (index/filters.py), and the tshark that built the index. None
        when it has none (built by pcap_index, found by the file's decoding without the ngap_* tools'
        preferences, which change no indexed column NGAP's frames are chosen by) or cannot give it: the
        loaded capture answers then."""
        if (not isinstance(message, NgapSessions | PduSessions | NgapProcedures)
                or filters.to_sql(message.display_filter) is None):
            return None
        ref = await self.ready_index(await self.spec_for(args, force_prefs={}))
        if ref is None or not isinstance(ref.actor, IndexActor):
            return None
        entries = decode_as_entries(spec.decode_as, await self.catalogue()) if spec.decode_as else []
        decoding = Decoding(tuple(entries), spec.preferences)
        if ref.actor.ngap_unanswered(decoding) is not None:
            return None
        asking = (IndexNgapSessions if isinstance(message, NgapSessions) else
                  IndexNgapProcedures if isinstance(message, NgapProcedures) else IndexPduSessions)
        asked: Message[Any] = asking(decoding.decode_as_entries, decoding.preferences, message.display_filter)
        if (got := await self.ask_index(ref, asked, progress)) is None:
            return None
        answer, built_by = got[0], got[1] or "unknown"
        core = ("; tshark the PFCP, HTTP and HTTP/2 frames cut from it" if isinstance(message, NgapProcedures)
                else "")
        return cast("ReplyT", {**answer, "served_by": f"index (sharkd read the SCTP frames cut from the capture, "
                                                      f"once{core}; built by {built_by})"}), built_by

    def headroom(self) -> int:
        """What the memory budget still allows (a busy capture's second worker must fit in it)."""
        return self.settings.max_memory_mb * 2**20 - sum(self._held().values())

    def _sessions(self) -> dict[str, PcapActor]:
        """The running pcap actors by capture key."""
        found = {}
        for ref in self.runtime.actors(KIND):
            if ref.accepting and isinstance(ref.actor, PcapActor):
                found[ref.resource] = ref.actor
        return found

    def _loaded(self) -> set[str]:
        return set(self._sessions())

    def _held(self) -> dict[str, int]:
        """Bytes each loaded capture's sharkd workers hold now."""
        # Refreshed by each capture's pool after every request and load (pool._notify), read here without
        # calling into the session: the call path enters each module from one place (tests/test_call_path.py).
        return {key: actor.session.facts.held_bytes for key, actor in self._sessions().items()}

    def _evict(self, evict: Evict) -> None:
        ref = self.runtime.find(KIND, evict.key)
        if ref is not None:
            log.info("evicting capture", actor=ref.id, resource=evict.key, why=evict.why)
            self.runtime.stop(ref, reason=f"evicted ({evict.why})")
        self.captures.evicted_now(evict)

    async def source(self, spec: CaptureSpec, args: dict[str, Any], *, command: list[str] | None = None,
                     provisional: bool = False, display_filter: str | None = None,
                     fields: list[str] | None = None, built_by: str | None = None) -> ShownSource:
        """Where an answer came from. With include_command, the tshark command that prints the same
        rows: `command` is what follows the capture's own options (filter, output format), given by
        each tool; without it the display filter alone. A provisional answer (a fresh capture's
        first page) does not wait for the file's hash: sha256 is left out and sha256_pending is true
        until it is done (a 1 GB file takes seconds to hash, the page a fraction of one). An answer from a
        capture's index names the tshark that built it (`built_by`) and waits neither for the field
        catalogue nor for the hash: a restarted daemon's first index answer takes milliseconds."""
        version = built_by if built_by is not None else (await self.catalogue()).version
        hashed: _Hashed = {}
        if (provisional or built_by is not None) and self.digests.if_ready(spec.identity) is None:
            hashed["sha256_pending"] = True
        else:
            hashed["sha256"] = (await self.digests.sha256(spec.path, spec.identity))[0]
        named: _Named = {}
        if display_filter is not None:
            named["display_filter"] = display_filter
        if fields is not None:
            named["fields"] = fields
        tail: _Tail = {}
        if spec.reference is not None:
            tail["live"] = await self.reference_extent(spec)
        if args["include_command"]:
            argv = _cold.base_argv(spec.path, spec.decode_as, spec.preferences)
            if command is not None:
                argv += command
            elif display_filter:
                argv += ["-Y", display_filter]
            tail["equivalent_command"] = argv
            tail["equivalent_command_line"] = shlex.join(argv)
        return {"pcap_path": str(spec.path), **hashed, "profile": args.get("profile"), **spec.describe(),
                "tshark_version": version, **named, **tail}

    async def reference_extent(self, spec: CaptureSpec) -> dict[str, Any]:
        """What a `capture:<id>` answer covers: up to which frame and time, and whether it still grows."""
        facts = await self.wireshark.capinfos.capture_facts(spec.path, spec.identity, spec.size)
        about = dict(spec.about or {})
        end = facts.iso(facts.end)
        still = "the capture is still running" if about.get("running") else f"the capture has {about.get('status')}"
        return {"reference": spec.reference, **about, "up_to_frame": facts.packets, "up_to_time": end,
                "note": f"up to frame {facts.packets}, time {end or 'none (no frame yet)'}; {still}"}

    async def identity_source(self, args: dict[str, Any]) -> tuple[str, list[str]] | None:
        """(key, tshark argv) of the capture a call reads, decoded as the call decodes it."""
        if "pcap_path" not in args:
            return None
        built = _built.get()
        spec = built[1] if built is not None and built[0] is args else await self.spec_for(args)
        # ngap_* tools force null-deciphering, which identity collection always turns on: one key.
        prefs = [p for p in spec.preferences if p[0] != "nas-5gs.null_decipher"]
        key = f"{spec.identity}:{json.dumps([spec.decode_as, prefs])}"
        return key, _cold.base_argv(spec.path, spec.decode_as, spec.preferences)

    async def catalogue(self) -> Catalogue:
        """Wireshark's field catalogue, as the back end's `wireshark` read it once."""
        return await self.wireshark.catalogue()

    async def kinds(self, *expressions: str) -> tuple[tuple[str, str | None, str | None], ...]:
        """(name, type, protocol) of each name in these filters or field lists (Catalogue.kinds)."""
        return (await self.catalogue()).kinds(*expressions)

    def export_path(self, stem: str, suffix: str) -> Path:
        """A new file in the output dir, created here (never through a link, never over a file), named
        by diagd (the capture's stem in the safe alphabet, a time and a random part, `suffix`); the
        oldest exports beyond max_exports are removed."""
        settings = self.settings
        out = settings.output_dir
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = sorted(out.glob("*"), key=lambda p: p.stat().st_mtime)
        for old in existing[: max(0, len(existing) - settings.max_exports + 1)]:
            old.unlink(missing_ok=True)
        path = out / f"{made_stem(stem)}-{utc.compact()}-{os.urandom(3).hex()}{suffix}"
        os.close(create_new(path))
        return path


def search_deadline() -> float | None:
    """When a long scan stops to answer in time: the call's deadline less a margin for the answer
    (15 % of the time left, at least a second); None when the call has no deadline."""
    deadline = trio.current_effective_deadline()
    if math.isinf(deadline):
        return None
    now = trio.current_time()
    return deadline - max(1.0, 0.15 * (deadline - now))


def _as_list(value: Any) -> list[str]:
    if value is None or value == "":
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
