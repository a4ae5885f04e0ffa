"""A warm tshark: a fresh capture's first page without tshark's start-up on its path.

tshark spends 0.15-0.25 s of CPU starting (registering every dissector, reading its configuration)
before it reads a frame; on a fresh capture's first page (first_page.early_rows) that start is most
of the wait. A standby is that tshark started ahead of need. It stops, initialised, inside a Lua
script of diagd's (`-X lua_script:`) that waits for a line on stdin. What the page needs is not known
when it starts, so its argv names two stand-ins that tshark reads only after the script returns:

- `-Y ${diagd_page}`: a display-filter macro, defined in the `dfilter_macros` file of the standby's
  own WIRESHARK_CONFIG_DIR, written just before the go (tshark loads its settings after the Lua
  scripts, then compiles -Y);
- `-r <dir>/capture`: a symbolic link, made to point at the capture before the go (tshark opens its
  file after compiling the filter).

Everything else is the cold early pass's own argv (first_page.tabs_argv): `-n`, the capture's
decode-as rules and preferences (the standby's *shape*: a capture with another shape gets a standby
of its own, started by its first page, which runs cold), `-l -T tabs`; the differential test holds a
standby's lines to the cold tshark's on every corpus capture. Filters with a `$` (macro syntax: the
text would not reach the compiler as written) and pages without a filter run cold.

A standby serves one page and ends (stopped once the page is in, reaped, its directory removed). The
actor (one per shape) then starts the next one REPLACE_AFTER_S later, on the Trio clock, so its
start-up does not take the core the just-opened capture's load needs. An idle standby holds ~66 MB of
its own (and maps libwireshark, shared with sharkd); `[pcap] warm_tshark = false` turns them off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import trio

from diagd.actors._subprocess import Head, close_pipes, head_of, open_process, stop_process
from diagd.actors.base import Actor, Request, SupervisionPolicy, unhandled
from diagd.actors.pcap.first_page import TABS_MAX_LINE

log = structlog.get_logger("diagd.pcap")

KIND = "tshark-standby"
REPLACE_AFTER_S = 1.0  # after a page, before the next standby starts
MAX_FAILURES = 3  # standbys in a row that ended before their page: then no more (a tshark without Lua)
MACRO = "diagd_page"
# Waits for diagd's go; at EOF (diagd went away) the standby ends instead of reading a capture.
_LUA = 'if io.read("*l") == nil then os.exit(1) end\n'
# As sharkd's config (session.py): no name resolution, as -n says too.
_PREFERENCES = "nameres.mac_name: FALSE\nnameres.transport_name: FALSE\nnameres.network_name: FALSE\n"


def shape_of(argv: list[str]) -> tuple[tuple[str, ...], str] | None:
    """(shape, capture path) of a capture's cold argv (tshark.base_argv: `tshark -r PATH -n -2`, then
    its -d and -o pairs), or None for another form: only that form has a standby equivalent."""
    if len(argv) < 5 or argv[0] != "tshark" or argv[1] != "-r" or argv[3:5] != ["-n", "-2"]:
        return None
    return tuple(argv[5:]), argv[2]


def shape_key(shape: tuple[str, ...]) -> str:
    """The standby actor's resource name: "default", or a digest of the decode-as rules and preferences."""
    return hashlib.sha256("\0".join(shape).encode()).hexdigest()[:12] if shape else "default"


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
    async def start(cls, shape: tuple[str, ...]) -> Standby:
        directory = Path(tempfile.mkdtemp(prefix="diagd-standby-"))  # 0700: only this user reaches the link
        try:
            (directory / "standby.lua").write_text(_LUA)
            (directory / "preferences").write_text(_PREFERENCES)
            argv = ["tshark", "-X", f"lua_script:{directory / 'standby.lua'}", "-r", str(directory / "capture"),
                    "-n", *shape, "-l", "-Y", f"${{{MACRO}}}", "-T", "tabs"]
            proc = await open_process(argv, stdin=subprocess.PIPE,
                                      env={**os.environ, "WIRESHARK_CONFIG_DIR": str(directory)})
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return cls(proc, directory)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.proc.poll() is None

    async def page(self, path: str, display_filter: str, limit: int) -> Head:
        """The first `limit` lines of the tabs packet list of `path` filtered by `display_filter`."""
        (self.directory / "dfilter_macros").write_text(f'"{MACRO}",{uat_string(display_filter)}\n')
        (self.directory / "capture").symlink_to(path)
        assert self.proc.stdin is not None
        try:
            await self.proc.stdin.send_all(b"go\n")
            await self.proc.stdin.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # it ended already: its exit status and stderr say why
        done = await head_of(self.proc, limit, max_line=TABS_MAX_LINE)
        # Its messages name the capture by the link; say the file's own name.
        return Head(done.lines, done.stopped, done.returncode,
                    done.stderr.replace(str(self.directory / "capture"), path))

    async def close(self) -> None:
        await stop_process(self.proc)
        await close_pipes(self.proc)
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass(frozen=True)
class StandbyPage:
    """The first `limit` lines of a single pass's tabs packet list of `path` (first_page.tabs_argv)."""

    path: str
    display_filter: str
    limit: int


