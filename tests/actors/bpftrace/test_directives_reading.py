"""directives.read, piece by piece, on programs whose reading is written out by hand from the C
preprocessor's rules (C11 5.1.1.2 translation phases 1-3 and 6.10, as clang applies them; bpftrace 0.17
hands clang every `#` to the end of its line):

- phase 1-2: CR LF and lone CR end lines; a backslash (then ASCII blanks, which clang accepts with a
  warning) then a newline splices two lines into one; a `#!` first line is bpftrace's shebang, skipped;
- phase 3: a comment is one blank (here: blanked in place, newlines kept, so columns stay); `//` runs
  to the end of the line, `/* */` to its first `*/` or the end of the text; string and character
  literals run to their closing quote (a backslash escapes the next character) or the end of the line;
  after #include/#import/#include_next, `<...>` and `"..."` are header names: no comment or escape
  inside;
- 6.10: a directive is `#` (or its digraph `%:`), blanks and comments, then a name; `#` alone is the
  null directive; inside a directive `#` stringizes and `##` pastes.

`Reading.code` is the program with the contents of comments, literals and header names blanked
(written here with `~` for each blanked character); `directives` and `refused` are every one found,
in order, with the raw line each starts on."""

from __future__ import annotations

import pytest

from diagd.actors.bpftrace import directives
from diagd.actors.bpftrace.directives import Directive
from diagd.protocol.errors import DiagdError, ErrorCode

# (program, its code with ~ for a blanked character)
CODE = {
    "string": ('BEGIN { printf("a%d\\n", 1); }', 'BEGIN { printf("~~~~~", 1); }'),
    "escaped quote": ('BEGIN { @s = "a\\"b"; cat("/x"); }', 'BEGIN { @s = "~~~~"; cat("~~"); }'),
    "escaped backslash": ('BEGIN { @s = "\\\\"; cat("/x"); }', 'BEGIN { @s = "~~"; cat("~~"); }'),
    "escaped backslash then quote": ('@s = "\\\\\\""; x', '@s = "~~~~"; x'),
    "character literal holding a quote": ("@c = '\"'; cat(\"/x\")", "@c = '~'; cat(\"~~\")"),
    "character literal holding an escaped quote": ("@c = '\\''; x", "@c = '~~'; x"),
    "empty string": ('@s = ""; x', '@s = ""; x'),
    "string ends with its line": ('BEGIN { @s = "ab;\ncat("/x"); }', 'BEGIN { @s = "~~~\ncat("~~"); }'),
    "string ends with the text": ('@s = "ab', '@s = "~~'),
    "string ends in a backslash with the text": ('@s = "a\\', '@s = "~~'),
    "string holding a comment": ('@s = "/* x */"; y', '@s = "~~~~~~~"; y'),
    "block comment": ("BEGIN { /* c */ exit(); }", "BEGIN { ~~~~~~~ exit(); }"),
    "block comment across lines": ("BEGIN {/* a\nb */ }", "BEGIN {~~~~\n~~~~ }"),
    "block comment holding a string": ('x /* "a */ y', "x ~~~~~~~~ y"),
    "empty block comment": ("x/**/y", "x~~~~y"),
    "block comment to the end": ("BEGIN { /* ab", "BEGIN { ~~~~~"),
    "line comment": ('BEGIN { } // c "x\n', "BEGIN { } ~~~~~~~\n"),
    "line comment to the end": ("x // c", "x ~~~~"),
    "slash and percent alone": ("@x = 4 / 2 % 3;", "@x = 4 / 2 % 3;"),
    "splice": ('BEGIN { ca\\\nt("/x"); }', 'BEGIN { cat("~~"); }'),
    "splice after blanks": ("ca\\ \t\nt", "cat"),
    "two splices": ("a\\\nb\\\nc", "abc"),
    "splice in a string": ('"a\\\nb" x', '"~~" x'),
    "shebang": ("#!/usr/bin/bpftrace\nBEGIN { }", "~~~~~~~~~~~~~~~~~~~\nBEGIN { }"),
    "shebang ending in a backslash": ("#!/x \\\nBEGIN", "~~~~~~\nBEGIN"),
    "shebang alone": ("#!/x", "~~~~"),
    "CR LF and CR": ("BEGIN {\r\n/* a\r\nb */ }\r", "BEGIN {\n~~~~\n~~~~ }\n"),
    "header name <>": ("#include <a/*b>\nx", "#include <~~~~>\nx"),
    "header name in quotes": ('#include "a//b"\nx', '#include "~~~~"\nx'),
    "header name after a comment": ("#include /*c*/ <x>", "#include ~~~~~ <~>"),
    "header name to the end of its line": ("#include <abc\nBEGIN", "#include <~~~\nBEGIN"),
    "header name to the end of the text": ("#include <ab", "#include <~~"),
    "#include alone": ("#include", "#include"),
    "#include then a name": ("#include H\nx", "#include H\nx"),
    "#import's header name": ("#import <a b>", "#import <~~~>"),
    "a comment between # and the name": ("#/* c */define X 1", "#~~~~~~~define X 1"),
    "an escaped quote at the end of the text": ('@s = "\\"', '@s = "~~'),
    "two block comments": ('/* a */ cat("/x"); /* b */', '~~~~~~~ cat("~~"); ~~~~~~~'),
    "an empty header name": ("#include <> x", "#include <> x"),
    "an empty quoted header name": ('#include "" x', '#include "" x'),
    "a string after a header name": ('#include "a" x "b"', '#include "~" x "~"'),
    "a quote inside a header name": ('#include <a"> x', '#include <~~> x'),
    "a string right after a header name": ('#include <a>"b', '#include <~>"~'),
    "#include then a name and a comment": ("#include XY /* c */", "#include XY ~~~~~~~"),
    "#if's operand is no header name": ("#if <a/*b>\nx", "#if <a~~~~\n~"),
}


