"""The `[bpftrace]` config table: its keys and their checks, the bpftrace command line and stop steps they
imply, and the early privilege check; parsed on every tool call, so `diagd reload` applies to the next one.
"""

from __future__ import annotations

import os
import shlex
import signal
from dataclasses import dataclass, fields
from typing import Any

from diagd.actors._subprocess import Step
from diagd.daemon import doctor
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

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> BpftraceSettings:
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
    check = doctor.check_bpf_privileges()
    if not check.ok:
        raise DiagdError(ErrorCode.PERMISSION_DENIED, f"bpftrace needs privileges: {check.detail}; bpftrace 0.17 "
                         "runs only as root (euid 0)", fix=check.fix)
