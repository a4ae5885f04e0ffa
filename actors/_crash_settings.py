"""The crash back end's configuration: the [crash] section and the crash options a caller may pass.

`CrashSettings.from_raw` turns the raw [crash] table into typed settings, refusing unknown keys and
values of the wrong type. `validate_crash_args` allow-lists crash's own options: only those that
change how the dump is read; input files, live-system switches, output files and extra positional
paths are refused, since the dump and vmlinux come in as checked paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagd.actors._crash_store import MAX_PAGE_LINES
from diagd.protocol.errors import DiagdError, ErrorCode

# crash options that only change how the dump is read; anything else (input files, live-system
# switches, output files, positional paths) is refused.
CRASH_FLAGS = frozenset({"--no_kallsyms", "--no_modules", "--no_ikconf", "--no_data_debug", "--no_kmem_cache",
                         "--no_elf_notes", "--kmem_cache_delay", "--readnow", "--smp", "--zero_excluded",
                         "--no_panic", "--hex", "--dec", "--no_strip", "--minimal", "--active"})
CRASH_VALUED = frozenset({"--machdep", "-m", "--cpus", "--kaslr", "--reloc", "--hash", "--offline", "-p"})


@dataclass(frozen=True)
class CrashSettings:
    allowed_dirs: tuple[str, ...] = ()
    crash_binary: str = "crash"
    idle_timeout_s: float = 1800.0
    load_timeout_s: float = 180.0
    command_timeout_s: float = 120.0
    drgn_timeout_s: float = 60.0
    interrupt_grace_s: float = 10.0
    output_lines: int = 20
    max_output_bytes: int = 64 * 1024 * 1024
    max_sessions: int = 4
    keep_sessions: int = 50
    log_tail_lines: int = 40
    script_dirs: tuple[str, ...] = ()
    allow_shell: bool = False
    allow_extend: bool = False
    # Where Landlock is unavailable, gdb passthrough and drgn code are refused (they would run as the
    # daemon's user with no sandbox); true accepts that risk.
    allow_unconfined: bool = False
    pykdump_path: str = ""
    drgn: bool = True

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], daemon_allowed: tuple[str, ...] = ()) -> CrashSettings:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"unknown [crash] keys: {sorted(unknown)}",
                             known=sorted(known))
        values: dict[str, Any] = {"allowed_dirs": tuple(raw.get("allowed_dirs", daemon_allowed))}
        defaults = cls()
        for name in known - {"allowed_dirs"}:
            if name in raw:
                default = getattr(defaults, name)
                value = raw[name]
                try:
                    values[name] = tuple(str(v) for v in value) if isinstance(default, tuple) else type(default)(value)
                except (TypeError, ValueError):
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[crash] {name} must be {type(default).__name__}",
                                     value=value) from None
        settings = cls(**values)
        if not 1 <= settings.output_lines <= MAX_PAGE_LINES:
            raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"[crash] output_lines must be 1..{MAX_PAGE_LINES}")
        return settings


def validate_crash_args(raw: list[str]) -> list[str]:
    """Normalise crash options to ['--opt', 'value', ...], refusing anything outside the allow-list."""
    out: list[str] = []
    items = list(raw)
    while items:
        arg = items.pop(0)
        name, eq, value = arg.partition("=")
        if name in CRASH_FLAGS and not eq:
            out.append(name)
            continue
        if name in CRASH_VALUED:
            if not eq:
                if not items:
                    raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"crash option {name} needs a value")
                value = items.pop(0)
            if not value or not all(c.isalnum() or c in "._,:=-" for c in value):
                raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"bad value {value!r} for crash option {name}")
            out += [name, value]
            continue
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"crash option {arg!r} is not allowed",
                         allowed=sorted(CRASH_FLAGS | CRASH_VALUED),
                         hint="dump and vmlinux are given as vmcore_path/vmlinux_path; input/output files, "
                              "live-system switches and extra files are refused")
    return out