@pytest.mark.parametrize("case", list(CODE))
def test_code_blanks_comments_literals_and_header_names(case: str) -> None:
    program, expected = CODE[case]
    assert directives.read(program).code == expected.replace("~", " ")


# (program, [(directive name, line)], [(refused spelling, line)])
DIRECTIVES: dict[str, tuple[str, list[tuple[str, int]], list[tuple[str, int]]]] = {
    "none": ("BEGIN { exit(); }", [], []),
    "each allowed one": ("#define A 1\n#undef A\n#if 1\n#elif 2\n#else\n#endif\n#ifdef A\n#endif\n#ifndef A\n"
                         "#elifdef B\n#elifndef C\n#endif\n#include <x>",
                         [("define", 1), ("undef", 2), ("if", 3), ("elif", 4), ("else", 5), ("endif", 6),
                          ("ifdef", 7), ("endif", 8), ("ifndef", 9), ("elifdef", 10), ("elifndef", 11),
                          ("endif", 12), ("include", 13)], []),
    "null directive": ("#\n#  \n# // c\n#", [("", 1), ("", 2), ("", 3), ("", 4)], []),
    "digraph": ("%:define X 1\n%: undef X", [("define", 1), ("undef", 2)], []),
    "unicode blank": ("#\u00a0define X\n#\u2003undef X", [("define", 1), ("undef", 2)], []),
    "stringize": ("#define S(x) #x\n#define T(x) %:x", [("define", 1), ("define", 2)], []),
    "paste": ("#define C(a, b) a##b", [("define", 1)], [("## (token pasting)", 1)]),
    "paste with digraphs": ("#define C(a, b) a%:%:b\n#define D(a, b) a#%:b\n#define E(a, b) a%:#b",
                            [("define", 1), ("define", 2), ("define", 3)],
                            [("## (token pasting)", 1), ("## (token pasting)", 2), ("## (token pasting)", 3)]),
    "two pastes": ("#define C(a, b, c) a####b", [("define", 1)],
                   [("## (token pasting)", 1), ("## (token pasting)", 1)]),
    "three # then a name": ("#define C(a) a###a", [("define", 1)], [("## (token pasting)", 1)]),
    "paste outside a directive": ("BEGIN { @a##b = 1; }", [], [("##", 1)]),
    "refused directives": ('#import "a"\n#include_next <b>\n#pragma once\n#embed "c"\n#line 4\n#error x\n'
                           "#warning y\n#ident z\n#sccs w\n#assert v",
                           [("import", 1), ("include_next", 2), ("pragma", 3), ("embed", 4), ("line", 5),
                            ("error", 6), ("warning", 7), ("ident", 8), ("sccs", 9), ("assert", 10)],
                           [("#import", 1), ("#include_next", 2), ("#pragma", 3), ("#embed", 4), ("#line", 5),
                            ("#error", 6), ("#warning", 7), ("#ident", 8), ("#sccs", 9), ("#assert", 10)]),
    "names are case-sensitive": ("#DEFINE X\n#Include <x>", [("DEFINE", 1), ("Include", 2)],
                                 [("#DEFINE", 1), ("#Include", 2)]),
    "a line marker and stray characters": ('# 12 "f"\n#$\n#"x"\n#!x', [("12", 1)],
                                           [("#12", 1), ("#$", 2), ('#"', 3), ("#!", 4)]),
    "a name running on past ASCII": ("#include\u00e9 <x>\n#define\u00b5 1\n#define\u00a0X",
                                     [("include", 1), ("define", 2), ("define", 3)],
                                     [("#include\u00e9", 1), ("#define\u00b5", 2)]),
    "lines after splices": ("BEGIN { }\n#define A \\\n 1 \\\n 2\n#import \"x\"\n%:\\\nimport <y>",
                            [("define", 2), ("import", 5), ("import", 6)], [("#import", 5), ("#import", 6)]),
    "lines after CR LF": ("x\r\n\r\n#import <a>\rx\r#pragma z", [("import", 3), ("pragma", 5)],
                          [("#import", 3), ("#pragma", 5)]),
    "a comment across lines before the name": ("x\n#/* a\n\n*/ import <a>", [("import", 2)], [("#import", 2)]),
    "mid-line after a struct": ("struct S { int a; } #define X 1 #import <a>", [("define", 1)], []),
    "the second # of a directive line is an operator": ("#define X 1 # import", [("define", 1)], []),
    "a directive's continuation line": ("#define X 1 \\\n#import <a>", [("define", 1), ("import", 2)],
                                        [("#import", 2)]),
    "in a block comment": ("/* #import <a> */ x\n/*\n#pragma x\n*/", [], []),
    "in a line comment": ("x // #import <a>\n// #pragma", [], []),
    "in a string": ('BEGIN { printf("#import %d #pragma\\n", 1); }', [], []),
    "in a character literal": ("BEGIN { @c = '#'; }", [], []),
    "after a brace in a line comment": ("struct S { int a; // } #import <a> #define X\n}",
                                        [("import", 1), ("define", 1)], [("#import", 1)]),
    "after a brace in a string": ('struct S { int a; " } %:pragma x"\n}', [("pragma", 1)], [("#pragma", 1)]),
    "a brace before a line comment hides nothing": ("BEGIN { exit(); } // see #import", [], []),
    "a brace after a line comment hides nothing": ("x // #import\n}", [], []),
    "a format after a brace in a string": ('BEGIN { printf("} #%d #\\n", 1); }', [], []),
    "a comment opened after a brace in a comment": ("// } # /* x\n#define Y\n// */",
                                                    [("define", 2)], []),
    "the header name of an exposed #include is not read": ('// } #include "a\nb" #import <c>',
                                                           [("include", 1)], []),
    "a shebang on the first line only": ("#!/usr/bin/env bpftrace\n#!x", [], [("#!", 2)]),
    "refused names anywhere": ("#if __has_include(<a>)\n#endif\nstruct S { _Pragma(\"x\") };\n"
                               "BEGIN { @x = __has_include_next; @y = __has_embed; @z = __pragma; }\n"
                               "#define Q __has_include__ __has_include_next__",
                               [("if", 1), ("endif", 2), ("define", 5)],
                               [("__has_include", 1), ("_Pragma", 3), ("__has_include_next", 4),
                                ("__has_embed", 4), ("__pragma", 4), ("__has_include__", 5),
                                ("__has_include_next__", 5)]),
    "names that only contain a refused one": ("BEGIN { @_Pragma_x = 1; @x_Pragma = 2; @y = 1_Pragma; "
                                              "@z = __has_includes; }", [], []),
    "a refused name spliced": ("BEGIN { _Pra\\\ngma(\"x\"); }", [], [("_Pragma", 1)]),
    "a refused name after a stray character": ("BEGIN { \u00d7_Pragma(\"x\"); }", [], [("_Pragma", 1)]),
    "a NUL": ("x\n\x00y\x00", [], [("a NUL character", 2), ("a NUL character", 2)]),
    "a line comment continued": ("// a \\\n#import <x>\nBEGIN { }", [],
                                 [("a // comment ending in a backslash", 1)]),
    "a line comment continued onto an empty line": ("// a \\\n\n#import <x>", [("import", 3)],
                                                    [("a // comment ending in a backslash", 1), ("#import", 3)]),
    "a splice after a line comment's line": ("// a\nx \\\ny", [], []),
    "a splice in a block comment": ("/* a \\\n b */ x", [], []),
    # Splicing is one pass: a backslash left before a newline by a splice continues nothing (the string
    # ends with its line) and escapes nothing.
    "a backslash left before a newline": ('#define S "ab\\\\\n\n#import <x>', [("define", 1), ("import", 3)],
                                          [("#import", 3)]),
    "a refused name right after a string": ('BEGIN { @s = "a"_Pragma("x"); }', [], [("_Pragma", 1)]),
    "a brace in a line comment ends the struct at the first one": ("struct S { int a; // } #import <a> }\n}",
                                                                   [("import", 1)], [("#import", 1)]),
    "a shebang then more lines": ("#!/x\n#import <a>\nBEGIN { }", [("import", 2)], [("#import", 2)]),
    "two NULs": ("\x00\x00", [], [("a NUL character", 1), ("a NUL character", 1)]),
    "a line comment ends at its line": ("// a\n#import <x>\ny", [("import", 2)], [("#import", 2)]),
    "a paste then a refused name": ("#define C(a) a#%:_Pragma", [("define", 1)],
                                    [("## (token pasting)", 1), ("_Pragma", 1)]),
    "two pastes in digraphs": ("#define C(a) a%:%:%:%:a", [("define", 1)],
                               [("## (token pasting)", 1), ("## (token pasting)", 1)]),
    "a refused name after a slash": ("BEGIN { @x = 4/_Pragma; }", [], [("_Pragma", 1)]),
    "a directive after a percent": ("BEGIN { @x = 4 %#import <x>\n}", [("import", 1)], [("#import", 1)]),
    "a line comment continued after a splice": ("#define A 1 \\\n 2\n// c \\\nx", [("define", 1)],
                                                [("a // comment ending in a backslash", 3)]),
    "DEL after a directive name is ASCII": ("#define\x7f X 1", [("define", 1)], []),
    "a C1 control after a directive name is not": ("#define\x80 X 1", [("define", 1)], [("#define\x80", 1)]),
}


