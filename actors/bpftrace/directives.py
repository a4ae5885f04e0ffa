"""The C preprocessor in a bpftrace program: its directives read as clang reads them, checked against an
allow-list, and the preprocessor operators that reach files refused wherever they appear.

bpftrace 0.17 hands clang, as root, every piece of the program before its first probe that is not a
comment: struct definitions verbatim, and each `#` to the end of its line *wherever the `#` stands*
(after a struct on the same line too), the pieces joined by newlines. Clang then runs its whole
preprocessor over them: `#import` and `#include_next` read files like `#include`, `#pragma GCC
dependency` and its operator form `_Pragma(...)` test one, `__has_include(...)` tells whether one
exists. So the program is read here as the preprocessor reads it, never searched for words:

- CR LF and lone CR end lines (clang's newlines); backslash-newline splices are joined first (a
  backslash, ASCII blanks, then the newline, as clang accepts); comments are blanks and may span
  lines; string and character literals end at their quote or the line's end; `#include`'s `<...>`
  and `"..."` are header names (no comment inside); `%:` is `#`; every Unicode blank is a blank.
- A directive is a `#` (or `%:`) outside a literal and a comment, then blanks and comments (which
  may cross lines), then its name: unless the `#` is an operator inside a directive on that
  directive's first line, every `#` is read as starting a directive, mid-line too (bpftrace's lexer
  makes one of it), and so is one on a directive's continuation line (bpftrace lexes that line
  anew and hands clang its `#` as a line of its own). So is a `#` name after a `}` in a `//` comment
  or a literal: bpftrace ends a struct at the brace that closes it by count, wherever it stands, and
  lexes the rest of the line anew (`struct S { int a; // } #import "f"` imports).
- Refused wherever they appear (directive, struct, probe): the names that reach files
  (`REFUSED_NAMES`), `##` token pasting (it could assemble one of them from harmless halves), a
  `//` comment continued by a backslash (bpftrace ends it at the line's end, clang at the next
  line's: the two would read that line differently) and NUL (the program travels in argv).
- A `#!` first line is a shebang: bpftrace skips it, so it is skipped here (to its raw line end).

Trigraphs (`??=` for `#`) are not read: clang ignores them in the GNU C mode bpftrace uses. Clang
rejects a universal character name for a basic character (`_Pr\\u0061gma`), so none can spell a
refused name.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from diagd.protocol.errors import DiagdError, ErrorCode

CONDITIONALS = ("if", "ifdef", "ifndef", "elif", "elifdef", "elifndef", "else", "endif")
# `include` is also gated by the Landlock rule (settings.check_confinement): it reads a file.
ALLOWED = ("define", "undef", *CONDITIONALS, "include")
HEADER_NAME_DIRECTIVES = frozenset({"include", "import", "include_next"})  # their operand is a header name
_EXISTS = "it tells whether a file exists (clang looks as root)"
_PRAGMA = "it runs a #pragma (`GCC dependency` opens a file)"
REFUSED_NAMES = {
    "__has_include": _EXISTS, "__has_include_next": _EXISTS,
    "__has_include__": _EXISTS, "__has_include_next__": _EXISTS,  # GCC's older spellings
    "__has_embed": "it tells whether a file exists and what it holds",
    "_Pragma": _PRAGMA, "__pragma": _PRAGMA,
}
_WHY = {"import": "it reads a file, as #include does", "include_next": "it reads a file, as #include does",
        "pragma": "pragmas reach the compiler (`#pragma GCC dependency` opens a file)", "embed": "it reads a file"}
ALLOWED_TEXT = ", ".join(f"#{name}" for name in ALLOWED)

# Clang: a backslash, ASCII blanks (warned about), a newline. Never a Unicode blank: a splice clang does
# not make would join a line into a literal here and hide what clang reads on it.
_SPLICE = re.compile(r"\\[ \t\f\v]*\n")
# A name: ASCII only, anything else ends it (so `×_Pragma` is `_Pragma` here, as for clang, for which
# `×` is a stray character; where clang reads a longer name, the check only refuses more).
_IDENT = re.compile(r"[A-Za-z0-9_]+")
_TOKEN_START = re.compile(r"[\n/\"'#%A-Za-z0-9_\x00]")
_CAT = re.compile(r"\bcat\s*\(")


@dataclass(frozen=True)
class Directive:
    name: str  # "" for the null directive (a `#` alone)
    line: int


@dataclass(frozen=True)
class Refusal:
    spelled: str  # as the check names it: "#import", "__has_include", "##", ...
    line: int
    why: str


@dataclass(frozen=True)
class Reading:
    directives: tuple[Directive, ...]
    refused: tuple[Refusal, ...]
    code: str  # the joined program with comments and literals blanked (newlines kept)

    @property
    def includes(self) -> bool:
        return any(d.name == "include" for d in self.directives)

    @property
    def cat(self) -> bool:
        return _CAT.search(self.code) is not None


def check(program: str) -> Reading:
    """The program's reading, or INVALID_ARGUMENT naming the first thing refused and the allow-list."""
    reading = read(program)
    if reading.refused:
        first = reading.refused[0]
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{first.spelled} on line {first.line} is refused: {first.why}. "
                         f"bpftrace programs may use only the preprocessor directives {ALLOWED_TEXT} "
                         "(#include only where bpftrace runs under Landlock, or with [bpftrace] allow_unconfined)",
                         refused=first.spelled, line=first.line, allowed_directives=[f"#{d}" for d in ALLOWED],
                         hint="clang preprocesses the program as root: directives outside the list, and "
                              "__has_include / _Pragma anywhere, could read or probe any file")
    return reading


