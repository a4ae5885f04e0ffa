"""The HTTP requests a stopping daemon answers (daemon/server/http/inflight.py), with a stand-in for the
SDK: whatever it had sent on the stream, the client gets one whole DAEMON_RESTARTED answer, and the
stop waits for no client. The real SDK clients through a real restart: tests/e2e/test_http_inflight.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

from diagd.daemon.server.http.inflight import InFlight, Send

SSE = [(b"content-type", b"text/event-stream")]


class Stream:
    """What the client received on one request's stream."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")

    @property
    def ended(self) -> bool:
        bodies = [m for m in self.messages if m["type"] == "http.response.body"]
        return bool(bodies) and not bodies[-1].get("more_body") and all(m.get("more_body") for m in bodies[:-1])


def error_of(payload: bytes) -> dict[str, Any]:
    answer = json.loads(payload)
    assert answer["id"] == 7 and answer["jsonrpc"] == "2.0"
    error: dict[str, Any] = answer["error"]
    return error


async def never_answers(send: Send) -> None:
    await trio.sleep_forever()


async def opens_an_event_stream(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    try:
        await trio.sleep_forever()
    finally:  # what sse_starlette does as it is cancelled: ends the stream
        with trio.CancelScope(shield=True):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def answers(send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    await send({"type": "http.response.body", "body": b"event: message\r\ndata: {}\r\n\r\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    await trio.sleep_forever()  # the SDK's task lingers after its answer


async def stopped_with(handler: Any) -> tuple[Stream, int]:
    in_flight, stream = InFlight(), Stream()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_flight.serve, 7, "tools/call", stream.send, handler)
        await trio.testing.wait_all_tasks_blocked()
        answered = await in_flight.answer_all("signal SIGTERM")
        nursery.cancel_scope.cancel()
    return stream, answered


async def test_a_request_with_nothing_sent_gets_a_whole_json_answer(autojump_clock: trio.testing.MockClock) -> None:
    stream, answered = await stopped_with(never_answers)
    assert answered == 1 and stream.ended
    start = stream.messages[0]
    assert start["status"] == 200 and (b"content-type", b"application/json") in start["headers"]
    error = error_of(stream.body)
    assert error["code"] == -32000 and error["data"] == {"code": "DAEMON_RESTARTED", "method": "tools/call"}
    assert "signal SIGTERM" in error["message"] and "may be retried" in error["message"]


async def test_an_open_event_stream_gets_one_more_event_then_its_end(autojump_clock: trio.testing.MockClock) -> None:
    stream, answered = await stopped_with(opens_an_event_stream)
    assert answered == 1 and stream.ended
    assert [m["type"] for m in stream.messages].count("http.response.start") == 1  # no second header
    event = stream.body.decode()
    assert event.startswith("event: message\r\ndata: ") and event.endswith("\r\n\r\n")
    assert error_of(event.removeprefix("event: message\r\ndata: ").encode())["data"]["code"] == "DAEMON_RESTARTED"


async def test_an_answered_request_gets_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    stream, answered = await stopped_with(answers)
    assert answered == 0 and stream.ended
    assert stream.body == b"event: message\r\ndata: {}\r\n\r\n"


async def test_a_request_arriving_while_the_daemon_stops_is_answered_at_once(
        autojump_clock: trio.testing.MockClock) -> None:
    in_flight, stream = InFlight(), Stream()
    assert await in_flight.answer_all("shutdown requested by cli:1") == 0
    await in_flight.serve(7, "tools/list", stream.send, never_answers)
    assert stream.ended and error_of(stream.body)["data"] == {"code": "DAEMON_RESTARTED", "method": "tools/list"}


async def test_a_handler_that_ignores_its_cancellation_cannot_hold_the_stop(
        autojump_clock: trio.testing.MockClock) -> None:
    async def deaf(send: Send) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(3600)

    in_flight = InFlight()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_flight.serve, 7, "tools/call", Stream().send, deaf)
        await trio.testing.wait_all_tasks_blocked()
        before = trio.current_time()
        assert await in_flight.answer_all("signal SIGTERM", timeout_s=2.0) == 1
        assert trio.current_time() - before == pytest.approx(2.0)
        nursery.cancel_scope.cancel()
