"""The C preprocessor in a bpftrace program (issue 39): every directive outside the allow-list is refused
in every spelling clang reads (blanks, comments, continuations, `%:`, mid-line after a struct, inside a
probe), with Landlock and without, and so are `__has_include`, `_Pragma` and `##` anywhere; `#include` in
any spelling stays under the Landlock rule. The corpus is checked against the real bpftrace: each entry
does reach the file unconfined (or is one bpftrace 0.17 rejects by itself, refused all the same)."""

from __future__ import annotations

import glob
import subprocess
from pathlib import Path

import pytest

from diagd.actors import sandbox
from diagd.actors.bpftrace import directives
from diagd.actors.bpftrace.settings import BpftraceSettings, check_program, file_helpers
from diagd.protocol.errors import DiagdError, ErrorCode
from tests.support.bpftrace_harness import BPFTRACE, needs_bpftrace

END = "\nBEGIN { exit(); }"
READS, PROBES, REJECTED = "reads", "probes", "bpftrace 0.17 rejects it itself"

# (what the check names, the line it names, what real bpftrace 0.17 does with it unconfined, the program;
# {path} is the file it reaches).
ESCAPES = {
    "import": ("#import", 1, READS, '#import "{path}"' + END),
    "include_next": ("#include_next", 1, READS, '#include_next "{path}"' + END),
    "blanks": ("#import", 1, READS, '#  \timport "{path}"' + END),
    "unicode blank": ("#import", 1, READS, '#\u00a0import "{path}"' + END),
    "comment": ("#import", 1, READS, '#/**/import "{path}"' + END),
    "comment across lines": ("#import", 2, READS, 'struct S { int a;\n#/*\n*/import "{path}"\n}' + END),
    "continuation": ("#import", 1, REJECTED, '#\\\nimport "{path}"' + END),
    "continuation in a struct": ("#import", 2, READS, 'struct S { int a;\n#\\\nimport "{path}"\n}' + END),
    "digraph": ("#import", 1, REJECTED, '%:import "{path}"' + END),
    "digraph in a struct": ("#import", 2, READS, 'struct S { int a;\n%:import "{path}"\n}' + END),
    "in BEGIN on its own line": ("#import", 2, REJECTED, 'BEGIN {\n#import "{path}"\nexit(); }'),
    "in BEGIN mid-line": ("#import", 1, REJECTED, 'BEGIN { exit(); #import "{path}"\n}'),
    "after a struct on its line": ("#import", 1, READS, 'struct S { int a; } #import "{path}"' + END),
    # bpftrace ends a struct at its closing brace even inside a comment or a literal, and lexes the rest
    # of the line anew: clang gets the `#` as a line of its own.
    "after a brace in a // comment in a struct": ("#import", 1, READS,
                                                  'struct S { int a; // } #import "{path}"' + END),
    "after a brace in a string in a struct": ("#import", 1, READS, 'struct S { int a; " } #import "{path}"' + END),
    "after a brace in a character literal in a struct": ("#import", 1, READS,
                                                         "struct S { int a; ' } #import \"{path}\"" + END),
    "on a directive's continuation line": ("#import", 2, READS,
                                           '#define A 1 \\\nstruct S { int a; } #import "{path}"' + END),
    "after a // comment ending in a backslash": ("a // comment ending in a backslash", 1, READS,
                                                 '// see \\\n#import "{path}"' + END),
    "after a carriage return": ("#import", 2, READS, '#define A 1\r#import "{path}"' + END),
    # A backslash then a Unicode blank continues no line (clang splices after ASCII blanks only), so the
    # string ends with its line and the next one is a directive.
    "after a backslash and a Unicode blank": ("#import", 2, READS,
                                              '#define S "abc\\\u00a0\n#import "{path}"' + END),
    "__has_include": ("__has_include", 1, PROBES,
                      '#if __has_include("{path}")\n#define X 1\n#else\n#define X 2\n#endif\n'
                      'BEGIN { printf("%d\\n", X); exit(); }'),
    "__has_include_next": ("__has_include_next", 1, PROBES,
                           '#if __has_include_next("{path}")\n#define X 1\n#else\n#define X 2\n#endif\n'
                           'BEGIN { printf("%d\\n", X); exit(); }'),
    "__has_include in a #define": ("__has_include", 1, REJECTED,
                                   '#define X __has_include("{path}")\nBEGIN { printf("%d\\n", X); exit(); }'),
    "#pragma": ("#pragma", 1, PROBES, '#pragma GCC dependency "{path}"' + END),
    "_Pragma": ("_Pragma", 1, PROBES, 'struct S { int a; _Pragma("GCC dependency \\"{path}\\"") }' + END),
    "_Pragma by token pasting": ("## (token pasting)", 1, PROBES,
                                 '#define CAT(a, b) a##b\nstruct S { int a; CAT(_Pra, gma)("GCC dependency '
                                 '\\"{path}\\"") }' + END),
    "#embed": ("#embed", 1, REJECTED, '#embed "{path}"' + END),
    "a line marker": ("#1", 1, REJECTED, '# 1 "{path}"' + END),
    "a shebang past the first line": ("#!", 2, REJECTED, 'BEGIN { exit(); }\n#!{path}'),
}

