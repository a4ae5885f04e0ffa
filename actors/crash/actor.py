"""The crash session actor: one per dump session (kind "crash", resource = the session key).

It owns two children:
- `crash -s` on a pseudo-terminal, driven by pexpect in worker threads (`pty`), never on the
  Trio loop; commands past their timeout get Ctrl-C and the session carries on;
- a drgn worker (`python -m diagd.actors.crash.drgn_worker`) speaking length-prefixed msgpack on
  pipes, with `prog` loaded from the same dump. drgn code never runs inside the daemon.

Both start together; the actor counts as started once both are spawned, and crash's 7-9 s load runs
in the background: drgn answers after ~0.5 s while crash still loads. Running commands is
`commands.Commands`; this module is the lifecycle and the message dispatch.

Outputs stream to their files as they are produced (crash's from the pty thread, drgn's written by the
worker itself); the daemon keeps only their first lines. Past [crash] max_output_bytes an output is
cut there and flagged (`output_truncated`, `truncated_reason`); the session carries on.

If crash dies, the session fails with a coded error and is released. If the drgn worker dies, the
call in flight gets BACKEND_UNAVAILABLE saying how, and the next drgn call starts a fresh worker (its
variables are gone); crash is not affected.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import OrderedDict
from typing import Any, cast

import structlog
import trio

from diagd.actors import sandbox
from diagd.actors._subprocess import Step, stop_process
from diagd.actors.base import Actor, Request, RestartKind, SupervisionPolicy, unhandled
from diagd.actors.crash import report, text
from diagd.actors.crash.commands import Commands
from diagd.actors.crash.drgn import DrgnClient
from diagd.actors.crash.messages import KIND, Hooks, Phase, RunCrash, RunDrgn, SessionSpec, Triage
from diagd.actors.crash.pty import (
    CrashDriver,
    CrashExited,
    CrashUnresponsive,
    PtyChild,
    describe_status,
    spawn_in_owner_thread,
)
from diagd.actors.crash.scripts import PYKDUMP_DIRS
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.crash.store import Entry, OutputStore
from diagd.actors.system import rss_bytes, workers
from diagd.protocol.errors import DiagdError, ErrorCode

log = structlog.get_logger("diagd.crash")

CRASH_STOP_STEPS = (Step("quit", None, 3.0), Step("sigterm", signal.SIGTERM, 2.0), Step("sigkill", signal.SIGKILL, 3.0))


class CrashSession(Commands, Actor):
    kind = KIND
    # The supervisor never restarts a session behind its users' backs: a dead crash fails this actor,
    # and the back end starts a fresh one for the same session only when the next call names it
    # (`backend.CrashBackend._revive`, which says so in its answer).
    policy = SupervisionPolicy(restart=RestartKind.TEMPORARY, max_restarts=0, stop_grace_s=20.0)

    def __init__(self, spec: SessionSpec, store: OutputStore, hooks: Hooks, crash_version: str | None,
                 namespaces: sandbox.namespaces.Namespaces) -> None:
        super().__init__(spec.key, spec)
        self.spec = spec
        self.store = store
        self.hooks = hooks
        self.namespaces = namespaces  # the back end's probe of what bubblewrap can do here
        self.crash_version = crash_version
        self.driver: CrashDriver | None = None
        self.child: PtyChild | None = None
        self.drgn: DrgnClient | None = None
        self.crash_phase = Phase.LOADING
        self.drgn_phase = Phase.LOADING
        self.crash_done = trio.Event()
        self.drgn_done = trio.Event()
        self.stopped = trio.Event()
        self.crash_error: DiagdError | None = None
        self.drgn_error: DiagdError | None = None
        self.failure: DiagdError | None = None
        self.closing = False
        self.started_at = trio.current_time()
        self.crash_load_s: float | None = None
        self.drgn_load_s: float | None = None
        self.startup_output = ""
        self.context: text.Context | None = None
        self.panic_context: text.Context | None = None
        self.generation = 0
        self.summary: dict[str, Any] = {}
        self.drgn_loaded: dict[str, Any] = {}
        self.cache: OrderedDict[tuple[str, str, int], Entry] = OrderedDict()
        self.cache_hits = 0
        self.commands = 0
        self.drgn_restarts = 0
        self.extensions: set[str] = set()
        self.stop_results: dict[str, str] = {}
        self._counter = 0
        self._nursery: trio.Nursery | None = None
        self._owner_release: threading.Event | None = None

    @property
    def settings_(self) -> CrashSettings:
        """The settings a call runs under: the current ones, so a reload applies to the next call.

        What the children were spawned with (binary, drgn, sandbox reach) is `spec.settings`.
        """
        return self.hooks.settings() if self.hooks.settings is not None else self.spec.settings

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        s = self.spec.settings
        argv = [s.crash_binary, "-s", "--no_crashrc", *self.spec.crash_args, str(self.spec.vmlinux),
                str(self.spec.vmcore)]
        argv = sandbox.wrap(argv, self._crash_policy())  # confined: Landlock, no caps, no sockets
        # The launcher passes on only its allow-list (`sandbox.BASE_ENV`, HOME a directory that does not
        # exist). The working directory is `/`: gdb reads ./.gdbinit, and the session directory is
        # writable by drgn code.
        env = {**os.environ, "TERM": "dumb", "LC_ALL": "C"}
        self._counter = await trio.to_thread.run_sync(self.store.next_number, self.spec.session_id) - 1
        self.driver, self._owner_release = await spawn_in_owner_thread(
            argv, cwd="/", env=env, name=f"crash-{self.spec.session_id}")
        self.child = PtyChild(self.driver)
        nursery.start_soon(self._watch_crash, self.child)
        nursery.start_soon(self._load_crash)
        if s.drgn:
            self.drgn = await DrgnClient.spawn(nursery, cwd=self.spec.workdir, policy=self._drgn_policy())
            nursery.start_soon(self._watch_drgn, self.drgn)
            nursery.start_soon(self._load_drgn, self.drgn)
        else:
            self._drgn_unavailable(DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "drgn is disabled ([crash] drgn = false)"))

    def _crash_policy(self) -> sandbox.Policy:
        s = self.spec.settings
        extensions = [os.path.expanduser(d) for d in (*PYKDUMP_DIRS, *([s.pykdump_path] if s.pykdump_path else []))]
        return self._jail("crash", sandbox.crash_policy(
            vmcore=self.spec.vmcore, vmlinux=self.spec.vmlinux, workdir=self.spec.workdir,
            allowed_dirs=s.allowed_dirs, extra_read=extensions, private_dirs=self.spec.private_dirs))

    def _drgn_policy(self) -> sandbox.Policy:
        return self._jail("the drgn worker", sandbox.drgn_policy(
            vmcore=self.spec.vmcore, vmlinux=self.spec.vmlinux, workdir=self.spec.workdir,
            allowed_dirs=self.spec.settings.allowed_dirs, private_dirs=self.spec.private_dirs))

    def _jail(self, what: str, policy: sandbox.Policy) -> sandbox.Policy:
        s = self.spec.settings
        return sandbox.confine(what, policy, self.namespaces, allowed_unconfined=s.allow_unconfined,
                               setting="[crash] allow_unconfined",
                               scratch_bytes=s.scratch_mb * 1024 * 1024)

    async def stop(self) -> None:
        self.closing = True
        # What list_vmcore_sessions and diagd status show must stay true while and after the children
        # go: never "ready" for a process being stopped or already reaped. A failure stays a failure.
        self._set_phases(Phase.STOPPING)
        try:
            async with trio.open_nursery() as nursery:
                if self.child is not None:
                    nursery.start_soon(self._stop_crash, self.child)
                if self.drgn is not None:
                    nursery.start_soon(self._stop_drgn, self.drgn)
        finally:
            for phase_event in (self.crash_done, self.drgn_done):
                phase_event.set()
            self._set_phases(Phase.CLOSED)
            self.stopped.set()
            self.hooks.on_exit(self)

    def _set_phases(self, phase: Phase) -> None:
        if self.crash_phase != Phase.FAILED:
            self.crash_phase = phase
        if self.drgn_phase != Phase.FAILED:
            self.drgn_phase = phase

    async def _stop_crash(self, child: PtyChild) -> None:
        driver = child.driver

        async def graceful() -> None:
            await trio.to_thread.run_sync(driver.request_quit)
            await child.wait()

        # A crash that failed (hung, or half gone) gets no polite `quit` to ignore.
        steps = CRASH_STOP_STEPS if self.failure is None else CRASH_STOP_STEPS[1:]
        self.stop_results["crash"] = await stop_process(cast(trio.Process, child), steps, graceful=graceful)
        await trio.to_thread.run_sync(driver.close)
        child.close()
        if self._owner_release is not None:
            self._owner_release.set()

    async def _stop_drgn(self, drgn: DrgnClient) -> None:
        self.stop_results["drgn"] = await drgn.close()

    def _fail(self, error: DiagdError) -> None:
        """A child died or hung: fail the session once; the backend releases it."""
        if self.failure is not None or self.closing:
            return
        self.failure = error
        if self.crash_phase == Phase.LOADING:
            self.crash_phase, self.crash_error = Phase.FAILED, error
        if self.drgn_phase == Phase.LOADING:
            self.drgn_phase, self.drgn_error = Phase.FAILED, error
        self.crash_done.set()
        self.drgn_done.set()
        log.warning("crash session failed", session=self.spec.session_id, error=error.message)
        self.hooks.on_failed(self, error)
        # Only after the hook, which tells a crash that died once ready (revivable) by its phase: from
        # here on the session shows crash as failed, not as the ready process it no longer is.
        self.crash_phase, self.crash_error = Phase.FAILED, self.crash_error or error

    async def _watch_crash(self, child: PtyChild) -> None:
        code = await child.wait()
        if self.crash_phase == Phase.LOADING:
            return  # the loader reports it, with what crash printed
        self._fail(DiagdError(ErrorCode.ACTOR_FAILED,
                              f"crash exited ({describe_status(code)}): session {self.spec.session_id} is over",
                              session_id=self.spec.session_id, exit=describe_status(code),
                              hint="open_vmcore_session again starts a fresh session"))

    async def _watch_drgn(self, drgn: DrgnClient) -> None:
        await drgn.exited.wait()  # reaped and its pipes closed by the client's waiter
        if drgn.expected_exit or drgn is not self.drgn or self.closing:
            return
        if self.drgn_phase == Phase.READY:  # while loading, the loader decides
            self._drgn_died(drgn, describe_status(drgn.exit_code))

    def _drgn_died(self, drgn: DrgnClient, how: str) -> None:
        if drgn is self.drgn and self.drgn_phase != Phase.DEAD:
            log.warning("drgn worker died", session=self.spec.session_id, exit=how)
            self.drgn_phase = Phase.DEAD
            self.drgn_error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"the drgn worker died ({how})")

    async def _load_crash(self) -> None:
        assert self.driver is not None and self.child is not None
        driver, s = self.driver, self.settings_
        started = trio.current_time()
        try:
            self.startup_output = await self._in_thread(lambda abort: driver.wait_ready(s.load_timeout_s, abort))
            await self._raw("set scroll off")
            self.context = self.panic_context = await self._query_context()
            self.crash_load_s = trio.current_time() - started
            sys_entry, _ = await self._crash_entry("sys", force=False, kind=text.Kind.PLAIN)
            self.summary = self._summary(text.parse_sys("\n".join(sys_entry.head)), sys_entry)
            self.crash_phase = Phase.READY
            log.info("crash ready", session=self.spec.session_id, load_s=round(self.crash_load_s, 2))
        except CrashExited as exc:
            code = await self._exit_code()
            tail = "\n".join(str(exc).strip().splitlines()[-15:])
            error = DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                               f"crash could not load the dump ({describe_status(code)}): "
                               f"{tail.splitlines()[-1] if tail else 'no output'}",
                               output=tail, exit=describe_status(code), argv_tail=list(self.spec.crash_args))
            self.crash_phase, self.crash_error = Phase.FAILED, error
            self._fail(error)
        except CrashUnresponsive as exc:
            error = DiagdError(ErrorCode.TIMEOUT, f"crash did not become ready: {exc}",
                               timeout_s=s.load_timeout_s)
            self.crash_phase, self.crash_error = Phase.FAILED, error
            self._fail(error)
        except DiagdError as exc:
            self.crash_phase, self.crash_error = Phase.FAILED, exc
            self._fail(exc)
        finally:
            self.crash_done.set()

    async def _load_drgn(self, drgn: DrgnClient, *, restarted: bool = False) -> None:
        started = trio.current_time()
        try:
            await drgn.greet()
            debug = [str(self.spec.vmlinux)]
            loaded = await drgn.load(str(self.spec.vmcore), debug)
            self.drgn_load_s = trio.current_time() - started
            self.drgn_loaded = {"tasks": loaded.tasks, "crashed_pid": loaded.crashed_pid,
                                "crashed_comm": loaded.crashed_comm, "warnings": loaded.warnings,
                                "drgn_version": drgn.hello.drgn_version if drgn.hello else None}
            self.drgn_phase = Phase.READY
            if self.summary:
                self.summary = self._summary(self.summary.get("system", {}), None)
        except DiagdError as exc:
            if self.closing:
                pass
            elif exc.code != ErrorCode.BACKEND_UNAVAILABLE:
                self._drgn_unavailable(exc)  # drgn cannot read this dump: crash still serves
            elif restarted:  # died loading twice in a row: do not keep trying on every call
                how = await drgn.death()
                self._drgn_unavailable(DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                                                  f"the drgn worker died while loading the dump ({how})",
                                                  stderr=drgn.stderr.text()[-2000:]))
            else:
                self._drgn_died(drgn, await drgn.death())
        finally:
            self.drgn_done.set()

    def _drgn_unavailable(self, error: DiagdError) -> None:
        self.drgn_phase, self.drgn_error = Phase.UNAVAILABLE, error
        self.drgn_done.set()

    async def _exit_code(self) -> int | None:
        if self.child is None:
            return None
        with trio.move_on_after(2):
            return await self.child.wait()
        return self.child.returncode

    # -- requests -------------------------------------------------------------------------------

    async def handle(self, request: Request) -> dict[str, Any]:
        if self.failure is not None:
            raise self.failure
        try:
            match request.message:
                case RunCrash() as crash:
                    return crash.reply(await self.op_crash(crash.command, crash.force, crash.max_lines,
                                                           crash.extension))
                case RunDrgn() as drgn:
                    return drgn.reply(await self.op_drgn(drgn.code, drgn.filename, drgn.isolated, drgn.max_lines,
                                                         drgn.label))
                case Triage() as triage:
                    return triage.reply(await self.op_triage())
            raise unhandled("crash", request)
        except BaseException:
            if self.failure is not None:
                request.fail(self.failure)  # first answer wins over the generic "stopped during the call"
            raise

    async def _replace_drgn(self, old: DrgnClient) -> None:
        assert self._nursery is not None
        old.expected_exit = True
        self.drgn_phase = Phase.LOADING
        self.drgn_done = trio.Event()
        await old.close()
        self.drgn = await DrgnClient.spawn(self._nursery, cwd=self.spec.workdir, policy=self._drgn_policy())
        self._nursery.start_soon(self._watch_drgn, self.drgn)
        await self._load_drgn(self.drgn, restarted=True)


    # -- reporting ------------------------------------------------------------------------------

    def _summary(self, system: dict[str, str], sys_entry: Entry | None) -> dict[str, Any]:
        return report.session_summary(
            system, startup_output=self.startup_output, crash_version=self.crash_version,
            crash_load_s=self.crash_load_s, panic=self.panic_context, drgn=self._drgn_status(),
            drgn_tasks=int(self.drgn_loaded.get("tasks", -1)),
            sys_command_id=sys_entry.command_id if sys_entry is not None else self.summary.get("sys_command_id"))

    def _drgn_status(self) -> dict[str, Any]:
        if self.drgn_phase == Phase.READY:
            return {"phase": str(self.drgn_phase), "load_s": round(self.drgn_load_s or 0, 3), **self.drgn_loaded}
        return {"phase": str(self.drgn_phase), "error": self.drgn_error.message if self.drgn_error else None}

    def statistics(self) -> dict[str, Any]:
        return {
            "session_id": self.spec.session_id,
            "vmcore": str(self.spec.vmcore),
            "vmlinux": str(self.spec.vmlinux),
            "crash": str(self.crash_phase),
            "drgn": str(self.drgn_phase),
            "failure": self.failure.message if self.failure else None,
            "crash_pid": self.child.pid if self.child else None,
            "drgn_pid": self.drgn.pid if self.drgn else None,
            "drgn_restarts": self.drgn_restarts,
            "crash_rss_bytes": rss_bytes(self.child.pid) if self.child else None,
            "drgn_rss_bytes": rss_bytes(self.drgn.pid) if self.drgn else None,
            "crash_load_s": round(self.crash_load_s, 3) if self.crash_load_s is not None else None,
            "drgn_load_s": round(self.drgn_load_s, 3) if self.drgn_load_s is not None else None,
            "commands": self.commands,
            "cache_hits": self.cache_hits,
            "cached_entries": len(self.cache),
            "context": self.context.to_json() if self.context else None,
            "workers": workers((self.child.pid if self.child else None, "crash"),
                               (self.drgn.pid if self.drgn else None, "drgn")),
        }

    def __repr__(self) -> str:
        return f"<CrashSession {self.spec.session_id} [crash {self.crash_phase}, drgn {self.drgn_phase}]>"

