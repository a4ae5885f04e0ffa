"""What an open checked before anything is spawned (`Target`), and the part of it a session records on
disk so a later daemon can reopen the session by id, or refuse to when the files changed.

The record lives in the session's session.json (owner-only, in the back end's state dir): the paths,
the crash options, the session key (the dump's content identity with the vmlinux build id and the
options, see `identity.session_key`) and each file's stat identity. A reopen checks the paths again
under the current config and compares both: a different key (another dump, another kernel image) or a
file rewritten since (size or mtime) is refused, even when the head and tail the key hashes are alike.
The device and inode may differ (a dump restored with `cp -a`, a filesystem mounted again).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from diagd.actors._paths import resolve_allowed
from diagd.actors.crash import identity as ident
from diagd.actors.crash.settings import CrashSettings, validate_crash_args
from diagd.actors.tooling import CallContext
from diagd.protocol.errors import DiagdError, ErrorCode

StatIdentity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns (identity.stat_identity)
_FIELDS = ("dev", "ino", "size", "mtime_ns")
_COMPARED = ("size", "mtime_ns")


@dataclass(frozen=True)
class Target:
    """A vmcore and vmlinux resolved under allowed_dirs, identified and checked to match."""

    vmcore: Path
    vmlinux: Path
    crash_args: list[str]
    binary: str  # the crash executable
    dump: ident.DumpInfo
    vml: ident.VmlinuxInfo
    vmcore_id: StatIdentity
    vmlinux_id: StatIdentity
    match: list[str]  # how the vmlinux was found to match the dump
    key: str  # the session key: same dump content + kernel image + options -> same session

    def files(self) -> dict[str, dict[str, int]]:
        """The stat identities session.json records under "files"."""
        return {"vmcore": dict(zip(_FIELDS, self.vmcore_id, strict=True)),
                "vmlinux": dict(zip(_FIELDS, self.vmlinux_id, strict=True))}


class Identities:
    """Dump and vmlinux identities read from their headers, cached per stat identity."""

    def __init__(self) -> None:
        self._dumps: dict[StatIdentity, ident.DumpInfo] = {}
        self._vmlinuxes: dict[StatIdentity, ident.VmlinuxInfo] = {}

    async def identify(self, vmcore: Path, vmlinux: Path
                       ) -> tuple[ident.DumpInfo, ident.VmlinuxInfo, StatIdentity, StatIdentity]:
        def work() -> tuple[ident.DumpInfo, ident.VmlinuxInfo, StatIdentity, StatIdentity]:
            d_id, v_id = ident.stat_identity(vmcore), ident.stat_identity(vmlinux)
            dump = self._dumps.get(d_id) or ident.read_dump_info(vmcore)
            vml = self._vmlinuxes.get(v_id) or ident.read_vmlinux_info(vmlinux)
            self._dumps[d_id], self._vmlinuxes[v_id] = dump, vml
            return dump, vml, d_id, v_id

        return await trio.to_thread.run_sync(work)

    async def check(self, ctx: CallContext, s: CrashSettings, vmcore_path: str, vmlinux_path: str,
                    options: list[str], *, private_dirs: Sequence[str] = ()) -> Target:
        """Resolve the paths under `s.allowed_dirs` (never in diagd's `private_dirs`), check the options,
        identify both files and check that the vmlinux is the dumped kernel's: everything an open does
        before it spawns anything."""
        vmcore = resolve_allowed(vmcore_path, s.allowed_dirs, what="vmcore", cwd=ctx.cwd, private_dirs=private_dirs)
        if ident.is_forbidden_source(vmcore):
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{vmcore} is the live system, not a dump: refused",
                             path=str(vmcore))
        vmlinux = resolve_allowed(vmlinux_path, s.allowed_dirs, what="vmlinux", cwd=ctx.cwd,
                                  private_dirs=private_dirs)
        crash_args = validate_crash_args(options)
        binary = shutil.which(s.crash_binary)
        if binary is None:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{s.crash_binary} is not installed",
                             fix="apt-get install crash (scripts/setup.sh does it)")
        await ctx.report_progress(0, None, "checking that vmlinux matches the dump")
        dump, vml, vmcore_id, vml_id = await self.identify(vmcore, vmlinux)
        match = ident.check_match(dump, vml)  # refuses a wrong vmlinux before anything is spawned
        return Target(vmcore, vmlinux, crash_args, binary, dump, vml, vmcore_id, vml_id, match,
                      ident.session_key(dump, vml, vml_id, crash_args))


def changes(meta: dict[str, Any], target: Target) -> list[str]:
    """How `target` differs from what session.json recorded (empty: the same files, reopen it)."""
    found = []
    if meta.get("key") != target.key:
        found.append(f"the content identity of {target.vmcore} + {target.vmlinux} is not the session's "
                     "(another dump or kernel image is at these paths now)")
    recorded = meta.get("files") or {}
    now = target.files()
    for name in ("vmcore", "vmlinux"):
        was, cur = recorded.get(name) or {}, now[name]
        diff = [f"{f} {was.get(f)} -> {cur[f]}" for f in _COMPARED if was.get(f) != cur[f]]
        if diff:
            found.append(f"{name} was rewritten since the session was opened ({', '.join(diff)})")
    return found
