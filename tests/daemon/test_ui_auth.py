"""The web view's login links and sessions (daemon/server/ui/auth.py) and its call feed (ui/feed.py): a
link works once and only before it expires, sessions expire and are bounded, and the feed keeps the
latest records, numbered, within its bounds, waking a waiter at the next one."""

from __future__ import annotations

import json

import trio
import trio.testing

from diagd.daemon.server.audit import CallRecord
from diagd.daemon.server.ui import auth as ui_auth
from diagd.daemon.server.ui.auth import UiAuth
from diagd.daemon.server.ui.feed import CallFeed


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_login_link_works_once() -> None:
    auth = UiAuth()
    once = auth.login_secret()
    session = auth.redeem(once)
    assert session is not None and session != once and auth.session_ok(session)
    assert auth.redeem(once) is None  # used up
    assert auth.pending() == 0 and auth.sessions() == 1
    assert not auth.session_ok(once)  # a link's secret is no session


def test_a_wrong_or_empty_secret_opens_nothing() -> None:
    auth = UiAuth()
    once = auth.login_secret()
    for wrong in ("", once[:-1], once + "x", once.upper() if once.upper() != once else once.lower(), "\ud800"):
        assert auth.redeem(wrong) is None, wrong
        assert not auth.session_ok(wrong)
    assert auth.redeem(once) is not None  # the wrong tries did not use it up


def test_a_link_expires_and_so_does_a_session() -> None:
    clock = Clock()
    auth = UiAuth(clock)
    late = auth.login_secret()
    clock.now += ui_auth.ONCE_TTL_S
    assert auth.redeem(late) is None and auth.pending() == 0
    session = auth.redeem(auth.login_secret())
    assert session is not None
    clock.now += ui_auth.SESSION_TTL_S - 1
    assert auth.session_ok(session)
    clock.now += 1
    assert not auth.session_ok(session) and auth.sessions() == 0


def test_links_and_sessions_are_bounded_the_oldest_going_first() -> None:
    auth = UiAuth()
    links = [auth.login_secret() for _ in range(ui_auth.MAX_PENDING + 3)]
    assert auth.pending() == ui_auth.MAX_PENDING
    assert [auth.redeem(link) is not None for link in links[:4]] == [False, False, False, True]
    sessions = [auth.redeem(auth.login_secret()) for _ in range(ui_auth.MAX_SESSIONS + 1)]
    assert auth.sessions() == ui_auth.MAX_SESSIONS
    assert not auth.session_ok(str(sessions[0])) and auth.session_ok(str(sessions[-1]))


def record(n: int, outcome: str = "ok", argument: str = "") -> CallRecord:
    return CallRecord(ts=1.0 + n, client="cli:1", tool="echo", arguments={"message": argument or f"m{n}"},
                      duration_ms=1.5, queue_ms=0.0, outcome=outcome, code=None, bytes=10, truncated=False,
                      call_id=f"c-{n}")


async def test_the_feed_numbers_records_and_wakes_a_waiter() -> None:
    feed = CallFeed()
    woken: list[int] = []

    async def waiter() -> None:
        await feed.wait(0)
        woken.append(feed.seq)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert woken == []
        feed.observe(record(1, "started"))
    assert woken == [1]
    feed.observe(record(1))
    events = feed.since(0)
    assert [n for n, _ in events] == [1, 2]
    assert [json.loads(text)["outcome"] for _, text in events] == ["started", "ok"]
    assert json.loads(events[1][1])["call_id"] == "c-1" and feed.since(2) == []


async def test_the_feed_keeps_the_latest_within_its_bounds_and_a_closed_feed_wakes_everyone() -> None:
    feed = CallFeed(keep=3, keep_bytes=10_000)
    for n in range(10):
        feed.observe(record(n))
    assert [n for n, _ in feed.since(0)] == [8, 9, 10]
    feed = CallFeed(keep=100, keep_bytes=1000)
    for n in range(5):
        feed.observe(record(n, argument="x" * 400))
    assert [n for n, _ in feed.since(0)] == [5]  # the latest is always kept
    with trio.fail_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.wait, 5)
            await trio.testing.wait_all_tasks_blocked()
            await feed.close()