@pytest.mark.parametrize("case", list(DIRECTIVES))
def test_directives_and_refusals_with_their_lines(case: str) -> None:
    program, found, refused = DIRECTIVES[case]
    reading = directives.read(program)
    assert [(d.name, d.line) for d in reading.directives] == found
    assert [(r.spelled, r.line) for r in reading.refused] == refused


def test_each_refusal_says_why() -> None:
    whys = {r.spelled: r.why for r in directives.read(
        '#import <a>\n#include_next <b>\n#pragma x\n#embed "c"\n#line 1\n#$\n#!\n__has_include __has_include_next '
        "__has_include__ __has_include_next__ __has_embed _Pragma __pragma\n#define C(a) a##a\n\x00\n"
        "#include\u00e9 <x>\n// \\\nx").refused}
    exists = "it tells whether a file exists (clang looks as root); it is refused anywhere in a program"
    pragma = "it runs a #pragma (`GCC dependency` opens a file); it is refused anywhere in a program"
    assert whys == {
        "#import": "it reads a file, as #include does", "#include_next": "it reads a file, as #include does",
        "#pragma": "pragmas reach the compiler (`#pragma GCC dependency` opens a file)",
        "#embed": "it reads a file", "#line": "bpftrace programs do not need it",
        "#$": "it is not a directive bpftrace programs may use (a line marker, or a name clang would not read "
              "as the check does)",
        "#!": "a shebang is accepted only as the program's first line",
        "__has_include": exists, "__has_include_next": exists, "__has_include__": exists,
        "__has_include_next__": exists,
        "__has_embed": "it tells whether a file exists and what it holds; it is refused anywhere in a program",
        "_Pragma": pragma, "__pragma": pragma,
        "## (token pasting)": "it could assemble a refused name (_Pragma, __has_include) from harmless halves",
        "a NUL character": "a program cannot hold one (it is passed in argv)",
        "a // comment ending in a backslash": "bpftrace ends the comment at the end of its line, clang continues "
                                              "it onto the next, so they would read that line differently; remove "
                                              "the backslash",
        "#include\u00e9": "a directive name must end in a blank or punctuation",
    }


