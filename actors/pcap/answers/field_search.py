r"""pcap_list_fields' search over Wireshark's field catalogue (~233k fields): fast, with the results
of one search per field name and description.

The reference is `scan_per_field`: the pattern searched in each field's name, then its description
(~470k engine calls, ~1.5 s). The fast paths search the catalogue's own text (fieldtable.py), the name and
description lines of every field joined with "\n", and map each hit back to its field. The text
holds only ASCII (1 byte a character: ~11 MB, where one U+2013 dash would make it 2 bytes a character): the
few hundred fields with other characters stand there as empty lines that never count, and are
searched one by one with the engine, as the reference does.

- a literal, case-sensitive: `str.find` in that text, block by block, then `in` per line of the
  blocks that hold it (a literal without "\n" cannot span lines);
- a literal, case-insensitive, all ASCII: the same with its lowercase in the lowercased blocks. On
  ASCII text that is exactly the engine's case-insensitive match (the non-ASCII characters it
  folds with ASCII letters, U+017F long s and U+212A Kelvin, are not in that text);
- a case-insensitive non-ASCII literal, or a regex that `UserRegex.line_local` proves cannot see
  past its line: one MULTILINE engine search per matching field over the joined text;
- anything else (\s, [^x], \W, DOTALL ".", \A ..., or a protocol filter): the reference path.

Everything runs in a worker thread on the call's `Matcher` (same budget, same TIMEOUT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import regex

from diagd.actors._user_regex import Matcher, UserRegex
from diagd.actors.pcap.shark.fieldtable import FieldTable
from diagd.actors.pcap.shark.wireshark import Catalogue
from diagd.protocol.errors import DiagdError

Row = tuple[str, tuple[str, str, str]]  # (name, (description, type, protocol))


BLOCK_FIELDS = 1024  # literal search: a block without the needle is skipped by one str.find
JOINED_SCAN_S = 1.0  # a joined-text search slower than this gives way to the per-field one (~1.5 s)


@dataclass(frozen=True)
class FieldText:
    """The catalogue as lines: field i's name is line 2i, its description line 2i+1, a final "\\n";
    a field with non-ASCII text has two empty lines there and is listed in `non_ascii` instead.
    The text is the catalogue's own (fieldtable.FieldTable keeps its fields so), read for each search
    (from a file once the table is spilled): none is kept here."""

    table: FieldTable
    blocks: list[int]  # where field k * BLOCK_FIELDS starts, then the length
    non_ascii: tuple[int, ...]

    @classmethod
    def build(cls, cat: Catalogue) -> FieldText:
        table = cat.table
        starts = table.starts
        blocks = [starts[i] for i in range(0, len(table), BLOCK_FIELDS)]
        return cls(table, [*blocks, starts[len(table)]], table.non_ascii)

    @property
    def text(self) -> str:
        return self.table.text

    def row(self, i: int) -> Row:
        return self.table.row(i)


async def field_text(cat: Catalogue) -> FieldText:
    """The catalogue's `FieldText`: made for each search, as it costs a few hundred list items (~20 µs;
    the text itself is the table's), so nothing is kept between searches."""
    return FieldText.build(cat)


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


Scan = Callable[[FieldText, Matcher], list[int]]


def fast_scan(user: UserRegex) -> Callable[[FieldText, Matcher], list[Row]] | None:
    """How to search the joined text for this pattern, or None when only the reference path is exact."""
    scan = _joined_scan(user)
    if scan is None:
        return None

    def run(index: FieldText, matcher: Matcher) -> list[Row]:
        # The joined text's worst case is worse than the reference's: the engine's required-literal
        # check passes once for the whole text, so a pattern like ".+.+?aaa" is tried at every
        # position of every line (minutes), where per field it skips each line without "aaa". The
        # joined scan gets JOINED_SCAN_S; past that the reference path runs on what is left.
        attempt = matcher.capped(JOINED_SCAN_S)
        try:
            fields = scan(index, attempt)
        except DiagdError as error:
            matcher.gave_up(attempt, error)
            return scan_per_field(index.table.rows(), matcher)
        fields += [i for i in index.non_ascii if matcher.search(index.table.name(i), i + 1)
                   or matcher.search(index.table.value(i)[0], i + 1)]
        return index.table.rows_at(sorted(fields))

    return run


def _joined_scan(user: UserRegex) -> Scan | None:
    source = user.source
    if user.literal and "\n" not in source:
        if not user.compiled.flags & regex.IGNORECASE:
            return lambda index, matcher: _find_scan(index, matcher, source, lower=False)
        if source.isascii():
            needle = source.lower()
            return lambda index, matcher: _find_scan(index, matcher, needle, lower=True)
    if user.line_local:
        return lambda index, matcher: _engine_scan(index, matcher, user.multiline())
    return None


def _find_scan(index: FieldText, matcher: Matcher, needle: str, *, lower: bool) -> list[int]:
    """Blocks of fields holding the needle, split into lines and tested field by field: as cheap
    when nearly every field matches ("e") as when none does. A case-insensitive search lowercases
    each block as it goes (~15 ms for the whole text, instead of keeping an 11 MB lowercase copy).
    Placeholder lines are empty: an empty needle never gets here."""
    found: list[int] = []
    blocks = index.blocks
    for block in range(len(blocks) - 1):
        first = block * BLOCK_FIELDS
        matcher.tick(first + 1)
        start, end = blocks[block], blocks[block + 1]
        chunk = index.table.slice(start, end)
        if lower:
            chunk = chunk.lower()
        if needle not in chunk:  # a needle without "\n" never spans two lines
            continue
        lines = chunk[:-1].split("\n")
        found += [first + k // 2 for k in range(0, len(lines), 2) if needle in lines[k] or needle in lines[k + 1]]
    return found


def _engine_scan(index: FieldText, matcher: Matcher, compiled: Any) -> list[int]:
    text = index.text  # read whole for this search

    def next_hit(pos: int, field: int) -> int:
        return matcher.search_from(compiled, text, pos, field + 1)

    skip = set(index.non_ascii)  # their empty lines may match (^$): they are searched on their own
    return [field for field in _hit_fields(index, text, next_hit) if field not in skip]


def _hit_fields(index: FieldText, text: str, next_hit: Callable[[int, int], int]) -> list[int]:
    """Fields with a hit (`next_hit(pos, field)`: the first at or after pos, -1 for none), each once,
    in order: after a hit the search resumes at the next field's name."""
    fields: list[int] = []
    pos = 0
    line = 0  # the line `pos` starts; lines are counted between hits, O(len(text)) in all
    total = len(index.table)
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
