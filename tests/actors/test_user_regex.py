"""Caller-supplied regexes: re's syntax and matches, coded errors, a matching budget, a free event loop."""

from __future__ import annotations

import re
import threading

import pytest
import trio

from diagd.actors._user_regex import (
    MAX_PATTERN_CHARS,
    MAX_PROGRAM_SIZE,
    Matcher,
    compile_in_thread,
    compile_user_regex,
    in_thread,
)
from diagd.protocol.errors import DiagdError, ErrorCode

# A frame-tree-like text: long runs of words and spaces between punctuation.
TEXT = ("Stream Control Transmission Protocol, Src Port: 38412, Dst Port: 9487\n"
        "    NAS-5GS: 5GMM cause: 5GS services not allowed (7)\n"
        "    Verification tag: 0x00000000 ngap.AMF_UE_NGAP_ID == 2\n")
# `regex` guards many classic blow-ups (`(\w+\s?)+$` is linear for it), not overlapping alternatives.
CATASTROPHIC = r"(.|..)+$"
ORDINARY = [r"port", r"Src Port: (\d+)", r"^\s+NAS", r"\bcause\b.*\(7\)$", r"[A-Z_]{3,}", r"x*", r"(?i)sctp|ngap",
            r"\d+(?=\))", r"(?P<w>o)(?P=w)?", r"services NOT allowed", r"$", r"(?m)^    \w+", r"\w+\s?"]


@pytest.mark.parametrize("pattern", ORDINARY)
@pytest.mark.parametrize("case_sensitive", [False, True])
def test_ordinary_patterns_find_exactly_what_re_finds(pattern: str, case_sensitive: bool) -> None:
    flags = 0 if case_sensitive else re.IGNORECASE
    expected = [m.span() for m in re.finditer(pattern, TEXT, flags)]
    matcher = Matcher(compile_user_regex(pattern, case_sensitive=case_sensitive), 5.0, unit="frame")
    assert matcher.spans(TEXT, 1, limit=10_000) == expected
    for line in TEXT.splitlines():
        assert matcher.search(line, 1) == (re.search(pattern, line, flags) is not None)


def test_literal_queries_match_their_text_and_not_as_a_pattern() -> None:
    literal = Matcher(compile_user_regex("(7)", literal=True), 5.0, unit="line")
    assert literal.spans(TEXT, 1, limit=10) == [(TEXT.index("(7)"), TEXT.index("(7)") + 3)]
    assert not literal.search("cause 7", 1)


def test_a_bad_pattern_is_invalid_argument_with_its_position() -> None:
    with pytest.raises(DiagdError) as err:
        compile_user_regex("ab([", argument="query")
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert err.value.message == "query is not a valid regular expression: unterminated character set at position 3"
    assert err.value.details == {"argument": "query", "pattern": "ab([", "position": 3}