# Each allowed spelling of #include: refused without Landlock (unless allow_unconfined), like `#include`.
INCLUDES = {
    "plain": "#include <linux/types.h>" + END,
    "blanks": "#   include <linux/types.h>" + END,
    "comment": "#/**/include <linux/types.h>" + END,
    "continuation": "#\\\ninclude <linux/types.h>" + END,
    "digraph": "%:include <linux/types.h>" + END,
    "after a struct": "struct S { int a; } #include <linux/types.h>" + END,
    "computed": '#define H <linux/types.h>\n#include H' + END,
}

ALLOWED = [
    "BEGIN { exit(); }",
    "#!/usr/bin/env bpftrace\n#include <linux/sched.h>\n#ifndef BPFTRACE_HAVE_BTF\n#define X 1\n#elif 0\n#else\n"
    "#endif\n#undef X\n#define S(x) #x\nBEGIN { exit(); }",
    '#if defined(X) && X > 1 /* #import "/etc/shadow" */\n#endif\n// #import "/etc/shadow" __has_include\n'
    'BEGIN { printf("#import %s %d\\n", "__has_include(\\"/etc/shadow\\")", 7 % 3); exit(); }',
    "#\nBEGIN { @_Pragma_not = 1; @x = 10 % 3; exit(); }",  # the null directive; names that only contain one
    'BEGIN { printf("{ cpu #%d }\\n", cpu); printf("} #%d\\n", 1); exit(); } // } #%d',
    '#include "/dev/null" /* header names hold no comment: <a/*b> */\nBEGIN { exit(); }',
]


def settings_for(kind: str) -> BpftraceSettings:
    return {"default": BpftraceSettings(), "unconfined allowed": BpftraceSettings(allow_unconfined=True),
            "privileged helper": BpftraceSettings(privileged_helper="sudo -n", allow_unconfined=True)}[kind]


@pytest.fixture(params=["landlock", "no landlock"])
def landlock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "landlock":
        if sandbox.landlock_abi() < 1:
            pytest.skip("the kernel has no Landlock")
        monkeypatch.delenv(sandbox.FORCE_ENV, raising=False)
    else:
        monkeypatch.setenv(sandbox.FORCE_ENV, "off")
    return str(request.param)


@pytest.mark.parametrize("case", list(ESCAPES))
@pytest.mark.parametrize("kind", ["default", "unconfined allowed", "privileged helper"])
def test_every_spelling_of_a_refused_directive_or_operator_is_refused_everywhere(
        case: str, kind: str, landlock: str) -> None:
    refused, line, _real, program = ESCAPES[case]
    with pytest.raises(DiagdError) as caught:
        check_program(settings_for(kind), program.replace("{path}", "/etc/shadow"))
    error = caught.value
    assert error.code == ErrorCode.INVALID_ARGUMENT, error
    assert error.details["refused"] == refused and error.details["line"] == line, error.message
    assert error.details["allowed_directives"] == [f"#{d}" for d in directives.ALLOWED]
    assert f"{refused} on line {line} is refused" in error.message and directives.ALLOWED_TEXT in error.message


