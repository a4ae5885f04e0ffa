"""Wireshark's ~233k fields (`tshark -G fields`) in a few flat objects instead of ~1M Python ones.

As a dict of name -> (description, type, protocol) tuples the catalogue held ~100 MB of the daemon's
heap (a str per name, description, type and protocol, a tuple and a dict slot per field), plus ~25 MB
for the joined text pcap_list_fields searches and ~25 MB for the lowercase alias dict; small objects
that pin pymalloc arenas for the life of the daemon (issue 12). Here the same facts take ~15 MB:

- `text`: every field's name line and description line, "\\n"-terminated, in catalogue order. It is
  ASCII only (one byte a character); a field with other characters has two empty lines there and
  its name and description in `_extra` (a few hundred). This is also the text the list_fields fast
  path searches (field_search.FieldText), so it exists once.
- `starts`: where field i's name line starts (and, at i = n, the end of the text);
- type and protocol as small integers into the tables of distinct values (a few dozen types, ~3000
  protocols);
- two permutations sorted by name and by lowercased name, for lookups (binary search), case-only
  aliases and prefix ranges.

`spill()` moves the text (~10 MB) to an unlinked file in the user's cache directory: a name or a
description is then read with one pread of its two lines, a search reads the text block by block or
whole for the time it runs, and the daemon's resident memory keeps only the arrays (~4 MB); the
file's pages are the kernel's page cache, given back under memory pressure (issue 12).

It is a read-only `Mapping`: `fields[name]`, `name in fields`, iteration in catalogue order and
`items()` behave as the dict did (a name listed twice keeps its first position and its last value).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import weakref
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import ItemsView, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

Value = tuple[str, str, str]  # (description, type, protocol)
CHUNK = 1024  # iteration splits this many fields' lines at once


def _ids(values: Iterable[str]) -> tuple[array[int], list[str]]:
    """Each value as an index into the list of distinct values (in first-seen order)."""
    ids: dict[str, int] = {}
    codes = [ids.setdefault(v, len(ids)) for v in values]
    return array("H" if len(ids) < 1 << 16 else "I", codes), list(ids)


class FieldTable(Mapping[str, Value]):
    def __init__(self, names: list[str], descs: list[str], types: list[str], protos: list[str]) -> None:
        """Columns of equal length, in catalogue order; every name distinct (see `from_rows`)."""
        self._kinds, self._type_names = _ids(types)
        self._protos, self._proto_names = _ids(protos)
        self._extra: dict[int, tuple[str, str]] = {}
        lines: list[str] = []
        starts, pos = array("I"), 0
        for i, (name, desc) in enumerate(zip(names, descs, strict=True)):
            if "\n" in name or "\n" in desc:  # tshark -G output is split into lines: cannot happen
                raise ValueError(f"field {name!r} holds a newline")
            starts.append(pos)
            if not (name.isascii() and desc.isascii()):
                self._extra[i] = (name, desc)
                name = desc = ""
            lines += (name, desc)
            pos += len(name) + len(desc) + 2
        starts.append(pos)
        self.starts = starts
        self._text: str | None = "\n".join(lines) + "\n"
        self._file: IO[bytes] | None = None  # where the text is once spilled (then _text is None)
        del lines
        self._by_name = array("I", sorted(range(len(names)), key=names.__getitem__))
        if any(names[a] == names[b] for a, b in itertools.pairwise(self._by_name)):
            raise ValueError("field names repeat: build the table with from_rows")
        # Stable: fields whose lowercase names are equal stay in catalogue order, so the last of
        # them is the one `{name.lower(): name for name in fields}` kept.
        self._by_lower = array("I", sorted(range(len(names)), key=lambda i: names[i].lower()))

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[str, Value]]) -> FieldTable:
        """From (name, (description, type, protocol)) rows, as a dict built from them would hold them."""
        merged: dict[str, Value] = {}
        for name, value in rows:
            merged[name] = value
        names = list(merged)
        return cls(names, [v[0] for v in merged.values()], [v[1] for v in merged.values()],
                   [v[2] for v in merged.values()])

    # -- the text ---------------------------------------------------------------------------------

    def spill(self, directory: Path | None = None) -> bool:
        """Move the text to an unlinked file in `directory` ($XDG_CACHE_HOME/diagd by default); False
        (the text stays in memory) when it cannot be written there."""
        if self._text is None:
            return True
        directory = directory or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "diagd"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115  (open as long as the table lives)
        except OSError:
            return False
        try:
            file.write(self._text.encode("ascii"))
            file.flush()
        except OSError:  # a full disk: keep the text in memory
            file.close()
            return False
        weakref.finalize(self, file.close)  # also at exit, without a ResourceWarning
        self._file, self._text = file, None
        return True

    @property
    def spilled(self) -> bool:
        return self._file is not None

    def slice(self, start: int, end: int) -> str:
        """`text[start:end]`, read from the file once spilled (the text is ASCII: a byte a character)."""
        if self._text is not None:
            return self._text[start:end]
        assert self._file is not None
        return os.pread(self._file.fileno(), end - start, start).decode("ascii")

    @property
    def text(self) -> str:
        """Every field's name line and description line (read whole from the file once spilled)."""
        return self._text if self._text is not None else self.slice(0, self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_text": self.text, "_file": None}

    # -- by position -------------------------------------------------------------------------------

    def name(self, i: int) -> str:
        extra = self._extra.get(i)
        if extra is not None:
            return extra[0]
        lines = self.slice(self.starts[i], self.starts[i + 1])
        return lines[:lines.index("\n")]

    def value(self, i: int) -> Value:
        extra = self._extra.get(i)
        if extra is not None:
            desc = extra[1]
        else:
            lines = self.slice(self.starts[i], self.starts[i + 1])
            desc = lines[lines.index("\n") + 1:-1]
        return desc, self._type_names[self._kinds[i]], self._proto_names[self._protos[i]]

    def row(self, i: int) -> tuple[str, Value]:
        return self.name(i), self.value(i)

    def rows_at(self, positions: Iterable[int]) -> list[tuple[str, Value]]:
        """`row(i)` for each of the ascending `positions`, the text read a chunk at a time (one read
        for many hits, not two per field)."""
        found: list[tuple[str, Value]] = []
        first, lines = -CHUNK, [""]
        for i in positions:
            if not first <= i < first + CHUNK:
                first = i - i % CHUNK
                lines = self.slice(self.starts[first], self.starts[min(first + CHUNK, len(self))] - 1).split("\n")
            k = 2 * (i - first)
            name, desc = self._extra.get(i) or (lines[k], lines[k + 1])
            found.append((name, (desc, self._type_names[self._kinds[i]], self._proto_names[self._protos[i]])))
        return found

    @property
    def non_ascii(self) -> tuple[int, ...]:
        """Fields whose lines in `text` are empty placeholders, in order."""
        return tuple(sorted(self._extra))

    # -- lookups -----------------------------------------------------------------------------------

    def index(self, name: str) -> int:
        """The field's position, -1 when there is none of that name."""
        at = bisect_left(self._by_name, name, key=self.name)
        if at < len(self._by_name) and self.name(self._by_name[at]) == name:
            return self._by_name[at]
        return -1

    def _lower(self, i: int) -> str:
        return self.name(i).lower()

    def alias(self, lowered: str) -> str | None:
        """The last field (in catalogue order) whose lowercase name is `lowered`."""
        at = bisect_right(self._by_lower, lowered, key=self._lower) - 1
        if at >= 0 and self._lower(self._by_lower[at]) == lowered:
            return self.name(self._by_lower[at])
        return None

    def with_prefix(self, prefix: str, *, lower: bool = False) -> list[int]:
        """Positions (ascending) of the fields whose name (lowercased, with lower=True) starts with prefix."""
        order, key = (self._by_lower, self._lower) if lower else (self._by_name, self.name)
        found = []
        for at in range(bisect_left(order, prefix, key=key), len(order)):
            if not key(order[at]).startswith(prefix):
                break
            found.append(order[at])
        return sorted(found)

    # -- Mapping -----------------------------------------------------------------------------------

    def __getitem__(self, name: str) -> Value:
        i = self.index(name)
        if i < 0:
            raise KeyError(name)
        return self.value(i)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.index(name) >= 0

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __iter__(self) -> Iterator[str]:
        for first, lines in self._chunks():
            for k in range(0, len(lines), 2):
                extra = self._extra.get(first + k // 2)
                yield lines[k] if extra is None else extra[0]

    def rows(self) -> Iterator[tuple[str, Value]]:
        """(name, value) in catalogue order, a chunk of lines split at a time."""
        types, protos = self._type_names, self._proto_names
        for first, lines in self._chunks():
            for k in range(0, len(lines), 2):
                i = first + k // 2
                extra = self._extra.get(i)
                name, desc = (lines[k], lines[k + 1]) if extra is None else extra
                yield name, (desc, types[self._kinds[i]], protos[self._protos[i]])

    def items(self) -> ItemsView[str, Value]:
        return _Items(self)

    def _chunks(self) -> Iterator[tuple[int, list[str]]]:
        n = len(self)
        for first in range(0, n, CHUNK):
            last = min(first + CHUNK, n)
            yield first, self.slice(self.starts[first], self.starts[last] - 1).split("\n")


class _Items(ItemsView[str, Value]):
    """`items()` of a FieldTable: rows split a chunk at a time, not looked up name by name."""

    _mapping: FieldTable

    def __iter__(self) -> Iterator[tuple[str, Value]]:
        return self._mapping.rows()


def as_table(fields: Mapping[str, Value]) -> FieldTable:
    return fields if isinstance(fields, FieldTable) else FieldTable.from_rows(cast(Iterable[tuple[str, Value]],
                                                                                  fields.items()))
