"""A warm tshark: an early-stopping pass (a fresh capture's first page, a new filter's first matches, a
timeline's first rows) without tshark's start-up on its path.

tshark spends 0.15-0.25 s of CPU starting (registering every dissector, reading its configuration)
before it reads a frame; on a first page that start is most of the wait. A standby is that tshark
started ahead of need. It stops, initialised, inside a Lua script of diagd's (`-X lua_script:`) that
waits for a line on stdin. The two things a run needs that are not known when it starts reach it
through stand-ins that tshark reads only after the script returns:

- `-Y ${diagd_page}`: a display-filter macro, defined in the `dfilter_macros` file of the standby's
  own WIRESHARK_CONFIG_DIR, written just before the go (tshark loads its settings after the Lua
  scripts, then compiles -Y);
- `-r <dir>/capture`: a symbolic link, made to point at the capture before the go (tshark opens its
  file after compiling the filter).

Every other word of the argv is the cold run's own (`template_of`: the argv with its file and filter
taken out is the standby's *template*, its actor's key): a run is warm only where a standby of the
very same template waits, so its output is the cold run's by construction, and the differential
test holds it to the cold run's line for line on every corpus capture. What stays cold: a filter the
macro cannot carry unchanged (can_serve), an argv without exactly one file and one filter, a template
whose first run started its standby (the next run of it is warm). tshark takes `-e` only on its command
line, so a timeline's field list would be part of its template and its first timeline cold; instead a
list of fields whose text a Lua script can make (fields_standby.py) runs on the template of any field
list (FIELDS stands for the list; the run brings it: any_fields_of), one of a capture's own.

A standby serves one run and ends (stopped once the lines are in, reaped, its directory removed). Its
actor (one per template) starts the next one REPLACE_AFTER_S later, on the Trio clock, so its start-up
does not take the core the just-opened capture's load needs. A text template (`-V`: text searches,
which page through a capture by offset, one call right after the other) keeps TEXT_DEPTH standbys
waiting, so that the next page's run finds one while the last one's replacement is not started yet
(measured: the search of offset 200 right after offset 0 took 0.33-0.36 s cold, 0.25 s warm), and
replaces them sooner (TEXT_REPLACE_AFTER_S).

An idle standby holds ~66 MB of its own (and maps libwireshark, shared with sharkd); the back end
keeps MAX_STANDBYS templates warm at most and `[pcap] warm_tshark = false` turns them off. Over it,
the least recently used one stops, a timeline's field list before a capture's own four (started when
a capture opens: its first pages' rows, a new filter's frame numbers, its text, any field list's): an
agent trying field lists must not push the text template out, as a bench run showed (its next search ran
cold, 0.35 s for 0.22).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors import system
from diagd.actors._subprocess import Head, RunHead, close_pipes, head, head_of, open_process, stop_process
from diagd.actors.base import Actor, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.shark.tshark import FIELDS_OPTIONS
from diagd.actors.pcap.warm import fields_standby
from diagd.actors.runtime import ActorRef, Runtime
from diagd.protocol.errors import DiagdError

log = structlog.get_logger("diagd.pcap")

KIND = "tshark-standby"
MAX_STANDBYS = 5  # templates kept warm at once: a capture's four and one field list
REPLACE_AFTER_S = 1.0  # after a run, before the next standby starts
TEXT_DEPTH = 2  # standbys a text template keeps waiting (one otherwise)
# A text template's replacement starts sooner: its runs come in bursts (a search's pages, a search
# right after a first page), and its call's tail after the run is short (trees of the frames not ruled
# out). Measured in bench/pcap.py's sequence (two pages, a new filter's first page, a search of it):
# the third search 0.37 s on a cold tshark with REPLACE_AFTER_S, 0.24-0.27 s with this (the pages
# 0.20-0.24 s either way; 0.05 s slowed the second page by its replacement's start-up).
TEXT_REPLACE_AFTER_S = 0.3
MAX_UNSURE_LISTS = 64  # field lists remembered as not printable by the standby of any list
MAX_FAILURES = 3  # standbys in a row that ended before their run: then no more (a tshark without Lua)
MACRO = "diagd_page"
# Waits for diagd's go; at EOF (diagd went away) the standby ends instead of reading a capture.
_LUA = 'if io.read("*l") == nil then os.exit(1) end\n'
# As sharkd's config (session.py): no name resolution, as -n says too.
_PREFERENCES = "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n"


FILE, FILTER = "\0capture", "\0filter"  # the stand-ins' places in a template
FIELDS = "\0fields"  # where a template of any field list (fields_standby.py) takes its `-e` list


@dataclass(frozen=True)
class Template:
    """A cold argv without its file and its filter (FILE and FILTER stand where they were)."""

    argv: tuple[str, ...]

    @property
    def key(self) -> str:
        """Its standby actor's resource name."""
        return hashlib.sha256("\0".join(self.argv).encode()).hexdigest()[:12]

    def shown(self) -> str:
        return " ".join({FILE: "<capture>", FILTER: "<filter>", FIELDS: "<fields>"}.get(a, a) for a in self.argv)

    @property
    def is_text(self) -> bool:
        """A text pass (-V): text searches page through a capture, one call right after the other."""
        return "-V" in self.argv

    @property
    def depth(self) -> int:
        """How many standbys of it wait at once."""
        return TEXT_DEPTH if self.is_text else 1

    @property
    def replace_after_s(self) -> float:
        """How long after a run its replacement starts."""
        return TEXT_REPLACE_AFTER_S if self.is_text else REPLACE_AFTER_S

    @property
    def any_fields(self) -> bool:
        """A template of any field list: its run gets the list (fields_standby.py)."""
        return FIELDS in self.argv