def test_the_refusal_names_the_directive_and_the_allow_list() -> None:
    with pytest.raises(DiagdError) as caught:
        directives.check('BEGIN { exit(); }\nkprobe:f {\n  %:  import "/etc/shadow"\n}')
    assert caught.value.message.startswith("#import on line 3 is refused: it reads a file, as #include does. "
                                           "bpftrace programs may use only the preprocessor directives #define, "
                                           "#undef, #if, #ifdef, #ifndef, #elif, #elifdef, #elifndef, #else, "
                                           "#endif, #include (#include only where bpftrace runs under Landlock")


@pytest.mark.parametrize("program", ALLOWED)
def test_programs_within_the_allow_list_pass(program: str, landlock: str) -> None:
    assert not directives.read(program).refused
    check_program(BpftraceSettings(allow_unconfined=True), program)


def test_the_tools_bpftrace_ships_pass() -> None:
    shipped = sorted({*glob.glob("/usr/sbin/*.bt"), *glob.glob("/usr/share/bpftrace/tools/*.bt")})
    if not shipped:
        pytest.skip("no bpftrace tools installed")
    for tool in shipped:
        assert not directives.read(Path(tool).read_text()).refused, tool


@pytest.mark.parametrize("case", list(INCLUDES))
def test_every_spelling_of_include_is_under_the_landlock_rule(case: str, landlock: str) -> None:
    program = INCLUDES[case]
    assert file_helpers(program) == ["#include"]
    check_program(BpftraceSettings(allow_unconfined=True), program)
    if landlock == "landlock":
        check_program(BpftraceSettings(), program)  # confined: the Landlock rule decides what it reads
        return
    with pytest.raises(DiagdError) as caught:
        check_program(BpftraceSettings(), program)
    assert caught.value.code == ErrorCode.PERMISSION_DENIED and "#include" in caught.value.message


def test_cat_is_found_across_comments_lines_and_continuations() -> None:
    for program in ('BEGIN { cat/* x */("/etc/shadow"); }', 'BEGIN { cat\n("/etc/shadow"); }',
                    'BEGIN { ca\\\nt("/etc/shadow"); }'):
        assert file_helpers(program) == ["cat()"], program
    assert file_helpers('BEGIN { printf("cat(%d)", 1); @concat = count(); } // cat("/x")') == []
    # A comment opened where the check reads a `#` after a brace in a comment does not hide what follows.
    assert file_helpers('// } # /*\nBEGIN { cat("/etc/shadow"); } // */') == ["cat()"]


def test_a_nul_is_refused() -> None:
    with pytest.raises(DiagdError) as caught:
        directives.check('#define A 1\nBEGIN { exit(); }\x00#import "/etc/shadow"')
    assert caught.value.details["refused"] == "a NUL character" and caught.value.details["line"] == 2


@needs_bpftrace
@pytest.mark.parametrize("case", [c for c, (_, _, real, _) in ESCAPES.items() if real != REJECTED])
def test_the_corpus_is_real_each_entry_reaches_the_file_through_bpftrace(case: str, tmp_path: Path) -> None:
    """Unconfined (no sandbox, as root), on a canary file of the test's own: each escape the check refuses
    does read it (clang's errors quote it or point into it) or tell whether it exists."""
    _refused, _line, real, program = ESCAPES[case]
    canary = tmp_path / "canary"
    canary.write_text("DIAGD_CANARY_7f3a rest\n")

    def run(path: Path) -> str:
        assert BPFTRACE is not None
        done = subprocess.run([BPFTRACE, "-e", program.replace("{path}", str(path))], capture_output=True,
                              text=True, errors="replace", timeout=60, check=False)
        return done.stdout + "\n".join(line for line in done.stderr.splitlines() if "RLIMIT" not in line)

    seen = run(canary)
    if real == READS:  # its first token in an error, or at least an error located inside it
        assert "DIAGD_CANARY_7f3a" in seen or f"{canary}:1:" in seen, seen
    else:
        assert seen != run(tmp_path / "missing"), seen
