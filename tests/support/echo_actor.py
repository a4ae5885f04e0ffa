"""A test-only back end: one echo actor per resource, with knobs for delays, crashes and progress.

Loaded into a real daemon with `[daemon] extra_backends = ["echo_actor"]` (tests/support on
PYTHONPATH), so the whole path (MCP socket, supervisor, actor, audit) is exercised end to end.
"""

from __future__ import annotations

from typing import Any

import trio

from diagd.actors.base import Actor, Op, Request, SupervisionPolicy
from diagd.actors.runtime import Runtime
from diagd.actors.tooling import CallContext, ToolSpec
from diagd.protocol.errors import DiagdError, ErrorCode


class EchoActor(Actor):
    kind = "echo"
    policy = SupervisionPolicy(max_restarts=2, window_s=30, backoff_s=0.01)

    def __init__(self, resource: str, settings: Any = None) -> None:
        super().__init__(resource, settings)
        self.echoed = 0
        self.child: trio.Process | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        if self.resource.startswith("broken"):
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, f"cannot open {self.resource}")
        if self.resource.startswith("child"):
            # A real child process, so tests can check the daemon reaps it on shutdown.
            self.child = await trio.lowlevel.open_process(["sleep", "3600"])

    async def handle(self, request: Request) -> dict[str, Any]:
        args = request.args
        if request.op == "crash":
            raise RuntimeError("echo actor asked to crash")
        steps = int(args.get("progress_steps", 0))
        delay = float(args.get("delay_s", 0))
        for i in range(steps):
            await request.report_progress(i + 1, steps, f"step {i + 1}")
            await trio.sleep(delay / max(steps, 1))
        if not steps and delay:
            await trio.sleep(delay)
        self.echoed += 1
        result: dict[str, Any] = {"message": args.get("message", ""), "resource": self.resource}
        if args.get("big"):
            result["blob"] = "x" * int(args["big"])
            result["truncated"] = False
        if self.child is not None:
            result["child_pid"] = self.child.pid
        return result

    async def stop(self) -> None:
        if self.child is not None:
            self.child.terminate()
            await self.child.wait()

    def statistics(self) -> dict[str, Any]:
        return {"echoed": self.echoed}


def register(runtime: Runtime) -> None:
    async def echo(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        resource = args.get("resource", "default")
        ref = await runtime.start("echo", resource, lambda: EchoActor(resource))
        result = await runtime.ask(ref, Op("crash" if args.get("crash") else "echo", args), progress=ctx.progress)
        return dict(result)

    runtime.register_tool(ToolSpec(
        name="echo",
        description="Echo a message through a per-resource actor (test back end).",
        input_schema={
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "resource": {"type": "string"},
                "delay_s": {"type": "number", "minimum": 0, "maximum": 60},
                "progress_steps": {"type": "integer", "minimum": 0, "maximum": 100},
                "crash": {"type": "boolean"},
                "big": {"type": "integer", "minimum": 0},
            },
            "required": ["message"],
            "additionalProperties": False,
        },
        output_schema={"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
        handler=echo,
    ))