def any_fields_of(template: Template) -> tuple[Template, tuple[str, ...]] | None:
    """(the template of any field list, the field names) of a `tshark -T fields` template whose options
    are tshark.fields_argv's without a column preference, in a single pass (the script writes what the
    one pass sees); None for any other."""
    argv = template.argv
    if "-T" not in argv or "-2" in argv:
        return None
    at = argv.index("-T")
    options, rest = argv[at:at + len(FIELDS_OPTIONS)], argv[at + len(FIELDS_OPTIONS):]
    if options != FIELDS_OPTIONS or not rest or len(rest) % 2 or set(rest[::2]) != {"-e"}:
        return None
    return Template((*argv[:at], "-T", "fields", FIELDS)), rest[1::2]


def template_of(argv: list[str]) -> tuple[Template, str, str] | None:
    """(template, file, filter) of a tshark argv a standby can run, else None: exactly one `-r FILE` and
    one `-Y FILTER` (can_serve's), no Lua script of its own."""
    if not argv or argv[0] != "tshark" or "-X" in argv or argv.count("-r") != 1 or argv.count("-Y") != 1:
        return None
    at_file, at_filter = argv.index("-r") + 1, argv.index("-Y") + 1
    if at_file >= len(argv) or at_filter >= len(argv) or not can_serve(argv[at_filter]):
        return None
    template = list(argv)
    template[at_file], template[at_filter] = FILE, FILTER
    return Template(tuple(template)), argv[at_file], argv[at_filter]


def can_serve(display_filter: str) -> bool:
    """Whether a macro carries `display_filter` to tshark's compiler unchanged: printable ASCII (the
    macro table refuses a control character or a byte over 0x7e, even escaped), no `$` (macro syntax)."""
    return bool(display_filter) and display_filter.isascii() and display_filter.isprintable() \
        and "$" not in display_filter


def uat_string(text: str) -> str:
    """`text` (can_serve's) as a quoted UAT field: `"` and `\\` as \\xNN, as Wireshark's own UAT writer
    does, so no filter can end the field."""
    return '"' + text.replace("\\", "\\x5c").replace('"', "\\x22") + '"'


