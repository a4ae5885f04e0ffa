"""The crash and drgn tools' replies as models: what each tool returns (its outputSchema is generated from them).

The session table, the back end, the session actor's command results, the triage report and the
output store are annotated with these, so mypy checks them; the schemas come from actors/replies.py.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypeVar

from typing_extensions import TypedDict


class SessionNotes(TypedDict):
    """What the back end adds to a session actor's answer (`CrashBackend.ask`): the models of the
    messages a session is asked extend it."""

    session_restarted: NotRequired[dict[str, object]]
    """crash had died and was started again for this call: why, and what state was lost"""
    session_reopened: NotRequired[dict[str, object]]
    """the session was reopened after a daemon restart (told once per client): state set before (set, drgn
    variables) is gone"""


NotedT = TypeVar("NotedT", bound=SessionNotes)  # a session message's reply, noted on its way back


class CommandResult(SessionNotes):
    """A crash command's or drgn code's output: the first lines inline, a command_id for the rest."""

    session_id: str
    """the session it ran in"""
    engine: str
    """crash or drgn"""
    command: str
    """the command as run (drgn: the code, or the script's label)"""
    command_id: str
    """page or search the whole output with it"""
    output: str
    """the first lines (max_lines)"""
    lines_returned: int
    """lines in output"""
    total_lines: int
    """lines of the whole output"""
    truncated: bool
    """more lines than shown here: page them"""
    cached: bool
    """the output of an earlier identical command (force_execute runs it again)"""
    context: dict[str, Any] | None
    """the task crash's command ran in (set <pid>), if known"""
    duration_ms: float
    """how long it ran"""
    output_truncated: NotRequired[bool]
    """the stored output itself was cut at [crash] max_output_bytes"""
    truncated_reason: NotRequired[str | None]
    """why the stored output was cut"""


class OpenReply(TypedDict):
    """The session opened (or joined)."""

    session_id: str
    """name it in later calls (default: your last opened)"""
    workdir: str
    """the session's directory (outputs, logs)"""
    is_new: bool
    """crash was started for this call"""
    joined: bool
    """an open session of the same dump was joined"""
    refcount: int
    """clients holding the session"""
    state: str
    """the session's state (ready)"""
    vmcore: str
    """the dump the session uses"""
    vmlinux: str
    """the vmlinux the session uses"""
    match: list[str]
    """how the vmlinux was checked to match the dump"""
    summary: dict[str, Any]
    """system (crash's sys), panic, release, panic_task, crash_version, crash_load_s, crash_warnings, drgn,
    limits, sys_command_id"""
    requested: NotRequired[dict[str, str]]
    """the paths this call named, when it joined a session opened under others"""
    note: NotRequired[str]
    """what joining meant"""
    reference: NotRequired[str]
    """a one-command client: how long the session stays open"""


class CloseReply(TypedDict):
    """What closing did: the reference dropped, or the session stopped."""

    session_id: str
    """the session"""
    closed: bool
    """the session is closed (false: others still hold it)"""
    state: str
    """the session's state now"""
    refcount: int
    """references left"""
    workdir: str
    """the session's directory (outputs stay)"""
    held_by: NotRequired[list[str]]
    """the clients still holding it"""
    dropped_reference_of: NotRequired[str | None]
    """the client whose reference was dropped"""
    stopped: NotRequired[dict[str, str]]
    """how each child process ended (quit, sigterm, sigkill)"""
    note: str
    """what happened"""


class SessionInfo(TypedDict):
    """One session of this daemon."""

    session_id: str
    """the session's id"""
    state: str
    """opening, ready, failed, closed, expired or stopped"""
    refcount: int
    """clients holding it"""
    held_by: list[str]
    """those clients"""
    vmcore: str
    """the dump"""
    vmlinux: str
    """its vmlinux"""
    workdir: str
    """the session's directory"""
    crash_args: list[str]
    """crash's extra arguments"""
    created: str
    """when it was opened, ISO 8601 UTC"""
    error: NotRequired[str]
    """why it failed"""
    crash: NotRequired[str]
    """crash's phase"""
    drgn: NotRequired[str]
    """the drgn worker's phase"""
    commands: NotRequired[int]
    """commands run"""


class ListReply(TypedDict):
    sessions: list[SessionInfo]
    """newest first"""
    default_for_this_client: str | None
    """the session your calls use without session_id"""


class OutputPage(TypedDict):
    """A page of lines of a stored output."""

    command_id: str
    """the output"""
    command: str | None
    """the command that made it"""
    engine: str | None
    """crash or drgn"""
    session_id: str | None
    """the session it ran in"""
    context: dict[str, Any] | None
    """the task crash's command ran in, if known"""
    offset: int
    """the first line of this page"""
    limit: int
    """the page size used"""
    returned: int
    """lines in this page"""
    total_lines: int
    """lines of the whole output"""
    output: str
    """the lines"""
    has_more: bool
    """lines past this page"""
    next_offset: int | None
    """offset of the next page (null: the end)"""


class Match(TypedDict):
    line_number: int
    """0-based line of the output"""
    line: str
    """the line"""
    before: NotRequired[list[str]]
    """context_lines before it"""
    after: NotRequired[list[str]]
    """context_lines after it"""


class SearchReply(TypedDict):
    """Where a pattern occurs in a stored output."""

    command_id: str
    """the output searched"""
    command: str | None
    """the command that made it"""
    query: str
    """the pattern"""
    total_lines: int
    """lines of the output"""
    match_count: int
    """matching lines (all, not only those returned)"""
    matches: list[Match]
    """up to max_matches"""
    truncated: bool
    """more lines match than returned"""


class LogTail(TypedDict):
    command_id: str
    """the whole log (page it)"""
    total_lines: int
    """lines of the log"""
    lines: list[str]
    """its last lines ([crash] log_tail_lines)"""


class TriageReply(SessionNotes):
    """get_crash_info's triage report."""

    session_id: str
    """the session"""
    system: dict[str, str]
    """crash's sys, by field"""
    panic: str | None
    """the panic string"""
    panic_task: dict[str, Any] | None
    """the task that panicked (pid, command, cpu, task address)"""
    backtrace: dict[str, Any]
    """the panic task's bt: command_id, command, frames, functions, text"""
    log_tail: LogTail
    """the end of the kernel log"""
    memory: dict[str, Any]
    """kmem -i by row, with its command_id"""
    tasks: dict[str, Any]
    """ps summarized (crash), drgn's view of all tasks (drgn), the ps command_id"""
    limits: list[Any]
    """what this dump or session cannot show"""
    next_steps: list[str]
    """calls that dig further"""


class Script(TypedDict):
    name: str
    """run it by this name"""
    path: str
    """its file"""
    description: str
    """its docstring's first line"""
    bytes: int
    """its size"""


class ScriptsReply(TypedDict):
    scripts: list[Script]
    """the scripts, by directory order"""
    dirs: list[str]
    """[crash] script_dirs"""


class ModuleDirReply(TypedDict):
    """Modules' debug info loaded from a directory of .ko files."""

    session_id: str
    """the session"""
    dir: str
    """the directory read"""
    modules: list[str]
    """crash's answer for each file (mod -s)"""
    drgn: dict[str, Any]
    """drgn's load_debug_info result (a command result, or the error)"""
    files: list[str]
    """the .ko files offered"""
    left_out: NotRequired[list[str]]
    """files not offered, and why"""