Launch = Callable[[tuple[str, ...]], Awaitable[Standby]]


class StandbyActor(Actor):
    """The warm tshark of one shape: at most one waits at a time; a page that finds none runs cold."""

    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.5)
    concurrency = 4  # a page that finds the standby taken answers at once (not served): it never queues

    def __init__(self, resource: str, shape: tuple[str, ...], *, launch: Launch = Standby.start) -> None:
        super().__init__(resource, shape)
        self.shape = shape
        self._launch = launch
        self._standby: Standby | None = None
        self._nursery: trio.Nursery | None = None
        self.served = 0
        self.missed = 0  # pages that found no standby waiting
        self.failures = 0  # standbys in a row that ended before their page
        self.off_because: str | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self._replace, 0.0)

    async def stop(self) -> None:
        standby, self._standby = self._standby, None
        if standby is not None:
            await standby.close()

    async def _replace(self, after_s: float) -> None:
        await trio.sleep(after_s)
        if self._standby is not None or self.off_because is not None:
            return
        try:
            standby = self._standby = await self._launch(self.shape)
        except OSError as exc:
            self.off_because = f"tshark could not be started: {exc}"
            log.warning("no warm tshark", shape=self.resource, why=self.off_because)
            return
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, standby)

    async def _watch(self, standby: Standby) -> None:
        """Reap a standby that ends while it waits (no Lua in this tshark, a kill): it is not used."""
        await standby.proc.wait()
        if self._standby is standby:
            self._standby = None
            await self._failed(standby)

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case StandbyPage() as m:
                return await self._page(m)
            case _:
                raise unhandled("tshark standby", request)

    async def _page(self, m: StandbyPage) -> dict[str, Any]:
        standby, self._standby = self._standby, None
        if standby is None or not standby.alive:
            self.missed += 1
            if standby is not None:
                await self._failed(standby)
            return {"served": False}
        try:
            done = await standby.page(m.path, m.display_filter, m.limit)
        finally:
            await standby.close()
            assert self._nursery is not None
            self._nursery.start_soon(self._replace, REPLACE_AFTER_S)
        if not done.lines and done.returncode not in (0, None) and not done.stopped:
            # No page (a filter tshark refuses, a file it cannot read): the caller runs it cold, whose
            # failure says which, coded as every cold early pass's is.
            return {"served": False}
        self.failures = 0
        self.served += 1
        return {"served": True, "lines": done.lines, "stopped": done.stopped, "returncode": done.returncode,
                "stderr": done.stderr}

    async def _failed(self, standby: Standby) -> None:
        await standby.close()
        self.failures += 1
        if self.failures >= MAX_FAILURES:
            self.off_because = f"{MAX_FAILURES} standbys in a row ended before their page"
            log.warning("no warm tshark", shape=self.resource, why=self.off_because)
        elif self._nursery is not None:
            self._nursery.start_soon(self._replace, REPLACE_AFTER_S)

    def statistics(self) -> dict[str, Any]:
        return {"waiting": self._standby is not None, "served": self.served, "missed": self.missed,
                "off_because": self.off_because}
