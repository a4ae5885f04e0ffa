"""A test-only back end, and the smallest complete one: settings, messages, an actor, tools, declarations.

Loaded into a real daemon with `[daemon] extra_backends = ["echo_actor"]` (tests/support on
PYTHONPATH), or installed as a `diagd.backends` entry point (tests/e2e/test_discovery.py), so the
whole path (MCP socket, supervisor, actor, audit) is exercised end to end; it declares what any back
end does (instructions, a diagd_timeline source);
tests/support/fake_runtime.py runs it without a daemon. Its knobs (delays, crashes, progress, big
results, a child process) are what those tests need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from diagd.actors.base import Actor, BackendFault, Request, SupervisionPolicy, unhandled
from diagd.actors.message import Message
from diagd.actors.runtime import Runtime
from diagd.actors.settings import parse_table
from diagd.actors.timeline_source import Caller, Read, Source, TimelineSource, Window, row
from diagd.actors.tooling import CallContext, ToolSet
from diagd.protocol.errors import DiagdError, ErrorCode

KIND = "echo"


class EchoReply(TypedDict):
    """The message repeated by the resource's actor (the tool's reply model: its outputSchema)."""

    message: str
    """the message, after [echo_actor] prefix"""
    resource: str
    """the actor's resource"""
    blob: NotRequired[str]
    """big: that many bytes of x"""
    truncated: NotRequired[bool]
    """big: false (the registry cuts a reply over the limit)"""
    child_pid: NotRequired[int]
    """a resource named child...: the sleep child process the actor holds"""


@dataclass(frozen=True)
class EchoSettings:
    """The [echo_actor] table (the back end's name is its module's)."""

    prefix: str = ""  # put before every echoed message


# -- messages: what the tools ask the actor -------------------------------------------------------


@dataclass(frozen=True)
class Echo(Message[EchoReply]):  # its reply: what `Runtime.ask` returns for it
    message: str
    delay_s: float = 0.0
    progress_steps: int = 0
    big: int = 0  # bytes of padding in the answer


@dataclass(frozen=True)
class Crash(Message[EchoReply]):
    """Its back end fails under the call (BackendFault, as a child's death): the actor is restarted by its
    policy. (A bug in a handler would only fail its call, with INTERNAL_ERROR.)"""


# -- the actor: one per resource ----------------------------------------------------------------


class EchoActor(Actor):
    kind = KIND
    policy = SupervisionPolicy(max_restarts=2, window_s=30, backoff_s=0.01)

    def __init__(self, resource: str) -> None:
        super().__init__(resource)
        self.echoed = 0
        self.child: trio.Process | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        if self.resource.startswith("broken"):
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot open {self.resource}")
        if self.resource.startswith("child"):
            # A real child process, so tests can check the daemon reaps it on shutdown.
            self.child = await trio.lowlevel.open_process(["sleep", "3600"])

    async def handle(self, request: Request) -> dict[str, Any]:
        match request.message:
            case Echo() as echo:
                return echo.reply(await self._echo(request, echo))
            case Crash():
                raise BackendFault("echo actor asked to crash")
        raise unhandled("echo", request)

    async def _echo(self, request: Request, echo: Echo) -> EchoReply:
        for i in range(echo.progress_steps):
            await request.report_progress(i + 1, echo.progress_steps, f"step {i + 1}")
            await trio.sleep(echo.delay_s / echo.progress_steps)
        if not echo.progress_steps:
            await trio.sleep(echo.delay_s)
        self.echoed += 1
        result: EchoReply = {"message": echo.message, "resource": self.resource}
        if echo.big:
            result |= {"blob": "x" * echo.big, "truncated": False}
        if self.child is not None:
            result["child_pid"] = self.child.pid
        return result

    async def stop(self) -> None:
        if self.child is not None:
            self.child.terminate()
            await self.child.wait()

    def statistics(self) -> dict[str, Any]:
        return {"echoed": self.echoed}


# -- the back end's state, and its tools: build a message, shape the reply ----------------------


class EchoBackend:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def settings(self) -> EchoSettings:
        return parse_table(EchoSettings, self.runtime.name, self.runtime.config().table)  # a reload applies


tools: ToolSet[EchoBackend] = ToolSet()


@tools.tool("echo", "Echo a message through a per-resource actor (test back end).",
            {"message": {"type": "string"},
             "resource": {"type": "string", "default": "default"},
             "delay_s": {"type": "number", "minimum": 0, "maximum": 60, "default": 0},
             "progress_steps": {"type": "integer", "minimum": 0, "maximum": 100, "default": 0},
             "crash": {"type": "boolean", "default": False},
             "big": {"type": "integer", "minimum": 0, "default": 0}},
            required=("message",))
async def echo(backend: EchoBackend, ctx: CallContext, args: dict[str, Any]) -> EchoReply:
    resource = args["resource"]
    ref = await backend.runtime.start(KIND, resource, lambda: EchoActor(resource))
    message = Crash() if args["crash"] else Echo(backend.settings().prefix + args["message"], args["delay_s"],
                                                  args["progress_steps"], args["big"])
    return await backend.runtime.ask(ref, message, progress=ctx.progress)


# -- what it declares: its paragraph of the instructions, and a diagd_timeline source --------------

INSTRUCTIONS = "echo (a test back end): echo repeats a message through a per-resource actor.\n"


def _timeline_options(item: dict[str, Any], path: str) -> dict[str, Any]:
    at = item.get("at", 0)
    if isinstance(at, bool) or not isinstance(at, int | float):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{path}.at: Unix seconds", path=f"{path}.at")
    return {"at": float(at)}


async def _read_timeline(call: Caller, source: Source, window: Window) -> Read:
    """`{"echo_actor": MESSAGE, "at": UNIX_S}`: one row at `at`, the message as the echo tool answers it."""
    answer = await call("echo", {"message": source.ref, "resource": "timeline"})
    out = Read()
    if window.holds(source.options["at"] + source.shift_s):
        out.rows.append(row(source, source.options["at"], echo=answer["message"]))
    else:
        out.note = "the echo is outside the window"
    return out


TIMELINE = TimelineSource(_read_timeline, rows="echoed messages", names="message", example="hello",
                          options=("at",), parse=_timeline_options)


def register(runtime: Runtime) -> EchoBackend:
    backend = EchoBackend(runtime)
    tools.register(runtime, backend)
    runtime.set_instructions(INSTRUCTIONS)
    runtime.add_timeline_source(TIMELINE)
    return backend
