"""The bpftrace tools' replies as models: what each tool returns (its outputSchema is generated from them).

`Execution.page`/`summary`, the back end's helper table and the handlers in tools.py are annotated
with these, so mypy checks them; the schemas come from actors/replies.py.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

from diagd.actors.bpftrace.status import Status, StopReason

OutputFormat = Literal["text", "json"]
HelperKind = Literal["builtin", "map_function", "function"]


class ExecutionState(TypedDict):
    """How a run went so far (or ended)."""

    exit_code: int | None
    """bpftrace's exit status; null while it runs or when it was killed by a signal"""
    signal: str | None
    """the signal that ended bpftrace, if one did"""
    error: str | None
    """why the run failed, if it did"""
    warnings: list[str]
    """bpftrace's warnings"""
    notices: list[str]
    """what diagd noticed about the run (not errors)"""
    buffer_full: bool
    """the output buffer filled up, so the run was stopped"""
    lines_dropped: int
    """output lines not kept (past the buffer)"""
    truncated: bool
    """the output is cut short (same as buffer_full)"""
    lost_events: int
    """events the kernel lost (bpftrace's 'Lost N events')"""
    attached_probes: int | None
    """probes attached; null until bpftrace says"""
    stop_reason: StopReason | None
    """why the run was stopped, if it was"""
    stopping: bool
    """a stop was asked and the run has not ended yet"""
    timeout_s: float
    """the run's duration: then SIGINT, END runs"""
    elapsed_s: float
    """seconds since the start (to the end, once ended)"""
    created_at: str | None
    """the start, ISO 8601 UTC"""
    ended_at: str | None
    """the end, ISO 8601 UTC; null while it runs"""


class Summary(ExecutionState):
    """One execution: its state, program and line count."""

    execution_id: str
    """the execution's id"""
    status: Status
    """running, or how it ended"""
    program: str
    """the program (its first 200 characters)"""
    output_format: OutputFormat
    """text, or json (maps as data)"""
    lines_total: int
    """output lines kept"""


class StopReply(Summary):
    already_finished: bool
    """the run had ended before this call"""


class Times(TypedDict, total=False):
    line_ts: list[float] | None
    """with times: each line's arrival, epoch seconds (null: recorded without times)"""


class PageReply(ExecutionState, Times):
    """A page of an execution's output, with its state."""

    execution_id: str
    """the execution's id"""
    status: Status
    """running, or how it ended"""
    output_format: OutputFormat
    """text, or json (output lines and maps as data)"""
    offset: int
    """the first line of this page"""
    lines_total: int
    """output lines kept"""
    lines_returned: int
    """lines in this page"""
    output: list[str | dict[str, Any]]
    """the lines: text, or one parsed JSON event each (json runs)"""
    has_more: bool
    """lines past this page are kept"""
    next_offset: int
    """offset of the next page"""
    maps: dict[str, Any] | None
    """json runs: each map's last printed value (null for text runs)"""


class ExecReply(TypedDict):
    """A started execution (its probes attached), or one refused at once."""

    execution_id: str
    """page its output with get_result"""
    status: Status
    """running, or how it ended already"""
    attached_probes: int | None
    """probes attached"""
    timeout_s: float
    """how long it traces before SIGINT"""
    output_format: OutputFormat
    """text or json"""
    pid: int | None
    """bpftrace's process id"""
    lines_total: int
    """output lines so far"""
    hint: str
    """what to call next"""
    first_page: NotRequired[PageReply]
    """wait_s: the output's first page once it came (or the run ended, or wait_s passed), as get_result"""


class ProbesReply(TypedDict):
    """A page of the probes bpftrace lists."""

    probes: list[str]
    """probe names"""
    args: NotRequired[dict[str, list[str]]]
    """with_args: tracepoint -> its fields"""
    total: int
    """probes matching the filter"""
    offset: int
    """the first probe of this page"""
    returned: int
    """probes in this page"""
    has_more: bool
    """probes past this page match"""
    next_offset: int
    """offset of the next page"""
    filter: str | None
    """the filter applied"""
    tracefs_mounted: bool
    """false: tracepoints cannot be listed or attached"""
    warnings: list[str]
    """what bpftrace or diagd warned about the listing"""


class HelperInfo(TypedDict):
    """A builtin or function of bpftrace."""

    name: str
    """its name"""
    kind: HelperKind
    """builtin, map_function or function"""
    description: str
    """what it does"""
    signatures: NotRequired[list[str]]
    """how it is called"""
    flags: NotRequired[list[str]]
    """unsafe, async, compile_time"""
    type: NotRequired[str]
    """builtins: the value's type"""


class HelpersReply(TypedDict):
    """The builtins and functions of the installed bpftrace."""

    bpftrace_version: str
    """bpftrace --version"""
    source: str
    """where the table comes from, and whether names were checked against the binary"""
    total: int
    """helpers returned"""
    helpers: list[HelperInfo]
    """the helpers matching kind and name"""
    not_in_installed_binary: list[str]
    """names of the table the installed binary lacks (dropped)"""
    verified: bool
    """every name was checked against the installed binary"""
    warning: NotRequired[str]
    """the installed bpftrace is not the version the table was written for"""


class ExecutionsReply(TypedDict):
    """Executions newest first."""

    executions: list[Summary]
    """up to limit, newest first"""
    total: int
    """executions matching status"""
    running: int
    """executions running now"""
    max_concurrent: int
    """[bpftrace] max_concurrent"""
