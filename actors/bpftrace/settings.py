"""The `[bpftrace]` config table: its keys and their checks, the bpftrace command line and stop steps they
imply, and the early privilege check; parsed on every tool call, so `diagd reload` applies to the next one.
"""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagd.actors import sandbox, system
from diagd.actors._subprocess import Step
from diagd.actors.bpftrace import directives
from diagd.actors.runtime import BackendConfig
from diagd.actors.settings import parse_table, refuse, setting
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_SIGINT_GRACE_S = 60.0
MAX_KILL_WAIT_S = 60.0


@dataclass(frozen=True)
class BpftraceSettings:
    path: str = "bpftrace"
    privileged_helper: str = ""  # e.g. "sudo -n": prefixed to every bpftrace command
    allow_unsafe: bool = False  # pass --unsafe (system(), signal(), override())
    max_run_s: float = setting(60.0, positive=True)
    default_timeout_s: float = setting(10.0, positive=True)
    max_lines: int = setting(10_000, positive=True)
    max_output_bytes: int = setting(16 * 1024 * 1024, positive=True)
    max_concurrent: int = setting(5, positive=True)
    # SIGINT -> SIGKILL, plus stop_s_per_probe per attached probe
    stop_grace_s: float = setting(5.0, positive=True)
    stop_s_per_probe: float = setting(0.15, minimum=0)
    start_timeout_s: float = setting(20.0, positive=True)  # exec_program waits this long for bpftrace to attach
    # a finished execution's actor stays this long, then results come from disk
    linger_s: float = setting(60.0, minimum=0)
    keep_executions: int = setting(200, positive=True)  # persisted executions kept on disk
    probe_cache_s: float = setting(30.0, positive=True)
    # Where bpftrace cannot be confined by Landlock (kernel without it, or privileged_helper: sudo cannot
    # run under no_new_privs), programs using its file helpers (cat(), #include) are refused; true
    # accepts that they read any file as root.
    allow_unconfined: bool = False
    # A sandbox launcher started ahead of need, waiting for the next run (`sandbox.standby`): a run then
    # skips the launcher's Python start (~30 ms). Two idle processes while it waits (the launcher and its
    # death link's watchdog, ~8 MB of their own).
    warm_launcher: bool = True

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> BpftraceSettings:
        return parse_table(cls, "bpftrace", raw)

    def __post_init__(self) -> None:
        if self.default_timeout_s > self.max_run_s:
            raise refuse("bpftrace", "default_timeout_s", f"({self.default_timeout_s:g}) exceeds max_run_s "
                         f"({self.max_run_s:g})")
        try:
            shlex.split(self.privileged_helper)
        except ValueError as exc:
            raise refuse("bpftrace", "privileged_helper", f": {exc}") from None

    @property
    def helper_argv(self) -> list[str]:
        argv = shlex.split(self.privileged_helper)
        # sudo must never wait for a password: -n makes it fail instead (stdin is /dev/null anyway).
        if argv and os.path.basename(argv[0]) == "sudo" and not {"-n", "--non-interactive"} & set(argv):
            argv.insert(1, "-n")
        return argv

    def command(self, *args: str) -> list[str]:
        return [*self.helper_argv, self.path, *args]

    @property
    def confined(self) -> bool:
        """Runs go into the Landlock sandbox (not possible through a privileged helper such as sudo)."""
        return not self.helper_argv and sandbox.landlock_abi() > 0

    def self_stop_s(self, timeout_s: float) -> float:
        """When a run ends by itself (SIGINT from the launcher's watchdog) should diagd not stop it:
        diagd stops it at `timeout_s` after the attach, which comes within start_timeout_s."""
        return self.start_timeout_s + timeout_s + SELF_STOP_MARGIN_S

    def run_command(self, program: str, output_format: str, timeout_s: float) -> list[str]:
        """The command line of one exec_program run, confined (Landlock, capabilities, the death link and
        a deadline of its own) unless a privileged helper has to start bpftrace. The program is not
        changed: its error positions and attach count stay the user's."""
        args = ["-f", output_format, *(["--unsafe"] if self.allow_unsafe else []), "-e", program]
        if self.helper_argv:
            return self.command(*args)
        policy = sandbox.bpftrace_policy(unsafe=self.allow_unsafe, deadline_s=self.self_stop_s(timeout_s))
        try:
            return sandbox.wrap([self.path, *args], policy)
        except FileNotFoundError:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {self.path!r}",
                             fix=system.APT_HINT.format(pkg="bpftrace")) from None

    def stop_steps(self, probes: int | None) -> tuple[Step, Step]:
        """SIGINT, then SIGKILL: both waits grow with the probes bpftrace must detach."""
        per_probe = self.stop_s_per_probe * (probes or 0)
        return (Step("sigint", signal.SIGINT, min(self.stop_grace_s + per_probe, MAX_SIGINT_GRACE_S)),
                Step("sigkill", signal.SIGKILL, min(5.0 + per_probe, MAX_KILL_WAIT_S)))


def check_privileges(settings: BpftraceSettings) -> None:
    """Refuse early, saying what is needed, when bpftrace cannot possibly load programs."""
    if settings.helper_argv:
        return  # the helper (sudo -n ...) decides; its refusal is mapped from its stderr
    check = system.check_bpf_privileges()
    if not check.ok:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"bpftrace needs privileges: {check.detail}; bpftrace 0.17 "
                         "runs only as root (euid 0)", fix=check.fix)


# -- running a program: what is refused everywhere, and where it cannot be confined --------------------

SELF_STOP_MARGIN_S = 5.0

def file_helpers(program: str) -> list[str]:
    """The file-reading features a program uses: cat() at run time, #include at compile time (read as the
    C preprocessor reads it: see `directives`)."""
    reading = directives.read(program)
    return sorted({*(["#include"] if reading.includes else []), *(["cat()"] if reading.cat else [])})


def check_program(settings: BpftraceSettings, program: str) -> None:
    """What exec_program refuses before bpftrace sees the program: preprocessor directives outside the
    allow-list and the operators that reach files (everywhere, Landlock or not), then the file helpers
    where the run would not be confined."""
    directives.check(program)
    check_confinement(settings, program)


def check_confinement(settings: BpftraceSettings, program: str) -> None:
    """Refuse file helpers when the run would not be inside the Landlock sandbox."""
    used = file_helpers(program)
    if not used or settings.confined or settings.allow_unconfined:
        return
    if settings.helper_argv:
        raise DiagdError(ErrorCode.PERMISSION_DENIED,
                         f"{' and '.join(used)} refused: bpftrace runs through privileged_helper "
                         f"{settings.privileged_helper!r}, which cannot run inside the sandbox (no_new_privs stops "
                         "sudo), so it would read any file as root", setting="[bpftrace] allow_unconfined",
                         hint="run diagd as root without privileged_helper, or set [bpftrace] allow_unconfined = true")
    sandbox.require_confinement(f"bpftrace {' and '.join(used)}", allowed_unconfined=False,
                                 setting="[bpftrace] allow_unconfined")


def check_reload(old: BackendConfig, new: BackendConfig) -> list[dict[str, Any]]:
    """`diagd reload`: refuse a broken [bpftrace] table (the old config stays). What a change does not
    reach (running executions keep theirs) is its DEFERRED, declared with Runtime.defer_on_reload."""
    BpftraceSettings.parse(new.table)
    return []