def test_the_refusal_is_the_first_one_with_the_allow_list_and_a_hint() -> None:
    with pytest.raises(DiagdError) as caught:
        directives.check('BEGIN { exit(); }\n#pragma x\n#import "/etc/shadow"')
    error = caught.value
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert error.message == (
        "#pragma on line 2 is refused: pragmas reach the compiler (`#pragma GCC dependency` opens a file). "
        "bpftrace programs may use only the preprocessor directives #define, #undef, #if, #ifdef, #ifndef, #elif, "
        "#elifdef, #elifndef, #else, #endif, #include (#include only where bpftrace runs under Landlock, or with "
        "[bpftrace] allow_unconfined)")
    assert error.details == {
        "refused": "#pragma", "line": 2,
        "allowed_directives": ["#define", "#undef", "#if", "#ifdef", "#ifndef", "#elif", "#elifdef", "#elifndef",
                               "#else", "#endif", "#include"],
        "hint": "clang preprocesses the program as root: directives outside the list, and __has_include / _Pragma "
                "anywhere, could read or probe any file"}
    reading = directives.check("#define X 1\nBEGIN { exit(); }")
    assert reading.directives == (Directive("define", 1),) and reading.refused == ()


@pytest.mark.parametrize(("program", "includes", "cat"), [
    ("BEGIN { exit(); }", False, False),
    ("#include <x>\nBEGIN { }", True, False),
    ("#define X 1\n#import <x>", False, False),
    ("// #include <x>\nBEGIN { }", False, False),
    ('BEGIN { cat("/x"); }', False, True),
    ('BEGIN { cat ("/x"); }', False, True),
    ('BEGIN { cat\t\n("/x"); }', False, True),
    ('BEGIN { @concat = 1; concat("/x"); cat_x("/y"); }', False, False),
    ('BEGIN { printf("cat(%d)", 1); } /* cat( */', False, False),
    ('#include "x"\nBEGIN { @ = 1; cat("/x"); }', True, True),
])
def test_includes_and_cat(program: str, includes: bool, cat: bool) -> None:
    reading = directives.read(program)
    assert (reading.includes, reading.cat) == (includes, cat)