class Standby:
    """One waiting tshark and its private directory (Lua script, config, the capture link)."""

    def __init__(self, proc: trio.Process, directory: Path) -> None:
        self.proc = proc
        self.directory = directory

    @classmethod
    async def start(cls, template: Template) -> Standby:
        directory = Path(tempfile.mkdtemp(prefix="diagd-standby-"))  # 0700: only this user reaches the link
        try:
            (directory / "standby.lua").write_text(fields_standby.LUA if template.any_fields else _LUA)
            (directory / "preferences").write_text(_PREFERENCES)
            stand_ins = {FILE: [str(directory / "capture")], FILTER: [f"${{{MACRO}}}"],
                         FIELDS: ["-E", "header=n", "-e", fields_standby.NONE_FIELD]}
            argv = [template.argv[0], "-X", f"lua_script:{directory / 'standby.lua'}",
                    *(word for a in template.argv[1:] for word in stand_ins.get(a, [a]))]
            proc = await open_process(argv, stdin=subprocess.PIPE,
                                      env={**os.environ, "WIRESHARK_CONFIG_DIR": str(directory)})
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(proc, directory)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    async def run(self, path: str, display_filter: str, limit: int | None, max_line: int,
                  records: str | None = None, fields: tuple[str, ...] = ()) -> Head:
        """The first `limit` lines (or records) its template prints for `path` and `display_filter` (as
        `head`); `fields`: the field list of a template of any list."""
        (self.directory / "dfilter_macros").write_text(f'"{MACRO}",{uat_string(display_filter)}\n')
        (self.directory / "capture").symlink_to(path)
        assert self.proc.stdin is not None
        try:
            await self.proc.stdin.send_all(fields_standby.go_line(display_filter, fields) if fields else b"go\n")
            await self.proc.stdin.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # it ended already: its exit status and stderr say why
        done = await head_of(self.proc, limit, max_line=max_line, records=records)
        # Its messages name the capture by the link; say the file's own name.
        return dataclasses.replace(done, stderr=done.stderr.replace(str(self.directory / "capture"), path))

    async def close(self) -> None:
        await stop_process(self.proc)
        await close_pipes(self.proc)
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class StandbyRun:
    """The first `limit` lines (or records: _subprocess.head) of the actor's template run on `path`
    with `display_filter`."""

    path: str
    display_filter: str
    limit: int | None
    max_line: int
    records: str | None = None
    fields: tuple[str, ...] = ()  # a template of any field list: this run's


Launch = Callable[[Template], Awaitable[Standby]]


