"""A sandbox launcher started ahead of need (`launcher.py --standby`): a confined run without the
launcher's own start on its path.

A cold launch is a fresh Python (`python -I -S launcher.py POLICY -- tool...`): ~17 ms to start the
interpreter and ~10 ms of imports (json, ctypes, its kernel calls) before the first sandbox step,
where the steps themselves (capabilities, no_new_privs, the death link's fork, Landlock, seccomp)
take ~2 ms (measured with timestamps in the launcher, bpftrace's policy). A standby is that launcher
started and imported beforehand, a child of the daemon like a cold one (its own session, stdout and
stderr piped), waiting on its stdin with its death-link watchdog already forked. The run's request
(its launcher arguments, policy included, and its environment: `request_of`) reaches it there; it
then applies the policy and execs the tool as a cold launcher does, so the standby *becomes* the
run's process: the same pid, parent, session, pipes and exit status, and the caller owns it as a
process it spawned (`Launcher.launch` returns its `trio.Process`).

Nothing is confined before the go, and nothing of a run is in a standby before it: each serves exactly
one run (whoever's), every restriction is applied after the go for that run alone, and what the
standby could hold beforehand is the daemon's own environment. The daemon is the only writer of its
stdin; at EOF without a request (retired, or the daemon died) it leaves having run nothing.

`Launcher`, the actor (kind `sandbox-standby`, one per back end that uses it), keeps one standby
waiting: it starts the first one `first_after_s` after the actor starts (the run that started it runs
cold), a replacement `replace_after_s` after each one is taken or sooner when the caller says the run
is past its start (`replace_soon`: the replacement's ~25 ms of a core then does not compete with that
run's own start), reaps one that dies while it waits and starts another (no more after MAX_FAILURES in
a row), retires it after `idle_s` unused (the next run is cold and starts the next), and stops it on
the way out: EOF on its stdin, then SIGTERM, then SIGKILL (STANDBY_STOP). A waiting standby writes
nothing (its pipes cannot fill); what one that failed wrote is read, bounded, when it is reaped.
Taking one (`launch`) is a plain call on the actor: no checkpoint between the standby leaving the
actor and reaching its caller, so none can be lost in between; a hand-over cut short stops it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import structlog
import trio

from diagd.actors import system
from diagd.actors._subprocess import Step, Tail, close_pipes, drain, open_process, stop_process
from diagd.actors.base import Actor, Request, SupervisionPolicy, unhandled
from diagd.actors.sandbox import launcher_prefix

log = structlog.get_logger("diagd.sandbox")

KIND = "sandbox-standby"
STANDBY = "--standby"  # launcher.py's argument (launcher.STANDBY: the launcher is run by path, not imported)
FIRST_AFTER_S = 0.5  # after the actor starts (on a run, which runs cold), before its first standby starts
MAX_FAILURES = 3  # standbys in a row that ended before their run: then none (runs are cold)
IDLE_S = 600.0  # a standby unused this long is retired; the next run is cold and starts another
STANDBY_STOP = (Step("eof", None, 2.0), Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 5.0))
FAILED_STDERR_BYTES = 4096  # what is kept of a failed standby's stderr, for the log


def request_of(argv: Sequence[str]) -> list[str] | None:
    """The launcher arguments (POLICY_JSON, "--", tool...) of a `sandbox.wrap` command line a standby
    can run: a launcher outside namespaces. None for anything else (a tool run bare, through
    privileged_helper, or in bubblewrap behind the supervisor): that runs cold."""
    prefix = launcher_prefix()
    if list(argv[:len(prefix)]) != prefix or len(argv) < len(prefix) + 3 or argv[len(prefix) + 1] != "--":
        return None
    try:
        policy = json.loads(argv[len(prefix)])
    except ValueError:
        return None
    if not isinstance(policy, dict) or policy.get("supervise") or policy.get("namespaces"):
        return None
    return list(argv[len(prefix):])


class Standby:
    """One waiting launcher."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.watch = trio.CancelScope()  # its watcher's, while it waits (cancelled when it is taken)

    @classmethod
    async def start(cls) -> Standby:
        # Shielded: a process started and then lost to a cancellation would wait with no owner.
        with trio.CancelScope(shield=True):
            proc = await open_process([*launcher_prefix(), STANDBY], stdin=subprocess.PIPE)
        return cls(proc)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    async def go(self, args: Sequence[str], env: dict[str, str]) -> bool:
        """Hand it its run; False when it had ended already (nothing was run)."""
        request = json.dumps({"args": list(args), "env": env}, separators=(",", ":")).encode()
        stdin = self.proc.stdin
        assert isinstance(stdin, trio.lowlevel.FdStream)
        try:
            # Straight into the pipe (no scheduler pass before it, as send_all takes): a request fits
            # its buffer, and the standby starts when it reads EOF, right after.
            try:
                sent = os.write(stdin.fileno(), request)
            except BlockingIOError:
                sent = 0
            if sent < len(request):
                await stdin.send_all(request[sent:])
            await stdin.aclose()
        except (BrokenPipeError, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    async def close(self) -> str:
        """Stop it (STANDBY_STOP: EOF first, it leaves by itself) and reap it; its pipes closed."""
        async def eof() -> None:
            if self.proc.stdin is not None:
                await self.proc.stdin.aclose()

        try:
            return await stop_process(self.proc, STANDBY_STOP, graceful=eof)
        finally:
            await close_pipes(self.proc)

    async def failure(self) -> str:
        """What a standby that ended by itself wrote (bounded), once it is reaped; pipes closed."""
        tail = Tail(FAILED_STDERR_BYTES)
        with trio.move_on_after(1.0):
            await drain(self.proc.stderr, tail.feed)
        await self.close()
        return tail.text().strip()


class Launcher(Actor):
    """The standby launcher of one back end (its resource): at most one waits; `launch` takes it."""

    kind = KIND
    policy = SupervisionPolicy(max_restarts=3, window_s=60, backoff_s=0.5,
                               stop_grace_s=sum(step.wait_s for step in STANDBY_STOP) + 1)

    def __init__(self, owner: str, *, first_after_s: float = FIRST_AFTER_S, replace_after_s: float = 0.0,
                 idle_s: float = IDLE_S) -> None:
        super().__init__(owner)
        self.first_after_s = first_after_s
        self.replace_after_s = replace_after_s
        self.idle_s = idle_s
        self._waiting: Standby | None = None
        self._nursery: trio.Nursery | None = None
        self._pending = False  # a start is scheduled or under way
        self._replace_at = math.inf  # when the scheduled one starts (replace_soon may bring it forward)
        self._replace_moved = trio.Event()
        self._last_use = -math.inf
        self.served = 0
        self.missed = 0  # runs that found no standby waiting
        self.failures = 0  # standbys in a row that ended before their run
        self.started = 0
        self.off_because: str | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._last_use = trio.current_time()
        self._schedule(self.first_after_s)

    async def stop(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            await waiting.close()

    async def handle(self, request: Request) -> dict[str, Any]:
        raise unhandled("sandbox standby", request)

    # -- a run

    async def launch(self, args: Sequence[str], env: dict[str, str]) -> trio.Process | None:
        """Run the launcher arguments `args` (`request_of`) with `env` on the waiting standby and return
        its process, now the caller's (reap it, stop it, close its pipes, as any spawned child); None
        when none waits (the caller runs it cold)."""
        standby = self._take()
        if standby is None:
            return None
        try:
            handed = await standby.go(args, env)
        except BaseException:  # cancelled mid-write: it is nobody's run, and must not be left waiting
            await standby.close()
            raise
        if not handed:  # it died just now: reaped here, the run goes cold
            self.missed += 1
            log.warning("a standby launcher had ended before its run", owner=self.resource,
                        why=(await standby.failure())[-300:])
            return None
        self.served += 1
        self.failures = 0
        return standby.proc

    def _take(self) -> Standby | None:
        """The waiting standby, out of the actor's hands (no checkpoint: nothing between here and the
        caller can lose it); a replacement is scheduled."""
        self._last_use = trio.current_time()
        standby, self._waiting = self._waiting, None
        if standby is not None and not standby.alive:  # ended, not reaped yet: _watch does that
            self._waiting = standby
            standby = None
        if standby is not None:
            standby.watch.cancel()
        else:
            self.missed += 1
        self._schedule(self.replace_after_s)
        return standby

    # -- keeping one waiting

    def replace_soon(self, after_s: float = 0.0) -> None:
        """The run that took the last standby is past its start (its first output, or its end): its
        replacement, if it waits for that, starts `after_s` from now rather than at its fallback time."""
        if self._pending:
            self._schedule(after_s)

    def _schedule(self, after_s: float) -> None:
        """Have a standby start `after_s` from now (or sooner, if one is scheduled sooner already)."""
        if self._waiting is not None or self.off_because is not None or self._nursery is None:
            return
        at = trio.current_time() + after_s
        if self._pending:
            if at < self._replace_at:
                self._replace_at = at
                self._replace_moved.set()
            return
        self._pending = True
        self._replace_at = at
        self._nursery.start_soon(self._replace)

    async def _replace(self) -> None:
        try:
            while trio.current_time() < self._replace_at:
                self._replace_moved = trio.Event()
                with trio.move_on_at(self._replace_at):
                    await self._replace_moved.wait()
            if self._waiting is not None or self.off_because is not None:
                return
            try:
                standby = await Standby.start()
            except OSError as exc:
                self.off_because = f"the launcher could not be started: {exc}"
                log.warning("no standby launcher", owner=self.resource, why=self.off_because)
                return
            self.started += 1
            self._waiting = standby
        finally:
            self._pending = False
        assert self._nursery is not None
        self._nursery.start_soon(self._watch, standby)

    async def _watch(self, standby: Standby) -> None:
        """Reap a standby that ends while it waits (a kill, a launcher that cannot start), or retire it
        once unused for idle_s. Taking it cancels this: from then on it is its caller's."""
        with standby.watch:
            while True:
                with trio.move_on_at(self._last_use + self.idle_s):
                    await standby.proc.wait()
                if standby.alive and trio.current_time() < self._last_use + self.idle_s:
                    continue  # a run that found it dead (not reaped yet) moved the idle deadline
                break
            self._waiting = None
            if standby.alive:
                log.info("standby launcher retired", owner=self.resource, unused_s=self.idle_s)
                await standby.close()
                return
            why = await standby.failure()
            self.failures += 1
            log.warning("a standby launcher ended while it waited", owner=self.resource,
                        code=standby.proc.returncode, why=why[-300:])
            if self.failures >= MAX_FAILURES:
                self.off_because = f"{MAX_FAILURES} standby launchers in a row ended before their run: {why[-200:]}"
                log.warning("no standby launcher", owner=self.resource, why=self.off_because)
                return
            self._schedule(self.policy.backoff_s)

    def statistics(self) -> dict[str, Any]:
        waiting = self._waiting
        return {"owner": self.resource, "waiting": waiting is not None and waiting.alive, "served": self.served,
                "missed": self.missed, "started": self.started, "off_because": self.off_because,
                "workers": system.workers((waiting.proc.pid if waiting is not None else None, "standby launcher"))}
