"""pcap_list_fields' search over Wireshark's field catalogue (~233k fields): fast, with the results
of one search per field name and description.

The reference is `scan_per_field`: the pattern searched in each field's name, then its description
(~470k engine calls, ~1-2 s). The fast paths search one text built once per catalogue, the name
and description lines of every field joined with "\\n", and map each hit back to its field:

- a literal, case-sensitive: `str.find` in that text (a literal without "\\n" cannot span lines);
- a literal, case-insensitive, all ASCII: `str.find` of its casefold in the casefolded text. For an
  ASCII needle this finds every line the engine (simple case folding: a~A, s~U+017F, k~U+212A) matches,
  since casefolding maps each of those characters to the needle's; it can also find more where
  casefolding expands a character (ß -> ss), so hits on the few fields with non-ASCII text are
  confirmed with the engine;
- a regex that `UserRegex.line_local` proves cannot see past its line: one MULTILINE engine search
  per matching field over the joined text;
- anything else (a non-ASCII literal is line-local too; \\s, [^x], DOTALL ..., a protocol filter):
  the reference path.

Everything runs in a worker thread on the call's `Matcher` (same budget, same TIMEOUT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import regex
import trio

from diagd.actors._user_regex import Matcher, UserRegex
from diagd.actors._wireshark import Catalogue

Row = tuple[str, tuple[str, str, str]]  # (name, (description, type, protocol))


@dataclass(frozen=True)
class FieldText:
    """The catalogue as lines: field i's name is line 2i, its description line 2i+1; a final "\\n"."""

    rows: list[Row]
    text: str
    folded: str  # the same, casefolded line by line (casefolding never makes or removes a "\\n")
    non_ascii: frozenset[int]  # fields whose name or description is not all ASCII

    @classmethod
    def build(cls, cat: Catalogue) -> FieldText:
        """~0.5 s of Python on 233k fields (yields the GIL as it goes): run it in a thread, once."""
        rows = list(cat.fields.items())
        lines = [text for name, (desc, _type, _proto) in rows for text in (name, desc)]
        if any("\n" in line for line in lines):  # tshark -G output is split into lines: cannot happen
            raise ValueError("a field name or description holds a newline")
        return cls(rows, "\n".join(lines) + "\n", "\n".join(line.casefold() for line in lines) + "\n",
                   frozenset(i for i, (name, (desc, _t, _p)) in enumerate(rows)
                             if not (name.isascii() and desc.isascii())))


_built: tuple[Catalogue, FieldText] | None = None
_build_lock: trio.Lock | None = None


async def field_text(cat: Catalogue) -> FieldText:
    """The catalogue's `FieldText`, built in a worker thread on first use."""
    global _built, _build_lock
    if _build_lock is None:
        _build_lock = trio.Lock()
    async with _build_lock:
        if _built is None or _built[0] is not cat:
            _built = (cat, await trio.to_thread.run_sync(FieldText.build, cat))
    return _built[1]


async def search_fields(cat: Catalogue, user: UserRegex, matcher: Matcher, *,
                        protocols: set[str] | frozenset[str] = frozenset()) -> list[Row]:
    """The fields whose name or description the pattern matches, in catalogue order."""
    if not user.source:  # the empty pattern matches every text
        return [row for row in cat.fields.items() if not protocols or row[1][2] in protocols]
    fast = None if protocols else fast_scan(user)
    if fast is None:
        return await matcher.run(lambda: scan_per_field(cat.fields.items(), matcher, protocols))
    index = await field_text(cat)
    return await matcher.run(lambda: fast(index, matcher))


def scan_per_field(rows: Iterable[Row], matcher: Matcher, protocols: set[str] | frozenset[str] = frozenset()
                   ) -> list[Row]:
    """The reference: one search per name and description (blocking, a worker thread's job)."""
    return [row for i, row in enumerate(rows, 1)
            if (not protocols or row[1][2] in protocols)
            and (matcher.search(row[0], i) or matcher.search(row[1][0], i))]


Scan = Callable[[FieldText, Matcher], list[Row]]


def fast_scan(user: UserRegex) -> Scan | None:
    """How to search the joined text for this pattern, or None when only the reference path is exact."""
    source = user.source
    if user.literal and "\n" not in source:
        if not user.compiled.flags & regex.IGNORECASE:
            return lambda index, matcher: _find_scan(index, matcher, index.text, source, confirm=False)
        if source.isascii():
            needle = source.casefold()
            return lambda index, matcher: _find_scan(index, matcher, index.folded, needle, confirm=True)
    if user.line_local:
        return lambda index, matcher: _engine_scan(index, matcher, user.multiline())
    return None


def _find_scan(index: FieldText, matcher: Matcher, text: str, needle: str, *, confirm: bool) -> list[Row]:
    def next_hit(pos: int, field: int) -> int:
        matcher.tick(field + 1)
        return text.find(needle, pos)

    found: list[Row] = []
    for field in _hit_fields(index, text, next_hit):
        name, (desc, _t, _p) = row = index.rows[field]
        if confirm and field in index.non_ascii and not (matcher.search(name, field + 1)
                                                          or matcher.search(desc, field + 1)):
            continue
        found.append(row)
    return found


def _engine_scan(index: FieldText, matcher: Matcher, compiled: Any) -> list[Row]:
    def next_hit(pos: int, field: int) -> int:
        return matcher.search_from(compiled, index.text, pos, field + 1)

    return [index.rows[field] for field in _hit_fields(index, index.text, next_hit)]


def _hit_fields(index: FieldText, text: str, next_hit: Callable[[int, int], int]) -> list[int]:
    """Fields with a hit (`next_hit(pos, field)`: the first at or after pos, -1 for none), each once,
    in order: after a hit the search resumes at the next field's name."""
    fields: list[int] = []
    pos = 0
    line = 0  # the line `pos` starts; lines are counted between hits, O(len(text)) in all
    total = len(index.rows)
    while line < 2 * total:
        hit = next_hit(pos, line // 2)
        if hit < 0:
            break
        line += text.count("\n", pos, hit)
        field = line // 2
        if field >= total:  # an empty match after the final newline
            break
        fields.append(field)
        pos = text.find("\n", hit) + 1  # the end of the hit's line: a newline always follows
        if line % 2 == 0:  # a hit in the name: the description needs no search
            pos = text.find("\n", pos) + 1
        line = 2 * field + 2
    return fields
