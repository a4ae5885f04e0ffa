"""What the back ends declared through their runtimes, for the daemon's parts that speak of them.

Each back end declares, in its `register(runtime)`: its paragraph of the MCP instructions, its
diagd_timeline source, the settings a reload leaves to a reopen, whether other groups read its
exports, the `<name>:<id>` references it resolves, why it serves nothing when its config leaves it off
(`diagd.actors.runtime.Runtime`). The daemon keeps
them here, by back-end name, and reads nothing else: it names no back end, tool or back-end setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from diagd.actors.runtime import Deferred, Resolved, Resolver
from diagd.actors.timeline_source import TimelineSource
from diagd.actors.tooling import caller_selects
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass
class Declarations:
    instructions: dict[str, str] = field(default_factory=dict)  # back end -> its paragraph
    timeline: dict[str, TimelineSource] = field(default_factory=dict)  # source kind (a back end) -> its adapter
    deferred: dict[str, list[Deferred]] = field(default_factory=dict)  # back end -> settings a reload defers
    exporting: list[str] = field(default_factory=list)  # back ends whose $state/<name>/exports others read
    references: dict[str, Resolver] = field(default_factory=dict)  # back end -> its `<name>:<id>` resolver
    # back end -> {"reason": ..., "hint": ...}: it serves nothing under this config (`diagd tools`, `client add`)
    off: dict[str, dict[str, str]] = field(default_factory=dict)

    async def resolve(self, text: str) -> Resolved | None:
        """The file a `<name>:<id>` reference names (None: `text` is no reference, a path)."""
        name, colon, ident = text.partition(":")
        resolver = self.references.get(name) if colon else None
        if resolver is None:
            return None
        if not caller_selects(name):
            raise DiagdError(ErrorCode.PERMISSION_DENIED, f"{text!r} names a file of the {name!r} tool group: a "
                             f"client that selected {name!r} too reads it", reference=text, group=name,
                             hint=f"select that group too (diagd mcp --tools ...,{name})")
        return await resolver(ident)

    def exports_dirs(self, state_dir: Path | None) -> dict[str, str]:
        return {n: str(state_dir / n / "exports") for n in self.exporting} if state_dir else {}

    def timeline_summary(self) -> str:
        """What diagd_timeline merges, in words, e.g. "frames, packets and log lines"."""
        rows = [source.rows for source in self.timeline.values()]
        return ", ".join(rows[:-1]) + f" and {rows[-1]}" if len(rows) > 1 else "".join(rows) or "nothing yet"

    def timeline_schema_hint(self) -> str:
        """diagd_timeline's `sources` in a few words (every client's tools/list holds it), e.g.
        "{a|b: path|port, offset_ms?, ...}"; each kind's options are in the instructions."""
        names = "|".join(dict.fromkeys(s.names for s in self.timeline.values()))
        return "{" + f"{'|'.join(self.timeline)}: {names}, offset_ms?, ..." + "}"

    def timeline_options(self) -> str:
        """The options sources may take beyond their offset and label, e.g. "filter, fields" (each kind's own
        are listed when one is refused)."""
        return ", ".join(dict.fromkeys(o for s in self.timeline.values() for o in s.options)) or "none"
