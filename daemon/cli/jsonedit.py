"""The JSON (and JSONC) text of a host's configuration file: strict parsing, and edits of one member that keep the rest.

JSON here is RFC 8259 JSON: NaN, Infinity, -Infinity and numbers too large for a double (1e400, which
Python would read as infinity) are refused when read and never written (`dumps`). JSONC, VS Code's
mcp.json, also allows // and /* */ comments and trailing commas: it is read by blanking them (every
offset and line break kept, so an error points at the right place) and parsing what is left as JSON.

An edit (`set_member`, `remove_member`) changes only the span of the member it is about: the rest of
the text (comments, layout, key order, numbers as written, the other servers) stays byte for byte. Its
result is parsed again and must be exactly the data wanted; when it is not, or when there is no object
to edit in place, the edit returns None and the caller writes the whole file with `dumps` instead.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

# A string, a comment (an unclosed /* alone), or a comma: what JSONC reading has to look at.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\r\n]*|/\*.*?\*/|/\*|,', re.DOTALL)
_DECODER = json.JSONDecoder()  # finds where a value ends, in text already parsed strictly


class JsonError(ValueError):
    """Text that is not (strict) JSON, or JSONC; `str()` says what and where."""


def loads(text: str, *, comments: bool = False) -> Any:
    """The value of `text` (None when it is empty, or only comments): strict JSON, or JSONC with `comments`."""
    source = _blanked(text)[1] if comments else text
    if not source.strip():
        return None
    try:
        return json.loads(source, parse_constant=_no_constant, parse_float=_finite)
    except JsonError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonError(f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise JsonError("arrays or objects nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise JsonError(str(exc).split(";")[0]) from None


def has_comments(text: str) -> bool:
    return _blanked(text)[0] != text


def dumps(value: Any, indent: str | None = "  ") -> str:
    """JSON text of `value`: ValueError rather than NaN or Infinity, which JSON does not have."""
    return json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False)


def set_member(text: str, keys: tuple[str, ...], value: Any, *, comments: bool = False) -> str | None:
    """`text` with the member at `keys` (objects created on the way) set to `value`; None: edit the data."""
    want = loads(text, comments=comments)
    if not isinstance(want, dict):
        return None
    layout = _Layout(text, comments)
    found = layout.find(keys)
    if found is None:
        return None
    obj, depth, member = found
    if member is not None and depth == len(keys) - 1:
        indent = _line_indent(text, member.start)
        edits = [(member.value_start, member.value_end, _dump(value, indent, layout.unit, layout.multiline))]
    else:
        missing = value
        for key in reversed(keys[depth + 1:]):
            missing = {key: missing}
        edits = layout.insert(obj, keys[depth], missing)
    node = want
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return _checked(_apply(text, edits), want, comments)


def remove_member(text: str, keys: tuple[str, ...], *, comments: bool = False) -> str | None:
    """`text` without the member at `keys` (and its comma); None when it is not there or not removable."""
    want = loads(text, comments=comments)
    layout = _Layout(text, comments)
    found = layout.find(keys)
    if not isinstance(want, dict) or found is None:
        return None
    obj, depth, member = found
    if member is None or depth != len(keys) - 1:
        return None
    node = want
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    return _checked(_apply(text, layout.remove(obj, member)), want, comments)


def _no_constant(name: str) -> Any:
    raise JsonError(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def _finite(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise JsonError(f"the number {literal} is too large for a double: it would read as infinity")
    return number


def _blanked(text: str) -> tuple[str, str]:
    """(`text` with its comments blanked, ... and its trailing commas too): same length, same line breaks."""
    out = list(text)
    commas = []
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token == "/*":
            line = text.count("\n", 0, match.start()) + 1
            column = match.start() - text.rfind("\n", 0, match.start())
            raise JsonError(f"a /* comment is not closed (line {line} column {column})")
        if token == ",":
            commas.append(match.start())
        elif token.startswith("/"):
            out[match.start():match.end()] = [c if c in "\r\n" else " " for c in token]
    uncommented = "".join(out)
    for at in commas:
        after = _skip(uncommented, at + 1)
        if uncommented[after:after + 1] in ("}", "]"):
            out[at] = " "
    return uncommented, "".join(out)


def _skip(text: str, at: int) -> int:
    """The index of the first character from `at` on that is not JSON whitespace (len(text) if none)."""
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


@dataclass(frozen=True)
class _Member:
    key: str
    start: int  # the key's opening quote
    value_start: int
    value_end: int


@dataclass(frozen=True)
class _Object:
    start: int  # its {
    end: int  # its }
    members: tuple[_Member, ...]


class _Layout:
    """Where the objects and members of a text (already parsed) are, and how it is indented."""

    def __init__(self, text: str, comments: bool) -> None:
        self.text = text
        self.uncommented, self.plain = _blanked(text) if comments else (text, text)
        start = _skip(self.plain, 0)
        self.top = self.object_at(start)
        self.multiline = "\n" in text.strip()
        first = self.top.members[0].start if self.top and self.top.members else None
        indent = _line_indent(text, first) if first is not None and _starts_line(text, first) else ""
        self.unit = indent or "  "

    def object_at(self, at: int) -> _Object | None:
        plain = self.plain
        if plain[at:at + 1] != "{":
            return None
        members = []
        i = _skip(plain, at + 1)
        while plain[i] != "}":
            key, after_key = _DECODER.raw_decode(plain, i)
            value_start = _skip(plain, _skip(plain, after_key) + 1)  # past the colon
            _, value_end = _DECODER.raw_decode(plain, value_start)
            members.append(_Member(key, i, value_start, value_end))
            i = _skip(plain, value_end)
            if plain[i] == ",":
                i = _skip(plain, i + 1)
        return _Object(at, i, tuple(members))

    def find(self, keys: tuple[str, ...]) -> tuple[_Object, int, _Member | None] | None:
        """(the deepest object on the way to `keys`, its depth, its member named keys[depth] or None)."""
        obj = self.top
        if obj is None:
            return None
        for depth, key in enumerate(keys):
            member = next((m for m in reversed(obj.members) if m.key == key), None)  # the last counts
            if member is None or depth == len(keys) - 1:
                return obj, depth, member
            inner = self.object_at(member.value_start)
            if inner is None:
                return None
            obj = inner
        return None

    def insert(self, obj: _Object, key: str, value: Any) -> list[tuple[int, int, str]]:
        """Edits adding `"key": value` as the object's last member."""
        text = self.text
        close_line = text.rfind("\n", 0, obj.end) + 1
        close_indent = _line_indent(text, obj.end)
        if obj.members and _starts_line(text, obj.members[0].start):
            indent = _line_indent(text, obj.members[0].start)
        else:
            indent = close_indent + self.unit
        member = f"{json.dumps(key, ensure_ascii=False)}: {_dump(value, indent, self.unit, self.multiline)}"
        edits = []
        if obj.members:
            last = obj.members[-1]
            if self.uncommented[_skip(self.uncommented, last.value_end)] != ",":
                edits.append((last.value_end, last.value_end, ","))
        if not self.multiline:
            edits.append((obj.end, obj.end, (" " if obj.members else "") + member))
        elif not text[close_line:obj.end].strip():  # the } on a line of its own
            edits.append((close_line, close_line, f"{indent}{member}\n"))
        else:
            edits.append((obj.end, obj.end, f"\n{indent}{member}\n{close_indent}"))
        return edits

    def remove(self, obj: _Object, member: _Member) -> list[tuple[int, int, str]]:
        """Edits removing `member` (with a comment on its line) and one comma: its own, or else the one before."""
        text, uncommented = self.text, self.uncommented
        if obj.members == (member,) and not (text[obj.start + 1:member.start] + text[member.value_end:obj.end]).strip():
            return [(obj.start + 1, obj.end, "")]  # the object's only member: {} is left
        after = _skip(uncommented, member.value_end)
        index = obj.members.index(member)
        edits = []
        end = member.value_end
        if uncommented[after] == ",":
            end = after + 1
        elif index > 0:
            comma = _skip(uncommented, obj.members[index - 1].value_end)
            if not text[comma + 1:member.start].strip():
                return [(comma, member.value_end, "")]  # `, "name": value`, as an insert left it
            edits.append((comma, comma + 1, ""))  # a comment after it stays
        start = member.start
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        rest = text[end:line_end].strip()
        if line_end >= 0 and not text[line_start:start].strip() and (not rest or rest.startswith("//")):
            start, end = line_start, line_end + 1  # its whole lines, not the layout around them
        else:
            while text[end:end + 1] in (" ", "\t") and end > member.value_end:  # `"name": value, ` of a line
                end += 1
        edits.append((start, end, ""))
        return edits


def _starts_line(text: str, at: int) -> bool:
    return not text[text.rfind("\n", 0, at) + 1:at].strip()


def _line_indent(text: str, at: int) -> str:
    line = text[text.rfind("\n", 0, at) + 1:at]
    return line[:len(line) - len(line.lstrip(" \t"))]


def _dump(value: Any, indent: str, unit: str, multiline: bool) -> str:
    if not multiline:
        return dumps(value, None)
    return dumps(value, unit).replace("\n", "\n" + indent)


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    out, at = [], 0
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1])):  # stable: edits at one place keep their order
        out += [text[at:start], new]
        at = end
    return "".join(out) + text[at:]


def _checked(text: str, want: Any, comments: bool) -> str | None:
    try:
        return text if loads(text, comments=comments) == want else None
    except JsonError:
        return None
