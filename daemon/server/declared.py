"""What the back ends declared through their runtimes, for the daemon's parts that speak of them.

Each back end declares, in its `register(runtime)`: its paragraph of the MCP instructions, its
diagd_timeline source, its part of `diagd status`, the settings a reload leaves to a reopen, whether
other groups read its exports, the `<name>:<id>` references it resolves, why it serves nothing when
its config leaves it off, the other groups' tools it calls (`diagd.actors.runtime.Runtime`). The daemon keeps
them here, by back-end name, and reads nothing else: it names no back end, tool or back-end setting.

The tools a back end calls are checked twice: once every back end is loaded, each declaration against
the tool's inputSchema (`check_uses`: a renamed tool or argument stops the start, not a call), and at
each `Runtime.call`, the call against the declaration (`check_call`: a call not declared is refused).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from diagd.actors.runtime import Deferred, Resolved, Resolver, StatusSection, ToolUse
from diagd.actors.timeline_source import TimelineSource
from diagd.actors.tooling import ToolSpec, caller_selects
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass
class Declarations:
    instructions: dict[str, str] = field(default_factory=dict)  # back end -> its paragraph
    timeline: dict[str, TimelineSource] = field(default_factory=dict)  # source kind (a back end) -> its adapter
    status: dict[str, StatusSection] = field(default_factory=dict)  # back end -> its part of `diagd status`
    deferred: dict[str, list[Deferred]] = field(default_factory=dict)  # back end -> settings a reload defers
    exporting: list[str] = field(default_factory=list)  # back ends whose $state/<name>/exports others read
    references: dict[str, Resolver] = field(default_factory=dict)  # back end -> its `<name>:<id>` resolver
    # back end -> {"reason": ..., "hint": ...}: it serves nothing under this config (`diagd tools`, `client add`)
    off: dict[str, dict[str, str]] = field(default_factory=dict)
    uses: dict[str, dict[str, ToolUse]] = field(default_factory=dict)  # back end -> tool it calls -> how

    def use(self, backend: str, use: ToolUse) -> None:
        """`backend` calls `use.tool` (Runtime.uses_tool); a second declaration of one tool adds its arguments."""
        known = self.uses.setdefault(backend, {})
        before = known.get(use.tool)
        if before is not None:
            if before.group != use.group:
                raise ValueError(f"{backend}: {use.tool} declared of two groups ({before.group}, {use.group})")
            use = ToolUse(use.group, use.tool, tuple(dict.fromkeys((*before.arguments, *use.arguments))),
                          before.forwards or use.forwards)
        known[use.tool] = use

    def check_uses(self, specs: Iterable[ToolSpec]) -> None:
        """Refuse the start (BACKEND_UNAVAILABLE) when a tool a back end declared it calls is not registered in
        the group declared, or does not take an argument declared, or needs one the back end never passes;
        a use of a group that declared itself off is left (its tools are not there to call)."""
        tools = {spec.name: spec for spec in specs}
        for backend, uses in self.uses.items():
            for use in uses.values():
                if use.group not in self.off:
                    _check_use(backend, use, tools.get(use.tool))

    def check_call(self, backend: str, tool: str, arguments: Iterable[str]) -> None:
        """Refuse (INTERNAL_ERROR) a `Runtime.call` of `backend` that its declarations do not cover."""
        use = self.uses.get(backend, {}).get(tool)
        if use is None:
            raise DiagdError(ErrorCode.INTERNAL_ERROR, f"the {backend} back end called {tool}, which it did not "
                             "declare (Runtime.uses_tool)", backend=backend, tool=tool)
        undeclared = [name for name in arguments if name not in use.arguments]
        if undeclared and not use.forwards:
            raise DiagdError(ErrorCode.INTERNAL_ERROR, f"the {backend} back end called {tool} with "
                             f"{undeclared[0]!r}, an argument it did not declare (Runtime.uses_tool)",
                             backend=backend, tool=tool, argument=undeclared[0], declared=list(use.arguments))

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


def _check_use(backend: str, use: ToolUse, spec: ToolSpec | None) -> None:
    where = f"the {backend} back end calls {use.tool} of the {use.group} group"
    details = {"backend": backend, "tool": use.tool, "group": use.group,
               "hint": "install back ends of matching versions (in a checkout: pip install -e .)"}
    if spec is None or spec.group != use.group:
        found = f"the {spec.group} group has it" if spec is not None else "no back end registered it"
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{where}, but {found}", **details)
    takes = spec.input_schema.get("properties", {})
    unknown = [name for name in use.arguments if name not in takes]
    if unknown:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{where} with the argument {unknown[0]!r}, which "
                         f"{use.tool} does not take (it takes {', '.join(takes) or 'none'})", argument=unknown[0],
                         arguments=list(takes), **details)
    missing = [] if use.forwards else [n for n in spec.input_schema.get("required", ()) if n not in use.arguments]
    if missing:
        raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"{where} without {missing[0]!r}, an argument "
                         f"{use.tool} requires", argument=missing[0], arguments=list(takes), **details)
