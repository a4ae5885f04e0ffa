"""Regular expressions typed by a caller, compiled and matched so that none can stall the daemon.

`re` cannot be interrupted and holds the GIL while it backtracks: one catastrophic pattern, run on
the event loop or in a thread, froze every client, the call timeout and SIGTERM handling. Every
tool that takes a pattern from its caller goes through this module instead:

- `compile_user_regex` checks the pattern with the stdlib parser (the syntax the tools always
  accepted; a bad pattern is INVALID_ARGUMENT with its position), refuses counted repeats that
  would make the compiled program huge (the `regex` engine unrolls `a{1000000}` into ~300 MB),
  then compiles it with `regex` in VERSION0 (re's semantics).
- A `Matcher` runs the searches of one call: `regex` with `concurrent=True` (the engine releases
  the GIL while it matches a str, so the event loop keeps serving everyone else) and `timeout=`
  drawn from one budget of matching time for the whole call, summed over every line, field or
  frame it searches. A spent budget is a TIMEOUT naming the pattern and how far it got.
- `Matcher.run` / `in_thread` run those blocking searches in a worker thread, on a limiter of
  their own (a burst of pathological calls cannot take the threads other tools read files with),
  abandoned on cancel (a cancelled call or a SIGTERM does not wait for the engine's timeout).
"""

from __future__ import annotations

import functools
import re
import re._parser as sre_parse  # the stdlib's own parser: re's syntax and error positions, no compiling
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import regex
import trio

from diagd.protocol.errors import DiagdError, ErrorCode

# Units of compiled program a pattern may unroll to (each counted repeat of a fixed count is
# copied out by `regex`): 50 000 compile in ~0.15 s and ~15 MB.
MAX_PROGRAM_SIZE = 50_000
# A pattern's length is bounded too: `regex` takes time cubic in the length of a periodic literal
# ("abab...") the first time it matches, holding the GIL and ignoring `timeout=` (2 048 characters:
# 17 s; 256: 20 ms), and compiles long patterns in quadratic time.
MAX_PATTERN_CHARS = 256
MAX_THREADS = 4  # concurrent searches; more calls queue (their call timeout still runs)
SAMPLE_EVERY = 64

T = TypeVar("T")

_HINT = ("simplify the pattern: nested or overlapping repeats such as (a|aa)+ or (.|..)*$ backtrack "
         "exponentially; anchor it, make its alternatives exclusive, or search for a literal string")
_REPEATS = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT)


@dataclass(frozen=True)
class UserRegex:
    """A caller's pattern, compiled; `argument` names the tool argument it came from."""

    source: str
    argument: str
    compiled: Any  # regex.Pattern[str]; the `regex` package ships no type information
    literal: bool = False  # an escaped string cannot backtrack: matched without `timeout=` (~3 us less per search)
    # No match can hold or look past a newline, so one MULTILINE search over lines joined with "\n"
    # finds exactly the lines a search per line finds (see `line_local`).
    line_local: bool = False

    def multiline(self) -> Any:
        """The pattern compiled with MULTILINE, for a search over joined lines (blocking, like compiling)."""
        return regex.compile(self.compiled.pattern, self.compiled.flags | regex.MULTILINE)


async def compile_in_thread(query: str, *, literal: bool = False, case_sensitive: bool = False,
                            argument: str = "query") -> UserRegex:
    """`compile_user_regex` off the event loop: the compiler is mostly Python and yields the GIL."""
    return await in_thread(functools.partial(compile_user_regex, query, literal=literal,
                                             case_sensitive=case_sensitive, argument=argument))


