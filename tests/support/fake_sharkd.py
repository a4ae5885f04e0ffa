"""A scripted sharkd (and early tshark) for fast unit tests of the pcap pool, passes and race on trio's MockClock.

Like httpcore's mock backend: what the pool talks to is replaced, the pool itself is the real one.
A `Script` says what the capture holds (frame count, which frames each filter matches) and how long
each thing takes in virtual seconds: loading, a filter's first pass on a worker (later requests of a
filter the worker holds are quick, as sharkd keeps a bitmap per filter), any other request, and an
early tshark's search. Each `FakeSharkd` serves one request at a time and fails the test if the pool
ever sends it two at once; abandoned mid-request it dies, as the real worker is killed then.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from diagd.actors.pcap.shark.sharkd import SharkdError
from diagd.protocol.errors import DiagdError, ErrorCode

_pids = itertools.count(10_000)


@dataclass
class Script:
    frames: int = 1000
    matches: dict[str, list[int]] = field(default_factory=dict)  # filter -> matching frames ('' is all)
    invalid: set[str] = field(default_factory=set)  # filters sharkd refuses
    # method -> (sharkd error code, message): sharkd answers that method with this JSON-RPC error, as
    # sharkd_session.c does (-13002 for a `frames` filter, -8003 for a frame out of range, ...).
    errors: dict[str, tuple[int, str]] = field(default_factory=dict)
    load_s: float = 5.0
    pass_s: float = 20.0  # a filter the worker does not hold yet costs a whole pass
    request_s: float = 0.01
    early_s: float = 0.2  # an early tshark finds the first page's matches in this long
    rss_bytes: int = 50 * 2**20
    fail_load: bool = False
    die_in_load: bool = False  # the worker is killed while it loads (sharkd dies, no answer)
    launched: list[FakeSharkd] = field(default_factory=list)
    log: list[str] = field(default_factory=list)  # "<pid> <method> [<filter>]" as each request starts
    started_at: list[float] = field(default_factory=list)  # the Trio clock at each request of `log`

    def matching(self, display_filter: str) -> list[int]:
        return list(range(1, self.frames + 1)) if not display_filter else self.matches.get(display_filter, [])

    async def launch(self, nursery: trio.Nursery, config_dir: Path) -> FakeSharkd:
        worker = FakeSharkd(self)
        self.launched.append(worker)
        return worker

    async def early_numbers(self, argv: list[str], display_filter: str, want: int) -> tuple[list[int], bool]:
        """An early-stopping tshark: the first `want` matches, complete when there are no more."""
        if display_filter in self.invalid:
            raise DiagdError(ErrorCode.INVALID_FILTER, f"invalid display filter: {display_filter}")
        await trio.sleep(self.early_s)
        numbers = self.matching(display_filter)
        return numbers[:want], len(numbers) <= want


    async def early_rows(self, argv: list[str], display_filter: str, want: int) -> tuple[list[dict[str, Any]], bool]:
        """An early-stopping single pass's rows: odd frames say "(reply in N)" only after a second
        pass, so they are marked provisional."""
        numbers, complete = await self.early_numbers(argv, display_filter, want)
        return [{"number": n, "info": "request", **({"provisional": ["info"]} if n % 2 else {})}
                for n in numbers], complete


class FakeSharkd:
    """One scripted worker (the SharkdProcess the pool expects)."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.pid = next(_pids)
        self.requests = 0
        self.held: set[str] = set()
        self.alive = True
        self._serving = False
        self._resumed: trio.Event | None = None  # set on resume while paused
        self._pausing = trio.Event()  # set by pause: the request under way stops spending
        self.paused_s = 0.0  # how long its requests were paused in all

    def __repr__(self) -> str:
        return f"<FakeSharkd {self.pid} [{'alive' if self.alive else 'dead'}, held: {sorted(self.held)}]>"

    def rss_bytes(self) -> int | None:
        return self.script.rss_bytes if self.alive else None

    async def load(self, path: str) -> tuple[int, str | None]:
        await self._spend("load", "", self.script.load_s)
        if self.script.die_in_load:
            self.alive = False
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "sharkd died during 'status' (killed by SIGKILL)")
        if self.script.fail_load:
            raise SharkdError(-2001, "the file is no capture", "load", {"file": path})
        return self.script.frames, None

    async def call(self, method: str, params: dict[str, Any] | None = None, *, keep: int | None = None) -> Any:
        answer = (await self.call_many(method, [params or {}]))[0]
        if isinstance(answer, SharkdError):
            raise answer
        return answer

    async def call_many(self, method: str, params: list[dict[str, Any]]) -> list[Any]:
        answers = []
        for one in params:
            answers.append(await self._one(method, one))
        return answers

    async def close(self) -> str:
        self.resume()
        self.alive = False
        return "terminated"

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    def pause(self) -> None:
        """As SIGSTOP: the request under way spends no time until resume."""
        if self._resumed is None:
            self._resumed = trio.Event()
            self._pausing.set()

    def resume(self) -> None:
        if self._resumed is not None:
            self._resumed.set()
            self._resumed = None

    async def _one(self, method: str, params: dict[str, Any]) -> Any:
        display_filter = str(params.get("filter", ""))
        if display_filter in self.script.invalid and method in ("check", "frames", "intervals"):
            await self._spend(method, display_filter, self.script.request_s)
            code = {"check": -5001, "frames": -13002, "intervals": -7001}[method]
            return SharkdError(code, f"Filter invalid - {display_filter}", method, params)
        if method in self.script.errors:
            await self._spend(method, display_filter, self.script.request_s)
            return SharkdError(*self.script.errors[method], method, params)
        cost = self.script.request_s
        if method in ("frames", "intervals") and display_filter and display_filter not in self.held:
            cost = self.script.pass_s
        if method in ("analyse", "tap"):  # read the whole capture, as a filter pass does
            cost = self.script.pass_s
        await self._spend(method, display_filter, cost)
        if display_filter and method in ("frames", "intervals"):
            self.held.add(display_filter)
        numbers = self.script.matching(display_filter)
        match method:
            case "setconf" | "check":
                return {}
            case "status":
                return {"frames": self.script.frames}
            case "info":
                return {"columns": [{"format": f} for f in ("%m", "%t", "%s", "%d", "%p", "%L", "%i")]}
            case "intervals":
                return {"frames": len(numbers)}
            case "frames":
                skip, limit = int(params.get("skip", 0)), int(params.get("limit", len(numbers)))
                return [{"num": n, "c": [str(n), "0.0", "a", "b", "P", "60", f"frame {n}"]}
                        for n in numbers[skip:skip + limit]]
            case "frame":
                n = int(params["frame"])
                return {"col": [str(n), "0.0", "a", "b", "P", "60", f"frame {n}"]}
            case "analyse":
                return {"frames": self.script.frames, "protocols": ["frame", "eth", "ip"]}
            case "tap":
                return {"taps": [{"tap": name, "proto": name.split(":")[-1], "convs": []}
                                 for _, name in sorted(params.items())]}
        return SharkdError(-32601, f"method {method} is not scripted", method, params)

    async def _spend(self, method: str, display_filter: str, seconds: float) -> None:
        if not self.alive:
            raise DiagdError(ErrorCode.BACKEND_UNAVAILABLE, "sharkd is not running")
        assert not self._serving, f"{self!r} was sent a request while serving another"
        self._serving = True
        self.requests += 1
        self.script.log.append(f"{self.pid} {method} {display_filter}".rstrip())
        self.script.started_at.append(trio.current_time())
        try:
            done_at = trio.current_time() + seconds  # later by each pause
            while True:
                if self._resumed is not None:
                    paused_at = trio.current_time()
                    await self._resumed.wait()
                    self.paused_s += trio.current_time() - paused_at
                    done_at += trio.current_time() - paused_at
                    continue
                self._pausing = trio.Event()
                with trio.move_on_at(done_at) as spent:
                    await self._pausing.wait()
                if spent.cancelled_caught:
                    break
        except BaseException:
            self.alive = False  # abandoned mid-request: the real worker is killed
            raise
        finally:
            self._serving = False
