"""The `[bpftrace]` config table: its keys and their checks, the bpftrace command line and stop steps they
imply, and the early privilege check; parsed on every tool call, so `diagd reload` applies to the next one.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from diagd.actors import _confine, system
from diagd.actors._subprocess import Step
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_SIGINT_GRACE_S = 60.0
MAX_KILL_WAIT_S = 60.0


@dataclass(frozen=True)
class BpftraceSettings:
    path: str = "bpftrace"
    privileged_helper: str = ""  # e.g. "sudo -n": prefixed to every bpftrace command
    allow_unsafe: bool = False  # pass --unsafe (system(), signal(), override())
    max_run_s: float = 60.0
    default_timeout_s: float = 10.0
    max_lines: int = 10_000
    max_output_bytes: int = 16 * 1024 * 1024
    max_concurrent: int = 5
    stop_grace_s: float = 5.0  # SIGINT -> SIGKILL, plus stop_s_per_probe per attached probe
    stop_s_per_probe: float = 0.15
    start_timeout_s: float = 20.0  # exec_program waits this long for bpftrace to attach
    linger_s: float = 60.0  # a finished execution's actor stays this long, then results come from disk
    keep_executions: int = 200  # persisted executions kept on disk
    probe_cache_s: float = 30.0
    # Where bpftrace cannot be confined by Landlock (kernel without it, or privileged_helper: sudo cannot
    # run under no_new_privs), programs using its file helpers (cat(), #include) are refused; true
    # accepts that they read any file as root.
    allow_unconfined: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> BpftraceSettings:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown [bpftrace] config keys: {unknown}",
                             known=sorted(known))
        values: dict[str, Any] = {}
        for name, value in raw.items():
            default = getattr(cls, name)
            if not _same_kind(value, default):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] {name} must be "
                                 f"{_KIND_NAMES[type(default)]}", key=name, value=repr(value))
            numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
            if numeric and (value < 0 or (value == 0 and name not in _MAY_BE_ZERO)):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] {name} must be positive", key=name)
            values[name] = float(value) if isinstance(default, float) else value
        settings = cls(**values)
        if settings.default_timeout_s > settings.max_run_s:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, "[bpftrace] default_timeout_s exceeds max_run_s")
        try:
            shlex.split(settings.privileged_helper)
        except ValueError as exc:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[bpftrace] privileged_helper: {exc}") from None
        return settings

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
        return not self.helper_argv and _confine.landlock_abi() > 0

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
        policy = _confine.bpftrace_policy(unsafe=self.allow_unsafe, deadline_s=self.self_stop_s(timeout_s))
        try:
            return _confine.wrap([self.path, *args], policy)
        except FileNotFoundError:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"bpftrace not found: {self.path!r}",
                             fix=system.APT_HINT.format(pkg="bpftrace")) from None

    def stop_steps(self, probes: int | None) -> tuple[Step, Step]:
        """SIGINT, then SIGKILL: both waits grow with the probes bpftrace must detach."""
        per_probe = self.stop_s_per_probe * (probes or 0)
        return (Step("sigint", signal.SIGINT, min(self.stop_grace_s + per_probe, MAX_SIGINT_GRACE_S)),
                Step("sigkill", signal.SIGKILL, min(5.0 + per_probe, MAX_KILL_WAIT_S)))


_MAY_BE_ZERO = frozenset({"linger_s", "stop_s_per_probe"})
_KIND_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    return isinstance(value, str)


def check_privileges(settings: BpftraceSettings) -> None:
    """Refuse early, saying what is needed, when bpftrace cannot possibly load programs."""
    if settings.helper_argv:
        return  # the helper (sudo -n ...) decides; its refusal is mapped from its stderr
    check = system.check_bpf_privileges()
    if not check.ok:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"bpftrace needs privileges: {check.detail}; bpftrace 0.17 "
                         "runs only as root (euid 0)", fix=check.fix)


# -- running a program: what is refused where it cannot be confined ----------------------------------

SELF_STOP_MARGIN_S = 5.0

_COMMENTS_AND_STRINGS = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', re.S)
_FILE_HELPERS = re.compile(r"\bcat\s*\(|^\s*#\s*include\b", re.M)


def file_helpers(program: str) -> list[str]:
    """The file-reading features a program uses: cat() at run time, #include at compile time."""
    code = _COMMENTS_AND_STRINGS.sub(lambda m: '""' if m.group(0).startswith('"') else " ", program)
    return sorted({"#include" if "include" in m.group(0) else "cat()" for m in _FILE_HELPERS.finditer(code)})


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
    _confine.require_confinement(f"bpftrace {' and '.join(used)}", allowed_unconfined=False,
                                 setting="[bpftrace] allow_unconfined")