def compile_user_regex(query: str, *, literal: bool = False, case_sensitive: bool = False,
                       argument: str = "query") -> UserRegex:
    """Compile a caller's pattern (or a literal string) for `Matcher`; INVALID_ARGUMENT when it cannot be.

    Blocks for up to ~0.15 s on the largest patterns it accepts: async callers use `compile_in_thread`.
    """
    if len(query) > MAX_PATTERN_CHARS:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"{argument} is {len(query)} characters long, at most {MAX_PATTERN_CHARS}",
                         argument=argument, pattern=query[:200])
    text = re.escape(query) if literal else query
    flags = 0 if case_sensitive else re.IGNORECASE
    try:
        parsed = sre_parse.parse(text, flags)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"{argument} is not a valid regular expression: {exc.msg}{where}",
                         argument=argument, pattern=query, position=exc.pos) from None
    except RecursionError:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{argument} nests groups too deeply to compile",
                         argument=argument, pattern=query[:200]) from None
    size = _program_size(parsed, MAX_PROGRAM_SIZE)
    if size > MAX_PROGRAM_SIZE:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         f"{argument} has counted repeats too large to compile ({size} units, at most "
                         f"{MAX_PROGRAM_SIZE}); use an open-ended repeat such as {{1,}} or a shorter count",
                         argument=argument, pattern=query[:200], program_size=size)
    try:
        compiled = regex.compile(text, regex.VERSION0 | (0 if case_sensitive else regex.IGNORECASE))
    except (regex.error, RecursionError, MemoryError) as exc:  # re accepted it; keep the answer coded anyway
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{argument} cannot be compiled: {exc}",
                         argument=argument, pattern=query[:200]) from None
    return UserRegex(query, argument, compiled, literal, line_local(parsed))


# Character classes that never match "\n" (\d, \w, \S and their variants); anything else might.
_NO_NEWLINE_CATEGORIES = {
    sre_parse.CATEGORY_DIGIT, sre_parse.CATEGORY_UNI_DIGIT, sre_parse.CATEGORY_WORD, sre_parse.CATEGORY_UNI_WORD,
    sre_parse.CATEGORY_LOC_WORD, sre_parse.CATEGORY_NOT_SPACE, sre_parse.CATEGORY_UNI_NOT_SPACE,
    sre_parse.CATEGORY_NOT_LINEBREAK, sre_parse.CATEGORY_UNI_NOT_LINEBREAK,
}
_NEWLINE = ord("\n")


def line_local(parsed: Any) -> bool:
    r"""True when the parsed pattern provably behaves on one line of "\n"-joined text (searched with
    MULTILINE) exactly as on that line alone: nothing it matches or looks at through a lookaround
    can be a newline (no "\n", negated class, \s, \W, \D, DOTALL "."), its anchors are per line
    (^ $ \b, never \A \Z, MULTILINE never switched off), so a newline looks like the end of the
    string to it. Also False for a literal "[" inside a class or a literal "{": `regex` may read
    those as a POSIX class or a fuzzy constraint where the stdlib parser saw plain characters.
    False means "not proven", never "unsafe to run"."""
    return _line_local(parsed, bool(parsed.state.flags & sre_parse.SRE_FLAG_DOTALL))


def _line_local(pattern: Any, dotall: bool) -> bool:
    for op, av in pattern:
        if op is sre_parse.LITERAL:
            if av in (_NEWLINE, ord("{")):
                return False
        elif op is sre_parse.NOT_LITERAL:
            if av != _NEWLINE:
                return False
        elif op is sre_parse.ANY:
            if dotall:
                return False
        elif op is sre_parse.IN:
            if not _set_excludes_newline(av):
                return False
        elif op is sre_parse.AT:
            if av in (sre_parse.AT_BEGINNING_STRING, sre_parse.AT_END_STRING):
                return False
        elif op is sre_parse.SUBPATTERN:
            _group, add, delete, body = av
            if delete & sre_parse.SRE_FLAG_MULTILINE:
                return False
            inner = (dotall or bool(add & sre_parse.SRE_FLAG_DOTALL)) and not delete & sre_parse.SRE_FLAG_DOTALL
            if not _line_local(body, inner):
                return False
        elif op in _REPEATS:
            if not _line_local(av[2], dotall):
                return False
        elif op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
            if not _line_local(av[1], dotall):
                return False
        elif op is sre_parse.ATOMIC_GROUP:
            if not _line_local(av, dotall):
                return False
        elif op is sre_parse.BRANCH:
            if not all(_line_local(branch, dotall) for branch in av[1]):
                return False
        elif op is sre_parse.GROUPREF_EXISTS:
            _group, yes, no = av
            if not _line_local(yes, dotall) or (no is not None and not _line_local(no, dotall)):
                return False
        elif op is not sre_parse.GROUPREF:  # a backreference repeats a group, already checked
            return False  # an operator this check does not know: not proven
    return True