def read(program: str) -> Reading:
    return _Reader(program).run()


class _Reader:
    def __init__(self, program: str) -> None:
        raw = program.replace("\r\n", "\n").replace("\r", "\n")
        if raw.startswith("#!"):  # a shebang: bpftrace skips its raw line, backslash and all
            end = raw.find("\n")
            end = len(raw) if end < 0 else end
            raw = " " * end + raw[end:]
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", raw)]
        # The joined text; a splice removed before joined index p shifts every index from p on.
        parts: list[str] = []
        self._splices, self._shift = [0], [0]
        last = joined = 0
        for m in _SPLICE.finditer(raw):
            parts.append(raw[last:m.start()])
            joined += m.start() - last
            self._splices.append(joined)
            self._shift.append(self._shift[-1] + m.end() - m.start())
            last = m.end()
        parts.append(raw[last:])
        self.s = "".join(parts)
        self.code = list(self.s)
        self.directives: list[Directive] = []
        self.refused: list[Refusal] = []

    def line(self, i: int) -> int:
        """The raw (1-based) line of joined index i."""
        k = bisect.bisect_right(self._splices, i) - 1
        return bisect.bisect_right(self._line_starts, i + self._shift[k])

    def refuse(self, spelled: str, i: int, why: str) -> None:
        self.refused.append(Refusal(spelled, self.line(i), why))

    def blank(self, start: int, end: int) -> None:
        for k in range(start, end):
            if self.code[k] != "\n":
                self.code[k] = " "

    def run(self) -> Reading:
        s, n = self.s, len(self.s)
        directive_line: int | None = None  # the raw line of the directive being read; None between them
        i = 0
        while i < n:
            m = _TOKEN_START.search(s, i)
            if m is None:
                break
            i = m.start()
            c = s[i]
            if c == "\n":
                directive_line = None
                i += 1
            elif c == "\x00":
                self.refuse("a NUL character", i, "a program cannot hold one (it is passed in argv)")
                i += 1
            elif s.startswith("//", i):
                end = s.find("\n", i)
                end = n if end < 0 else end
                k = bisect.bisect_right(self._splices, i)
                if k < len(self._splices) and self._splices[k] <= end:
                    self.refuse("a // comment ending in a backslash", i, "bpftrace ends the comment at the end "
                                "of its line, clang continues it onto the next, so they would read that line "
                                "differently; remove the backslash")
                self._exposed(i, end)
                self.blank(i, end)
                i = end
            elif s.startswith("/*", i):
                i = self._blank_or_comment(i)
            elif c in "\"'":
                end = self._literal_end(i)
                self._exposed(i, end)
                i = end
            elif c == "#" or s.startswith("%:", i):
                width = 1 if c == "#" else 2
                if directive_line is not None and directive_line == self.line(i):
                    # An operator inside the directive: `#` stringizes, `##` pastes.
                    nxt = i + width
                    if s.startswith(("#", "%:"), nxt):
                        self.refuse("## (token pasting)", i, "it could assemble a refused name "
                                    "(_Pragma, __has_include) from harmless halves")
                        nxt += 1 if s[nxt] == "#" else 2
                    i = nxt
                else:
                    directive_line = self.line(i)
                    i = self._directive(i, width)
            elif m := _IDENT.match(s, i):  # a name, or a number (a pp-number: `1_Pragma` is not `_Pragma`)
                if m.group() in REFUSED_NAMES:
                    self.refuse(m.group(), i, REFUSED_NAMES[m.group()] + "; it is refused anywhere in a program")
                i = m.end()
            else:  # `/` or `%` alone
                i += 1
        return Reading(tuple(self.directives), tuple(self.refused), "".join(self.code))

    def _literal_end(self, i: int) -> int:
        """A string or character literal: to its closing quote, or to the end of the line (clang and
        bpftrace both end an unterminated one there)."""
        s, quote, k = self.s, self.s[i], i + 1
        while k < len(s) and s[k] != "\n":
            if s[k] == quote:
                self.blank(i + 1, k)
                return k + 1
            k += 2 if s[k] == "\\" and k + 1 < len(s) and s[k + 1] != "\n" else 1
        self.blank(i + 1, k)
        return k

    def _blank_or_comment(self, i: int, *, blank: bool = True) -> int:
        """Past the blanks and /* */ comments from i (comments may cross lines; newlines end the run);
        `blank`: blank the comments in `code` (not when reading inside a comment or a literal)."""
        s = self.s
        while i < len(s):
            if s[i] != "\n" and s[i].isspace():  # clang reads Unicode blanks as blanks too
                i += 1
            elif s.startswith("/*", i):
                end = s.find("*/", i + 2)
                end = len(s) if end < 0 else end + 2
                if blank:
                    self.blank(i, end)
                i = end
            else:
                break
        return i

    def _exposed(self, start: int, end: int) -> None:
        """A // comment or a literal at [start, end) hides what follows a `}` in it from this reading, not
        from clang: bpftrace ends a struct definition at its closing brace wherever it stands (in a
        comment or a literal too) and lexes the rest of the line anew, so a `#` there is a line of its own
        for clang. Each `#` name after a `}` in it is read as a directive."""
        brace = self.s.find("}", start, end)
        if brace < 0:
            return
        for m in re.finditer("#|%:", self.s[brace:end]):
            self._directive(brace + m.start(), len(m.group()), exposed=True)

    def _directive(self, hash_at: int, width: int, *, exposed: bool = False) -> int:
        s, n = self.s, len(self.s)
        i = self._blank_or_comment(hash_at + width, blank=not exposed)
        m = _IDENT.match(s, i)
        if m is None:
            if exposed:
                pass  # `#%d` in a string: clang would find no directive name there, nothing to run
            elif i >= n or s[i] == "\n" or s.startswith("//", i):
                self.directives.append(Directive("", self.line(hash_at)))  # the null directive
            elif s[i] == "!":
                self.refuse("#!", hash_at, "a shebang is accepted only as the program's first line")
            else:
                self.refuse(f"#{s[i]}", hash_at, "it is not a directive bpftrace programs may use "
                            "(a line marker, or a name clang would not read as the check does)")
            return i
        name = m.group()
        self.directives.append(Directive(name, self.line(hash_at)))
        end = m.end()
        if name not in ALLOWED:
            self.refuse(f"#{name}", hash_at, _WHY.get(name, "bpftrace programs do not need it"))
        elif end < n and not s[end].isspace() and ord(s[end]) > 0x7F:
            # Clang may read `include` plus this character as one name, or not: either way not as checked.
            self.refuse(f"#{name}{s[end]}", hash_at, "a directive name must end in a blank or punctuation")
        if name in HEADER_NAME_DIRECTIVES and not exposed:
            end = self._header_name(end)
        return end

    def _header_name(self, i: int) -> int:
        """`<...>` or `"..."` after #include: one token, no comment or escape inside (as clang lexes it)."""
        s = self.s
        i = self._blank_or_comment(i)
        if i >= len(s) or s[i] not in "<\"":
            return i
        close = ">" if s[i] == "<" else "\""
        k = i + 1
        while k < len(s) and s[k] not in (close, "\n"):
            k += 1
        self.blank(i + 1, k)
        return k + 1 if k < len(s) and s[k] == close else k
