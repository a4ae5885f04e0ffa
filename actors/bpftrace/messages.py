"""What the tools ask a live execution's actor: frozen messages, dispatched by `match` in
`BpftraceExecution.handle`. Waiting for output or the end is not a message (the actor serves one
request at a time, so a long poll would hold up a stop): the tools wait on the run's `Execution`,
which only the actor writes (see execution.py)."""

from __future__ import annotations

from dataclasses import dataclass

from diagd.actors.bpftrace.replies import PageReply, Summary
from diagd.actors.message import Message


@dataclass(frozen=True)
class Page(Message[PageReply]):
    """get_result: the buffered output from `offset`, at most `limit` lines, with the run's state."""

    offset: int
    limit: int
    times: bool = False  # add each line's arrival time (line_ts)


@dataclass(frozen=True)
class Stop(Message[Summary]):
    """stop_execution: stop the run gracefully; answers the state at once while the stop goes on."""
