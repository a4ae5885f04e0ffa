"""The crash back end's configuration: the [crash] section and the crash options a caller may pass.

`CrashSettings.from_raw` turns the raw [crash] table into typed settings (`actors/settings.py`
refuses unknown keys and values of the wrong kind or out of bounds). `validate_crash_args`
allow-lists crash's own options: only those that change how the dump is read; input files,
live-system switches, output files and extra positional paths are refused, since the dump and
vmlinux come in as checked paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diagd.actors.crash.store import MAX_PAGE_LINES
from diagd.actors.settings import parse_table, setting
from diagd.protocol.errors import DiagdError, ErrorCode

# crash options that only change how the dump is read; anything else (input files, live-system
# switches, output files, positional paths) is refused.
CRASH_FLAGS = frozenset({"--no_kallsyms", "--no_modules", "--no_ikconf", "--no_data_debug", "--no_kmem_cache",
                         "--no_elf_notes", "--kmem_cache_delay", "--readnow", "--smp", "--zero_excluded",
                         "--no_panic", "--hex", "--dec", "--no_strip", "--minimal", "--active"})
CRASH_VALUED = frozenset({"--machdep", "-m", "--cpus", "--kaslr", "--reloc", "--hash", "--offline", "-p"})


@dataclass(frozen=True)
class CrashSettings:
    allowed_dirs: tuple[str, ...] = ()  # default: [daemon] allowed_dirs
    crash_binary: str = "crash"
    idle_timeout_s: float = setting(1800.0, positive=True)
    load_timeout_s: float = setting(180.0, positive=True)
    command_timeout_s: float = setting(120.0, positive=True)
    drgn_timeout_s: float = setting(60.0, positive=True)
    interrupt_grace_s: float = setting(10.0, minimum=0)
    output_lines: int = setting(20, minimum=1, maximum=MAX_PAGE_LINES)
    max_output_bytes: int = setting(64 * 1024 * 1024, positive=True)
    max_sessions: int = setting(4, positive=True)
    keep_sessions: int = setting(50, minimum=0)
    log_tail_lines: int = setting(40, minimum=0)
    script_dirs: tuple[str, ...] = ()
    allow_shell: bool = False
    allow_extend: bool = False
    # Where Landlock is unavailable, gdb passthrough and drgn code are refused (they would run as the
    # daemon's user with no sandbox); true accepts that risk.
    allow_unconfined: bool = False
    # crash and drgn run in namespaces of their own (bubblewrap) where they can write only a tmpfs of
    # this size (crash's temporary files, what drgn code writes); outputs are stored by the daemon.
    scratch_mb: int = setting(256, minimum=1, maximum=65536)
    pykdump_path: str = ""
    drgn: bool = True

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any], daemon_allowed: tuple[str, ...] = ()) -> CrashSettings:
        return parse_table(cls, "crash", raw, inherited={"allowed_dirs": daemon_allowed})


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