def _set_excludes_newline(items: Any) -> bool:
    negate = bool(items) and items[0][0] is sre_parse.NEGATE
    has_newline = False
    for op, av in items[1:] if negate else items:
        if op is sre_parse.LITERAL:
            if av == ord("["):
                return False
            has_newline = has_newline or av == _NEWLINE
        elif op is sre_parse.RANGE:
            has_newline = has_newline or av[0] <= _NEWLINE <= av[1]
        elif op is sre_parse.CATEGORY:
            has_newline = has_newline or av not in _NO_NEWLINE_CATEGORIES
        else:
            return False
    return has_newline if negate else not has_newline


def _program_size(pattern: Any, limit: int) -> int:
    """An upper bound of the compiled program: a repeat costs its body times (its minimum + 1)."""
    total = 0
    for op, av in pattern:
        if op in _REPEATS:
            low, _high, body = av
            total += _program_size(body, limit) * (low + 1)
        else:
            total += 1 + sum(_program_size(child, limit) for child in _subpatterns(av))
        if total > limit:
            return total  # big ints from nested repeats are pointless past the limit
    return total


def _subpatterns(av: Any) -> list[Any]:
    if isinstance(av, sre_parse.SubPattern):
        return [av]
    if isinstance(av, tuple | list):
        return [sub for item in av for sub in _subpatterns(item)]
    return []


