"""Reading what an MCP SDK client's progress callback saw, without a race.

The SDK runs each progress callback in a task of its own, spawned when the notification arrives (before
the call's answer, on the same stream): the call can return before that task has run, and a session closed
at once may never run it. `delivered()` waits until every task is blocked, so each callback has run."""

from __future__ import annotations

import trio.testing


async def delivered() -> None:
    await trio.testing.wait_all_tasks_blocked()
