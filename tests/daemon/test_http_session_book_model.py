"""The HTTP session book against a model of the rules docs/http.md states (Sessions, Caps, Idle
expiry, Restarts), written out here without reading the book's code: seeded random runs of opening,
using, freeing, deleting and restarting on Trio's MockClock, every answer compared; then the edges
one at a time (the exact cap, the exact `session_keep_s`, records of another token, a clock that went
back across a restart).

The rules, as the docs give them:

- a session is bound to the id of the token that opened it; records count against
  `max_sessions_per_token` and `max_sessions` whether live or freed (dormant);
- a token at its cap replaces its own longest-idle session with no request in flight; all of them
  busy: refused;
- at the overall cap a new session replaces the longest-idle *dormant* session of any token (after
  the per-token replacement, which already makes room); none dormant: refused. A live session of
  another token is never ended;
- a freed session stays revivable for `session_keep_s` since its last use, then is forgotten (at
  exactly `session_keep_s` it is gone); a live one is never forgotten; a session whose `initialize`
  never succeeded, or whose params are over 8 KB, is not revivable: it is dropped when freed;
- the file keeps the revivable records with their wall-clock last use; a restarted daemon restores
  them dormant, the most recently used first, leaving out the stale ones and those over either cap;
- the file is out of date (`changed`) when a revivable record appears or goes.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from diagd.daemon.server.http.session_book import Admission, Record, SessionBook
from diagd.daemon.server.http.session_file import Stored

PARAMS = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
HUGE = {**PARAMS, "capabilities": {"x": "y" * 9000}}  # over the documented 8 KB: not kept
EXACT = {"x": "y" * (8 * 1024 - len('{"x":""}'))}  # exactly 8 KB as compact JSON: kept
WALL0 = 1_700_000_000.0
# Token ids as tokens.py makes them (24 hex digits); the first two differ only in their last digit.
TOKEN_IDS = ["5f3a9c0e7d21b4a86c0f9e12", "5f3a9c0e7d21b4a86c0f9e13", "0b7e44d19a2c5f3861d0e7a4"]


@dataclass
class M:
    """A session as the model sees it."""

    token: str
    last: float
    kept: bool = False  # initialize params stored (revivable)
    live: bool = True
    busy: int = 0


class Model:
    def __init__(self, per_token: int, overall: int, keep_s: float) -> None:
        self.per_token, self.overall, self.keep_s = per_token, overall, keep_s
        self.s: dict[str, M] = {}  # in the order sessions were made
        self.file_changed = False

    def stale(self, m: M, now: float) -> bool:
        return not m.live and now - m.last >= self.keep_s

    def remove(self, sid: str) -> None:
        m = self.s.pop(sid)
        if m.kept:
            self.file_changed = True

    def forget_stale(self, now: float) -> None:
        for sid in [sid for sid, m in self.s.items() if self.stale(m, now)]:
            self.remove(sid)

    def admit(self, token: str, now: float) -> tuple[bool, list[str], str]:
        """(admitted, evicted ids, which cap refused: 'token' | 'overall' | '')"""
        self.forget_stale(now)
        gone: list[str] = []
        mine = [sid for sid, m in self.s.items() if m.token == token]
        if len(mine) >= self.per_token:
            idle = [sid for sid in mine if self.s[sid].busy == 0]
            if not idle:
                return False, [], "token"
            gone.append(min(idle, key=lambda sid: self.s[sid].last))
        if len(self.s) - len(gone) >= self.overall:
            dormant = [sid for sid, m in self.s.items() if not m.live and sid not in gone]
            if not dormant:
                return False, [], "overall"
            gone.append(min(dormant, key=lambda sid: self.s[sid].last))
        for sid in gone:
            self.remove(sid)
        return True, gone, ""

    def get(self, sid: str, now: float) -> M | None:
        m = self.s.get(sid)
        if m is not None and self.stale(m, now):
            self.remove(sid)
            return None
        return m

    def freed(self, sid: str) -> None:
        m = self.s.get(sid)
        if m is None:
            return
        if not m.kept:
            self.remove(sid)
            return
        m.live, m.busy = False, 0

    def stored(self, now: float, wall: float) -> dict[str, tuple[str, float]]:
        return {sid: (m.token, wall - (now - m.last)) for sid, m in self.s.items() if m.kept}

    def restore(self, stored: list[Stored], now: float, wall: float) -> None:
        for s in sorted(stored, key=lambda s: s.last_used_wall, reverse=True):
            age = max(0.0, wall - s.last_used_wall)
            mine = sum(m.token == s.token for m in self.s.values())
            if age >= self.keep_s or mine >= self.per_token or len(self.s) >= self.overall:
                continue
            self.s[s.sid] = M(s.token, now - age, kept=True, live=False)


class Run:
    """The book and the model side by side; every step compares what both answer."""

    def __init__(self, per_token: int, overall: int, keep_s: float) -> None:
        self.wall_offset = WALL0
        self.args = (per_token, overall, keep_s)
        self.book = self.new_book()
        self.model = Model(per_token, overall, keep_s)
        self.serial = 0

    def wall(self) -> float:
        return self.wall_offset + trio.current_time()

    def new_book(self) -> SessionBook:
        per_token, overall, keep_s = self.args
        return SessionBook(per_token=per_token, overall=overall, keep_s=keep_s, wall=self.wall)

    def check_changed(self) -> None:
        assert self.book.changed.is_set() == self.model.file_changed
        self.book.changed = trio.Event()
        self.model.file_changed = False

    def compare(self) -> None:
        now = trio.current_time()
        assert len(self.book) == len(self.model.s)
        assert self.book.live_count() == sum(m.live for m in self.model.s.values())
        got = {s.sid: (s.token, s.last_used_wall) for s in self.book.stored()}
        assert got.keys() == self.model.stored(now, self.wall()).keys()
        for sid, (token, wall) in self.model.stored(now, self.wall()).items():
            assert got[sid][0] == token and got[sid][1] == pytest.approx(wall, abs=1e-6)
            assert self.book.stored()[[s.sid for s in self.book.stored()].index(sid)].initialize

    def open(self, token: str, params: dict[str, object] | None) -> str | None:
        now = trio.current_time()
        admitted, gone, cap = self.model.admit(token, now)
        answer = self.book.admit(token)
        assert isinstance(answer, Admission)
        assert answer.admitted == admitted and [r.sid for r in answer.evict] == gone
        if not admitted:
            setting = "max_sessions_per_token" if cap == "token" else "max_sessions"
            limit = self.args[0] if cap == "token" else self.args[1]
            count = (sum(m.token == token for m in self.model.s.values()) if cap == "token"
                     else len(self.model.s))
            assert f"[http] {setting} = {limit})" in answer.reason and f"{count} sessions" in answer.reason
            self.check_changed()
            return None
        assert answer.reason == ""
        self.serial += 1
        sid = f"s{self.serial}"
        record = self.book.add(sid, token)
        assert (record.sid, record.token, record.live, record.in_flight, record.initialize) == (sid, token, True, 0, {})
        assert record.last_used == now and not record.revivable
        self.model.s[sid] = M(token, now)
        if params is not None:
            self.book.established(sid, params)
            if params is not HUGE:
                self.model.s[sid].kept = True
                self.model.file_changed = True
            assert record.revivable == self.model.s[sid].kept
            assert record.initialize == (params if self.model.s[sid].kept else {})
        self.check_changed()
        return sid

    def get(self, sid: str) -> Record | None:
        m = self.model.get(sid, trio.current_time())
        record = self.book.get(sid)
        assert (record is None) == (m is None)
        if record is not None and m is not None:
            assert (record.sid, record.token, record.live, record.in_flight) == (sid, m.token, m.live, m.busy)
            assert record.last_used == pytest.approx(m.last, abs=1e-6)
        self.check_changed()
        return record

    def restart(self, downtime: float) -> None:
        stored = self.book.stored()
        for sid in list(self.model.s):
            self.model.freed(sid)  # the daemon stops: every live session is discarded, the revivable kept
        saved = list(stored)
        self.wall_offset += downtime
        self.book = self.new_book()
        self.model = Model(*self.args)
        self.book.restore(saved)
        self.model.restore(saved, trio.current_time(), self.wall())
        assert not self.book.changed.is_set()
        assert self.book.live_count() == 0


async def one_run(seed: int, per_token: int, overall: int, keep_s: float) -> None:
    rng = random.Random(seed)
    run = Run(per_token, overall, keep_s)
    tokens = TOKEN_IDS[: rng.choice([1, 2, 3])]
    for _ in range(300):
        await trio.sleep(rng.choice([1, 1, 2, 5, 13, 40]))  # every step at its own time: no ties in idleness
        sids = [*run.model.s, f"s{run.serial + 1}", "s0"]  # and ids unknown to both
        op = rng.random()
        if op < 0.35:
            run.open(rng.choice(tokens), rng.choice([PARAMS, PARAMS, PARAMS, None, HUGE]))
        elif op < 0.55:
            sid = rng.choice(sids)
            record = run.get(sid)
            if record is not None:  # a request: in flight until its end
                run.book.begin(record)
                m = run.model.s[sid]
                m.busy, m.last = m.busy + 1, trio.current_time()
                run.compare()
                if rng.random() < 0.6:
                    await trio.sleep(rng.choice([1, 3]))
                    run.book.end(record)
                    m.busy, m.last = max(0, m.busy - 1), trio.current_time()
        elif op < 0.65:
            sid = rng.choice(sids)
            record = run.book.get(sid)  # an end without its begin (a raced request) never counts below 0
            m = run.model.get(sid, trio.current_time())
            if record is not None and m is not None:
                run.book.end(record)
                m.busy, m.last = max(0, m.busy - 1), trio.current_time()
            run.check_changed()
        elif op < 0.8:
            sid = rng.choice(sids)
            run.book.went_dormant(sid)
            run.model.freed(sid)
            run.check_changed()
        elif op < 0.9:
            sid = rng.choice(sids)
            run.book.drop(sid)  # DELETE
            if sid in run.model.s:
                run.model.remove(sid)
            run.check_changed()
        elif op < 0.95:
            run.restart(rng.choice([0, 10, 60, 99, 100, 500]))
        else:
            run.compare()
        run.compare()


@pytest.mark.parametrize(("per_token", "overall", "keep_s"), [(2, 3, 100), (3, 4, 60), (1, 2, 100), (4, 4, 250)])
async def test_the_book_answers_as_the_documented_rules_on_random_runs(
        autojump_clock: trio.testing.MockClock, per_token: int, overall: int, keep_s: float) -> None:
    for seed in range(6):
        await one_run(seed * 7919 + per_token, per_token, overall, keep_s)


def book(per_token: int = 2, overall: int = 3, keep_s: float = 100.0, wall: float = WALL0) -> SessionBook:
    return SessionBook(per_token=per_token, overall=overall, keep_s=keep_s, wall=lambda: wall)


def opened(b: SessionBook, sid: str, token: str) -> Record:
    assert b.admit(token).admitted
    record = b.add(sid, token)
    b.established(sid, PARAMS)
    return record


async def test_one_below_a_cap_nothing_gives_way(autojump_clock: trio.testing.MockClock) -> None:
    b = book(per_token=3, overall=3)
    opened(b, "a1", "a")
    await trio.sleep(1)
    opened(b, "a2", "a")
    b.went_dormant("a1")
    answer = b.admit("a")  # a holds 2 of 3, 2 of 3 overall: room for one
    assert answer.admitted and answer.evict == () and len(b) == 2


async def test_a_token_at_its_cap_makes_room_overall_too(autojump_clock: trio.testing.MockClock) -> None:
    # Its own replaced session frees the place it needs: no other token's dormant record goes.
    b = book(per_token=2, overall=3)
    opened(b, "b1", "b")
    b.went_dormant("b1")
    await trio.sleep(1)
    opened(b, "a1", "a")
    await trio.sleep(1)
    opened(b, "a2", "a")
    answer = b.admit("a")
    assert [r.sid for r in answer.evict] == ["a1"] and b.get("b1") is not None and b.get("a1") is None


async def test_the_overall_cap_takes_another_dormant_record_than_the_tokens_own(
        autojump_clock: trio.testing.MockClock) -> None:
    # per_token 2 and overall 2: a's dormant session goes for a's cap, then the overall cap needs one more
    # place only if the count still reaches it: here it does not, so nothing else is evicted.
    b = book(per_token=2, overall=2)
    opened(b, "a1", "a")
    b.went_dormant("a1")
    await trio.sleep(1)
    opened(b, "a2", "a")
    answer = b.admit("a")
    assert [r.sid for r in answer.evict] == ["a1"] and len(b) == 1
    # Over both caps at once (records restored past a lowered cap): the second victim is a dormant record
    # other than the first, the longest idle of the rest.
    b = book(per_token=3, overall=2)
    b.restore([Stored("a1", "a", PARAMS, WALL0 - 30), Stored("b1", "b", PARAMS, WALL0 - 20)])
    b.per_token, b.overall = 1, 1
    answer = b.admit("a")
    assert [r.sid for r in answer.evict] == ["a1", "b1"] and len(b) == 0


async def test_the_per_token_refusal_leaves_every_record(autojump_clock: trio.testing.MockClock) -> None:
    b = book(per_token=1, overall=3)
    b.begin(opened(b, "a1", "a"))
    answer = b.admit("a")
    assert not answer.admitted and answer.evict == () and "1 sessions open, all busy" in answer.reason
    assert "max_sessions_per_token = 1" in answer.reason and len(b) == 1
    assert b.admit("b").admitted  # another token is not held by a's cap


async def test_a_record_of_the_session_is_bound_to_the_token_id_that_opened_it(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book(per_token=1, overall=10)
    for token in ("id-1", "id-2", "id-3"):
        opened(b, f"s-{token}", token)
    assert {s.sid: s.token for s in b.stored()} == {"s-id-1": "id-1", "s-id-2": "id-2", "s-id-3": "id-3"}
    answer = b.admit("id-2")  # each token counts only its own
    assert [r.sid for r in answer.evict] == ["s-id-2"] and answer.evict[0].token == "id-2"


async def test_staleness_is_exactly_keep_s_after_the_last_use_and_never_for_a_live_session(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book(keep_s=50)
    live = opened(b, "live", "a")
    dormant = opened(b, "dormant", "b")
    b.begin(dormant)
    await trio.sleep(10)
    b.end(dormant)  # last use: now
    assert dormant.in_flight == 0 and dormant.last_used == trio.current_time()
    b.went_dormant("dormant")
    b.changed = trio.Event()
    await trio.sleep(49.5)
    assert b.admit("c").admitted and b.get("dormant") is dormant
    await trio.sleep(0.5)
    assert b.admit("c").admitted and len(b) == 1 and b.get("live") is live  # forgotten by admit, at 50 s
    assert b.changed.is_set()
    await trio.sleep(10_000)
    assert b.get("live") is live and live.live


async def test_a_freed_session_is_not_busy_and_an_end_never_counts_below_zero(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book()
    r = opened(b, "a1", "a")
    b.begin(r)
    b.begin(r)
    assert r.in_flight == 2
    b.end(r)
    assert r.in_flight == 1
    b.went_dormant("a1")
    assert (r.live, r.in_flight) == (False, 0)
    b.end(r)
    assert r.in_flight == 0
    b.went_dormant("unknown")  # nothing to free: no error, nothing changes
    assert len(b) == 1


async def test_the_file_is_out_of_date_when_a_revivable_record_comes_or_goes(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book()
    assert b.admit("a").admitted
    b.add("a1", "a")
    assert not b.changed.is_set()  # nothing to keep yet
    b.established("a1", HUGE)
    assert not b.changed.is_set() and b.stored() == []
    b.established("a1", EXACT)  # 8 KB is kept
    assert b.changed.is_set() and b.get("a1").revivable  # type: ignore[union-attr]
    b.changed = trio.Event()
    b.established("nobody", PARAMS)  # an id the book does not have
    assert not b.changed.is_set() and len(b) == 1
    b.drop("a1")
    assert b.changed.is_set() and len(b) == 0
    b.changed = trio.Event()
    b.add("a2", "a")
    b.drop("a2")
    b.drop("a2")
    assert not b.changed.is_set()


async def test_stored_records_carry_the_wall_clock_of_their_last_use(autojump_clock: trio.testing.MockClock) -> None:
    wall = [WALL0]
    b = SessionBook(per_token=5, overall=5, keep_s=1000, wall=lambda: wall[0])
    r = opened(b, "a1", "a")
    await trio.sleep(30)
    wall[0] += 30
    b.begin(r)
    await trio.sleep(12)
    wall[0] += 12
    (s,) = b.stored()
    assert (s.sid, s.token, s.initialize) == ("a1", "a", PARAMS) and s.last_used_wall == WALL0 + 30
    b.end(r)
    assert b.stored()[0].last_used_wall == WALL0 + 42


async def test_a_restore_keeps_the_most_recent_per_token_and_overall_and_their_ages(
        autojump_clock: trio.testing.MockClock) -> None:
    stored = [Stored("a-old", "a", PARAMS, WALL0 - 40), Stored("a-new", "a", PARAMS, WALL0 - 1),
              Stored("a-mid", "a", PARAMS, WALL0 - 20), Stored("b-1", "b", PARAMS, WALL0 - 30),
              Stored("c-1", "c", PARAMS, WALL0 - 35), Stored("stale", "d", PARAMS, WALL0 - 100),
              Stored("future", "e", {"p": 1}, WALL0 + 500)]  # the wall clock went back: used "now"
    b = book(per_token=2, overall=5, keep_s=100)
    b.restore(stored)
    got = {s.sid: (s.token, s.initialize, s.last_used_wall) for s in b.stored()}
    assert got == {"future": ("e", {"p": 1}, WALL0), "a-new": ("a", PARAMS, WALL0 - 1),
                   "a-mid": ("a", PARAMS, WALL0 - 20), "b-1": ("b", PARAMS, WALL0 - 30),
                   "c-1": ("c", PARAMS, WALL0 - 35)}
    assert b.live_count() == 0 and all(b.get(sid).in_flight == 0 for sid in got)  # type: ignore[union-attr]
    b = book(per_token=2, overall=3, keep_s=100)
    b.restore(stored)
    assert sorted(s.sid for s in b.stored()) == ["a-mid", "a-new", "future"]
    b = book(per_token=2, overall=9, keep_s=100)  # a's third is one over its cap
    b.restore(stored)
    assert sorted(s.sid for s in b.stored()) == ["a-mid", "a-new", "b-1", "c-1", "future"]
    b = book(per_token=1, overall=9, keep_s=100)  # one left out, the next token's still restored
    b.restore(stored)
    assert sorted(s.sid for s in b.stored()) == ["a-new", "b-1", "c-1", "future"]
    b = book(per_token=9, overall=9, keep_s=60)
    b.restore(stored)
    assert "stale" not in {s.sid for s in b.stored()} and len(b) == 6
    b = book(per_token=9, overall=9, keep_s=40)  # exactly keep_s old: stale
    b.restore(stored)
    assert "a-old" not in {s.sid for s in b.stored()} and "c-1" in {s.sid for s in b.stored()}


async def test_a_restored_record_is_forgotten_keep_s_after_its_last_use_before_the_restart(
        autojump_clock: trio.testing.MockClock) -> None:
    b = book(keep_s=100)
    b.restore([Stored("s", "a", PARAMS, WALL0 - 70)])
    await trio.sleep(29)
    assert b.get("s") is not None
    await trio.sleep(1)
    assert b.get("s") is None


def test_admission_and_record_values() -> None:
    assert Admission().admitted and Admission(evict=()).reason == ""
    assert not Admission(reason="full").admitted
    r = Record("s", "t", 1.0)
    assert (r.initialize, r.live, r.in_flight, r.revivable) == ({}, True, 0, False)
    assert Record("s", "t", 1.0, {"a": 1}).revivable
    assert len(json.dumps(EXACT, separators=(",", ":"))) == 8 * 1024