class Matcher:
    """One call's searches with one pattern, all drawing on the same budget of matching time.

    The budget is CPU time of the searching thread (read every SAMPLE_EVERY searches: the clock
    costs ~0.8 us, a search ~3 us), so a busy machine does not turn an ordinary scan into a
    TIMEOUT; each engine call also gets what is left as its `timeout=`, which stops a single
    runaway search. Run searches through `run` (a worker thread, metered); `unit` and `total`
    only word the TIMEOUT ("stopped at line 17 of 5000"), `index` is the caller's position.
    """

    def __init__(self, user: UserRegex, budget_s: float, *, unit: str, total: int | None = None) -> None:
        self.user = user
        self.budget_s = budget_s
        self.unit = unit
        self.total = total
        self.spent_s = 0.0  # CPU seconds, as of the last clock reading
        self.searches = 0
        self._clock: float | None = None  # the searching thread's CPU clock at the last reading
        self._unread = 0  # searches since that reading

    def __repr__(self) -> str:
        return f"<Matcher {self.user.source!r} [{self.spent_s:.3f}/{self.budget_s:g} s, {self.searches} searches]>"

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` (which calls `search`/`spans`) in a worker thread, metered on that thread's clock."""
        return await in_thread(functools.partial(self._metered, fn))

    def _metered(self, fn: Callable[[], T]) -> T:
        self._clock = time.thread_time()
        try:
            return fn()
        finally:
            self._read_clock()
            self._clock = None  # the next batch may run in another thread

    def _read_clock(self) -> None:
        now = time.thread_time()
        if self._clock is not None:
            self.spent_s += now - self._clock
        self._clock, self._unread = now, 0

    def _left(self, index: int) -> float:
        if self._clock is None or self._unread >= SAMPLE_EVERY:
            self._read_clock()
        left = self.budget_s - self.spent_s
        if left <= 0:
            raise self._timed_out(index)
        self._unread += 1
        self.searches += 1
        return left

    def capped(self, cap_s: float) -> Matcher:
        """A matcher for a first attempt that may give up (a faster path whose worst case is worse):
        its budget is `cap_s` or what is left of this one, whichever is less. The CPU time it spends
        in this matcher's thread is this matcher's too (both read the same thread clock)."""
        if self._clock is not None:
            self._read_clock()
        left = max(0.0, self.budget_s - self.spent_s)
        return Matcher(self.user, min(cap_s, left), unit=self.unit, total=self.total)

    def gave_up(self, attempt: Matcher, error: DiagdError) -> None:
        """After `attempt` (from `capped`) ran out: raise this matcher's own TIMEOUT when its whole
        budget went with it, else return so the caller takes the slower, bounded path."""
        if error.code is not ErrorCode.TIMEOUT:
            raise error
        stopped = error.details.get("stopped_at", {}).get(self.unit, 1)
        if self.budget_s - self.spent_s - attempt.budget_s <= 0:  # spent_s: as `capped` read it
            raise self._timed_out(int(stopped)) from error

    def search(self, text: str, index: int) -> bool:
        """True when the pattern occurs in `text` (the hot loop of field and line scans: kept flat)."""
        left = self._left(index)
        try:
            found = self.user.compiled.search(text, timeout=None if self.user.literal else left, concurrent=True)
        except TimeoutError:
            raise self._timed_out(index) from None
        return found is not None

    def search_from(self, compiled: Any, text: str, pos: int, index: int) -> int:
        """Where the first match of `compiled` (this pattern, maybe recompiled: `UserRegex.multiline`)
        in `text` at or after `pos` starts, -1 when there is none; one engine call on the budget."""
        left = self._left(index)
        try:
            found = compiled.search(text, pos, timeout=None if self.user.literal else left, concurrent=True)
        except TimeoutError:
            raise self._timed_out(index) from None
        return -1 if found is None else int(found.start())

    def tick(self, index: int) -> None:
        """Count a step of a scan that needs no engine (a literal found by `str.find`) on the budget."""
        self._left(index)

    def spans(self, text: str, index: int, limit: int) -> list[tuple[int, int]]:
        """(start, end) of the first `limit` non-overlapping matches in `text`, as re.finditer finds them."""
        left = self._left(index)
        found: list[tuple[int, int]] = []
        try:
            # One timeout for the whole iteration: the engine counts it from the first match attempt.
            for m in self.user.compiled.finditer(text, timeout=None if self.user.literal else left, concurrent=True):
                found.append(m.span())
                if len(found) >= limit:
                    break
        except TimeoutError:
            raise self._timed_out(index) from None
        return found

    def _timed_out(self, index: int) -> DiagdError:
        self.spent_s = max(self.spent_s, self.budget_s)
        of = f" of {self.total}" if self.total is not None else ""
        return DiagdError(
            ErrorCode.TIMEOUT,
            f"the regular expression {self.user.source!r} ({self.user.argument}) used up its {self.budget_s:g} s "
            f"matching budget at {self.unit} {index}{of}, after {self.searches} searches",
            argument=self.user.argument, pattern=self.user.source, budget_s=self.budget_s,
            stopped_at={self.unit: index}, searches=self.searches, hint=_HINT,
            setting="[daemon] regex_budget_s",
        )


_limiter: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("user_regex_limiter")


async def in_thread(fn: Callable[[], T]) -> T:
    """Run blocking searches in a worker thread; a cancelled caller does not wait for them.

    An abandoned search still ends by itself: its `Matcher` budget bounds every engine call.
    """
    try:
        limiter = _limiter.get()
    except LookupError:
        limiter = trio.CapacityLimiter(MAX_THREADS)
        _limiter.set(limiter)
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=limiter)