def test_counted_repeats_that_would_unroll_into_a_huge_program_are_refused() -> None:
    # `regex` copies a counted repeat out: a{4294967294} alone exhausts the machine's memory.
    for pattern in ("a{4294967294}", "(?:ab){1000000}", "((a{100}){100}){100}", "x{40000}y{40000}"):
        with pytest.raises(DiagdError) as err:
            compile_user_regex(pattern)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT and "counted repeats" in err.value.message
        assert err.value.details["program_size"] > MAX_PROGRAM_SIZE
    compile_user_regex(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{12}|a{5,4294967294}|\w{1,}")  # open ranges are cheap



def test_patterns_longer_than_the_limit_are_refused_before_compiling() -> None:
    # A periodic literal of 2 048 characters held the GIL for 17 s at its first match, timeout or not.
    longest = "ab" * (MAX_PATTERN_CHARS // 2)
    assert Matcher(compile_user_regex(longest, literal=True), 5.0, unit="x").search(longest * 2, 1)
    with pytest.raises(DiagdError) as err:
        compile_user_regex("ab" * 1024, literal=True)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert err.value.message == f"query is 2048 characters long, at most {MAX_PATTERN_CHARS}"


def test_the_deepest_nesting_the_length_limit_allows_compiles_and_matches() -> None:
    depth = (MAX_PATTERN_CHARS - 1) // 2
    nested = compile_user_regex("(" * depth + "a" + ")" * depth)
    assert Matcher(nested, 5.0, unit="x").search("xa", 1)


def test_a_catastrophic_pattern_is_a_timeout_naming_the_pattern_and_where_it_stopped() -> None:
    matcher = Matcher(compile_user_regex(CATASTROPHIC), 0.2, unit="line", total=3)
    assert matcher.search("short", 1)
    with pytest.raises(DiagdError) as err:
        matcher.search(TEXT, 2)
    assert err.value.code == ErrorCode.TIMEOUT
    assert err.value.message == (f"the regular expression {CATASTROPHIC!r} (query) used up its 0.2 s matching budget "
                                 "at line 2 of 3, after 2 searches")
    assert err.value.details["stopped_at"] == {"line": 2} and err.value.details["pattern"] == CATASTROPHIC
    assert "(a|aa)+" in err.value.details["hint"]


def test_the_budget_is_shared_by_every_search_of_a_call() -> None:
    matcher = Matcher(compile_user_regex(CATASTROPHIC), 0.2, unit="frame")
    with pytest.raises(DiagdError):
        matcher.spans(TEXT, 7, limit=10)
    assert matcher.spent_s >= matcher.budget_s
    with pytest.raises(DiagdError) as err:  # spent: even a trivial text is refused at once
        matcher.search("x", 8)
    assert err.value.details["stopped_at"] == {"frame": 8} and err.value.details["searches"] == 1


async def test_the_event_loop_keeps_running_while_a_catastrophic_search_runs() -> None:
    matcher = Matcher(compile_user_regex(CATASTROPHIC), 1.0, unit="line")
    ticks = 0
    outcome: list[str] = []

    async def search() -> None:
        try:
            await matcher.run(lambda: matcher.search(TEXT, 1))
        except DiagdError as exc:
            outcome.append(f"{exc.code} after {ticks} ticks")

    async def tick() -> None:
        nonlocal ticks
        while not outcome:
            ticks += 1
            await trio.sleep(0.005)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(search)
            nursery.start_soon(tick)
    assert outcome[0].startswith("TIMEOUT") and ticks >= 20  # `re` here: 0 or 1 tick, then the answer


async def test_a_cancelled_search_returns_at_once_and_its_thread_ends_by_its_budget() -> None:
    matcher = Matcher(compile_user_regex(CATASTROPHIC), 1.0, unit="line")
    started, finished = threading.Event(), threading.Event()

    def run() -> bool:
        started.set()
        try:
            return matcher.search(TEXT, 1)
        finally:
            finished.set()

    with trio.fail_after(30):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(matcher.run, run)
                while not started.is_set():
                    await trio.sleep(0.001)
                scope.cancel()
        assert not finished.is_set()  # the caller did not wait for the engine
        while not finished.is_set():
            await trio.sleep(0.01)


async def test_compiling_in_a_thread_gives_the_same_pattern_and_the_same_errors() -> None:
    compiled = await compile_in_thread("Src Port: (\\d+)")
    assert Matcher(compiled, 5.0, unit="x").spans(TEXT, 1, limit=5) == [(38, 53)]
    with pytest.raises(DiagdError) as err:
        await compile_in_thread("a{4294967294}")
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


async def test_the_budget_counts_the_cpu_time_of_the_searches_across_batches() -> None:
    matcher = Matcher(compile_user_regex(r"\bcause\b"), 5.0, unit="line")
    lines = TEXT.splitlines() * 20_000
    for _ in range(2):  # two batches, maybe on two threads: both are counted
        found = await matcher.run(lambda: sum(matcher.search(line, i) for i, line in enumerate(lines)))
        assert found == 20_000
    assert matcher.searches == 120_000 and 0 < matcher.spent_s < matcher.budget_s
    assert await in_thread(lambda: 1) == 1  # the plain helper still runs anything