class StandbyActor(Actor):
    """The warm tsharks of one template: at most `template.depth` wait at a time; a run that finds
    none runs cold."""

    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.5)
    concurrency = 4  # a run that finds the standby taken answers at once (not served): it never queues

    def __init__(self, template: Template, *, launch: Launch = Standby.start, first_after_s: float = 0.0) -> None:
        super().__init__(template.key, template)
        self.template = template
        self.first_after_s = first_after_s  # before its first standby launches
        self._launch = launch
        self._waiting: list[Standby] = []  # oldest first
        self._nursery: trio.Nursery | None = None
        self.served = 0
        self.missed = 0  # runs that found no standby waiting
        self.failures = 0  # standbys in a row that ended before their run
        self.unsure = 0  # runs of a field list whose text the script could not make (then cold)
        self.off_because: str | None = None

    @property
    def _standby(self) -> Standby | None:
        """The standby the next run takes."""
        return self._waiting[0] if self._waiting else None

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        # The second one later, as a replacement: two tshark start-ups at once would take both cores.
        for i in range(self.template.depth):
            nursery.start_soon(self._replace, self.first_after_s + i * REPLACE_AFTER_S)

    async def stop(self) -> None:
        waiting, self._waiting = self._waiting, []
        for standby in waiting:
            await standby.close()

    async def _replace(self, after_s: float) -> None:
        await trio.sleep(after_s)
        if len(self._waiting) >= self.template.depth or self.off_because is not None:
            return
        try:
            standby = await self._launch(self.template)
        except OSError as exc:
            self.off_because = f"tshark could not be started: {exc}"
            log.warning("no warm tshark", template=self.resource, why=self.off_because)
            return
        self._waiting.append(standby)
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, standby)

    async def _watch(self, standby: Standby) -> None:
        """Reap a standby that ends while it waits (no Lua in this tshark, a kill): it is not used."""
        await standby.proc.wait()
        if standby in self._waiting:
            self._waiting.remove(standby)
            await self._failed(standby)

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case StandbyRun() as m:
                return await self._run(m)
            case _:
                raise unhandled("tshark standby", request)

    async def _run(self, m: StandbyRun) -> dict[str, Any]:
        standby = None
        while self._waiting and standby is None:
            standby = self._waiting.pop(0)
            if not standby.alive:  # ended while waiting, not reaped yet: the next one, if any
                await self._failed(standby)
                standby = None
        if standby is None:
            self.missed += 1
            return {"served": False}
        try:
            done = await standby.run(m.path, m.display_filter, m.limit, m.max_line, m.records, m.fields)
        finally:
            await standby.close()
            assert self._nursery is not None
            self._nursery.start_soon(self._replace, self.template.replace_after_s)
        if m.fields and (done.returncode == fields_standby.UNSURE_EXIT
                         or not fields_standby.whole_rows(done.lines, len(m.fields))):
            # A text the script cannot make, or a frame it missed: the caller runs it cold.
            self.unsure += 1
            log.info("warm tshark not used", why="a field's text is not its FieldInfo's", fields=m.fields,
                     stderr=done.stderr[-300:])
            return {"served": False, "unsure": True}
        if not (done.lines or done.text) and done.returncode not in (0, None) and not done.stopped:
            # No output (a filter tshark refuses, a file it cannot read): the caller runs it cold, whose
            # failure says which, coded as every cold early pass's is.
            return {"served": False}
        self.failures = 0
        self.served += 1
        return {"served": True, "lines": done.lines, "stopped": done.stopped, "returncode": done.returncode,
                "stderr": done.stderr, "text": done.text}

    async def _failed(self, standby: Standby) -> None:
        await standby.close()
        self.failures += 1
        if self.failures >= MAX_FAILURES:
            self.off_because = f"{MAX_FAILURES} standbys in a row ended before their run"
            log.warning("no warm tshark", template=self.resource, why=self.off_because)
        elif self._nursery is not None:
            self._nursery.start_soon(self._replace, REPLACE_AFTER_S)

    def statistics(self) -> dict[str, Any]:
        return {"argv": self.template.shown(), "waiting": bool(self._waiting), "served": self.served,
                "missed": self.missed, **({"unsure": self.unsure} if self.template.any_fields else {}),
                "off_because": self.off_because,
                "workers": system.workers(*((w.proc.pid, "tshark standby") for w in self._waiting))}


class WarmTsharks:
    """The back end's side of the standbys: which templates are warm (MAX_STANDBYS at most, least
    recently used stopped) and `run_head`, the RunHead every capture actor's early passes use: a run is
    asked of its template's actor, else run cold. The capture actors call it directly (not through the
    back end, which called them)."""

    def __init__(self, runtime: Runtime, wireshark: Wireshark | None = None) -> None:
        self.runtime = runtime
        # The back end's Wireshark facts: which field lists the standby of any list serves is read in its
        # catalogue (a test's WarmTsharks without one reads its own).
        self.wireshark = wireshark if wireshark is not None else Wireshark()
        self._recent: OrderedDict[str, None] = OrderedDict()  # template keys in use, least recent first
        self._own: set[str] = set()  # of those, the keys of templates every capture runs (start's capture_own)
        # Field lists the standby of any list could not print: they run on their own list's template.
        self._unsure: OrderedDict[tuple[str, ...], None] = OrderedDict()

    def runner(self, *, enabled: bool, idle_timeout_s: float) -> RunHead:
        """The RunHead of one capture's actor, with [pcap] warm_tshark and idle_timeout_s as they were
        when it started: values, so that a run never calls back into the back end that called the actor."""
        return functools.partial(self.run_head, enabled=enabled, idle_timeout_s=idle_timeout_s)

    async def run_head(self, argv: list[str], limit: int | None, *, max_line: int = 1 << 20,
                       records: str | None = None, enabled: bool = True, idle_timeout_s: float = math.inf) -> Head:
        """`head` of an early pass's tshark argv (_subprocess.RunHead), by a warm tshark of the same argv
        where one waits; a run that finds none, or that gives nothing, runs cold (whose failure is the
        one reported: a refused filter, an unreadable file)."""
        found = template_of(argv) if enabled else None
        if found is not None:
            template, path, display_filter = found
            fields: tuple[str, ...] = ()
            if (any_list := any_fields_of(template)) is not None and any_list[1] not in self._unsure \
                    and fields_standby.servable(any_list[1], await self.wireshark.catalogue()):
                template, fields = any_list  # one standby for every field list of its types
            if self.runtime.find(KIND, template.key) is None:
                # Its first run: cold, and its standby starts after it (started now, its start-up would
                # take the core this run needs), as a replacement does, REPLACE_AFTER_S later: launched
                # at once, the fork and the new tshark's start-up delayed this call's answer by 15-65 ms
                # (a timeline of a new field list, measured through the MCP client).
                done = await head(argv, limit, max_line=max_line, records=records)
                await self.start(template, idle_timeout_s, after_s=REPLACE_AFTER_S)
                return done
            ref = await self.start(template, idle_timeout_s)
            try:
                reply = await self.runtime.ask(ref, StandbyRun(path, display_filter, limit, max_line, records, fields))
            except DiagdError as exc:  # the standby actor stopped or is busy: cold
                log.info("warm tshark not used", why=exc.message)
            else:
                if reply.get("unsure"):
                    self._unsure[fields] = None
                    while len(self._unsure) > MAX_UNSURE_LISTS:
                        self._unsure.popitem(last=False)
                elif reply["served"]:
                    return Head(reply["lines"], reply["stopped"], reply["returncode"], reply["stderr"], reply["text"])
        return await head(argv, limit, max_line=max_line, records=records)

    async def start(self, template: Template, idle_timeout_s: float, *, after_s: float = 0.0,
                    capture_own: bool = False) -> ActorRef:
        """The standby actor of `template` (started if need be: its first standby launches `after_s`
        later). `capture_own`: one of the templates every capture runs (the back end's, at its open;
        it stays one when a run restarts it), stopped for another only when no field list's is left."""
        if capture_own:
            self._own.add(template.key)  # kept for good: a handful of keys, one per capture decoding
        self._recent.pop(template.key, None)
        # Templates whose actor ended (idle timeout) hold no standby: they take no place.
        for key in [k for k in self._recent if self.runtime.find(KIND, k) is None]:
            del self._recent[key]
        self._recent[template.key] = None
        while len(self._recent) > MAX_STANDBYS:
            others = [key for key in self._recent if key != template.key]
            victim = next((key for key in others if key not in self._own), others[0])
            del self._recent[victim]
            old = self.runtime.find(KIND, victim)
            if old is not None:
                self.runtime.stop(old, "another tshark argv needed a standby (MAX_STANDBYS)")
        return await self.runtime.start(KIND, template.key, lambda: StandbyActor(template, first_after_s=after_s),
                                        idle_timeout_s=idle_timeout_s)
