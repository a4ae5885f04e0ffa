"""What the crash command check says, word for word, and what a passed command means to the session.

test_escapes.py proves every known way out is refused and the read-only commands pass; this module
holds the rest of the contract a caller (an agent) sees: the code, message and hint of each kind of
refusal (an agent acts on the hint), the kind of each command that passes (it decides caching and
context refresh), and gdb's word reading. Written from crash's and gdb's behaviour, not read from the
check's own tables.
"""

from __future__ import annotations

import pytest

from diagd.actors.crash import gdb, text
from diagd.protocol.errors import DiagdError, ErrorCode

READ_ONLY_GDB = ("disassemble, echo, h, help, i, info, inspect, l, list, output, p, print, printf, ptype, show, "
                 "whatis, x")
SET_READ_ONLY = ("confirm, height, input-radix, language, output-radix, p, pagination, print, radix, var, variable, "
                 "width")
ESCAPE_HINT = "it can run programs, scripts or write files; use drgn or the stored outputs"


def refusal(command: str, **settings: bool) -> tuple[str, str, str | None]:
    with pytest.raises(DiagdError) as refused:
        text.classify(command, **settings)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    return refused.value.code, refused.value.message, refused.value.details.get("hint")


@pytest.mark.parametrize("command,message,hint", [
    ("", "empty crash command", None),
    ("   ", "empty crash command", None),
    ("x" * 1501, "crash command longer than 1500 characters", None),
    ("p 1\rgdb she id", "one crash command per call: no newlines or control characters", None),
    ("p 1\ngdb she id", "one crash command per call: no newlines or control characters", None),
    ("p 1\x00", "one crash command per call: no newlines or control characters", None),
    ("\\\\gdb p 1", "a command word may start with one backslash only (crash takes one off, to skip alias "
                    "expansion)", "type the command itself"),
    ("q", "'q' would end the shared crash session", "use close_vmcore_session"),
    ("\\exit", "'exit' would end the shared crash session", "use close_vmcore_session"),
    ("quit", "'q' would end the shared crash session", "use close_vmcore_session"),  # alias spelled out
    ("!id", "shell escapes (!cmd) are disabled", "set [crash] allow_shell = true to allow them"),
    ("log > /tmp/x", "pipes, redirections and input files (|, >, <) go to the shell or read files and are "
                     "disabled", "run the command alone, then filter its stored output with search_command_output "
                                 "(regex) or page it with get_command_output; [crash] allow_shell = true allows "
                                 "them"),
    ("repeat bt", "crash command 'repeat' is disabled in diagd", ESCAPE_HINT),
    ("wr jiffies 0", "crash command 'wr' is disabled in diagd", ESCAPE_HINT),
    ("gdb shell id", "gdb command 'shell' is refused: diagd passes only read-only gdb commands "
                     f"({READ_ONLY_GDB}, set var); gdb runs any prefix of a command, so no other command or "
                     "abbreviation is passed", ESCAPE_HINT),
    ("gdb set logging on", f"gdb `set logging` is refused (only set {SET_READ_ONLY}): `set logging` writes files "
                           "anywhere and breaks gdb for the session", ESCAPE_HINT),
    ("alias zz gdb", "defining crash aliases is disabled in diagd: an alias is judged by its name when it is "
                     "used, so its body would escape the command check",
     "type the command itself; `alias` lists the builtin aliases"),
    ("set gdb on", "crash `set gdb` is disabled in diagd (allowed: set <pid|task>, -p, -c, -a, -v, scroll off, "
                   "hash, null-stop, offline, print_array, print_max, radix, redzone, refresh, scope, zero_excluded)",
     "`set gdb on` would hand every later line to gdb, `set error`/`console` write files; outputs are stored and "
     "paged by diagd, so scroll stays off"),
    ("she id", "'she' is not a crash command: crash would pass it to gdb, which reads it as shell; refused",
     "use p <symbol>, struct <type>, or `gdb <read-only command>`"),
    ("ma", "'ma' is not a crash command: crash would pass it to gdb, which reads it as macro, maintenance, "
           "make; refused", "use p <symbol>, struct <type>, or `gdb <read-only command>`"),
])
def test_each_refusal_says_what_and_what_to_do(command: str, message: str, hint: str | None) -> None:
    assert refusal(command) == (ErrorCode.INVALID_ARGUMENT, message, hint)


def test_extend_is_its_own_setting_even_when_the_shell_is_allowed() -> None:
    expected = (ErrorCode.INVALID_ARGUMENT, "loading crash extensions is disabled",
                "set [crash] allow_extend = true (extensions run native code inside crash)")
    assert refusal("extend /tmp/x.so") == expected
    assert refusal("\\extend /tmp/x.so", allow_shell=True) == expected
    assert text.classify("extend /tmp/x.so", allow_extend=True) == text.Kind.STATE


def test_allow_shell_lets_escapes_through_but_never_quit() -> None:
    for command in ("!id", "log > /tmp/x", "gdb shell id", "alias zz gdb", "set gdb on", "repeat bt"):
        text.classify(command, allow_shell=True)
    assert refusal("q", allow_shell=True)[1] == "'q' would end the shared crash session"


@pytest.mark.parametrize("command,kind", [
    ("set", text.Kind.PLAIN), ("set -v", text.Kind.PLAIN), ("set radix", text.Kind.PLAIN),
    ("set -p", text.Kind.CONTEXT), ("set -c 1", text.Kind.CONTEXT), ("set -a 0", text.Kind.CONTEXT),
    ("set 1", text.Kind.CONTEXT), ("set ffff8880031b8000", text.Kind.CONTEXT),
    ("set 0xffff8880031b8000", text.Kind.CONTEXT), ("set radix 16", text.Kind.STATE),
    ("set scroll off", text.Kind.STATE), ("hex", text.Kind.STATE), ("dec", text.Kind.STATE),
    ("alias", text.Kind.STATE), ("alias g", text.Kind.STATE), ("gdb p 1", text.Kind.STATE),
    ("\\gdb p 1", text.Kind.STATE), ("mod -s qemu_fw_cfg", text.Kind.STATE), ("mod -S", text.Kind.STATE),
    ("mod", text.Kind.PLAIN), ("bt", text.Kind.PLAIN), ("\\bt -a", text.Kind.PLAIN), ("  sys  ", text.Kind.PLAIN),
    ("log -T", text.Kind.PLAIN), ("info registers", text.Kind.PLAIN), ("ptype struct task_struct", text.Kind.PLAIN),
    ("whatis jiffies", text.Kind.PLAIN), ("task_struct", text.Kind.PLAIN), ("jiffies", text.Kind.PLAIN),
    ("x/4x &jiffies", text.Kind.PLAIN), ("output 1", text.Kind.PLAIN),
])
def test_what_a_passed_command_means_to_the_session(command: str, kind: text.Kind) -> None:
    assert text.classify(command) == kind


def test_the_limits_are_where_they_say() -> None:
    assert text.classify("p " + "1" * 1498) == text.Kind.PLAIN  # 1500 characters: the longest that passes
    assert text.classify("bt\t-a") == text.Kind.PLAIN  # a tab separates words, it is not a control character
    assert gdb.gdb_refusal(["set", "var"]) is None  # `set var` is read from its second word


def test_crash_reads_a_backslash_once_and_skips_the_alias_for_it() -> None:
    assert text.as_crash_reads("  \\gdb p 1 ") == "gdb p 1"
    assert text.as_crash_reads('"\\gdb" p 1') == "gdb p 1" and text.as_crash_reads("'\\bt'") == "bt"
    assert text.as_crash_reads("\\g p 1") == "g p 1" and text.as_crash_reads("g p 1") == "gdb p 1"
    assert text.as_crash_reads("\\") == "\\" and text.as_crash_reads("sn") == "set scroll on"
    assert text.as_crash_reads('"sn"') == "set scroll on" and text.as_crash_reads("sn x") == "set scroll on x"
    assert text.expand_alias("px jiffies") == "p -x jiffies" and text.expand_alias("lsmod") == "mod"
    assert text.expand_alias("bt") == "bt" and text.expand_alias("") == ""
    assert text.is_gdb_passthrough("\\gdb p 1") and text.is_gdb_passthrough("g p 1")
    assert text.is_gdb_passthrough('"gdb" p 1') and not text.is_gdb_passthrough("\\g p 1")
    assert not text.is_gdb_passthrough("") and not text.is_gdb_passthrough("gdbx p 1")


def test_gdb_reads_a_command_word_as_gdb_does() -> None:
    assert gdb.command_word("she\\ll") == "she" and gdb.command_word("'shell'") == "shell"
    assert gdb.command_word('"p"') == "p" and gdb.command_word("x/4x") == "x" and gdb.command_word("!id") == "!"
    assert gdb.command_word("|") == "|" and gdb.command_word("$x") == "$"
    assert gdb.gdb_refusal([]) is None and gdb.gdb_refusal(["'p'", "1"]) is None
    assert gdb.gdb_refusal(["set", "$x", "=", "1"]) is None and gdb.gdb_refusal(["set", "var", "$x=1"]) is None
    assert gdb.gdb_refusal(["set"]) == (f"gdb `set ` is refused (only set {SET_READ_ONLY}): `set logging` writes "
                                        "files anywhere and breaks gdb for the session")
    assert gdb.implicit_gdb_refusal("info") is None and gdb.implicit_gdb_refusal("set") is None
    assert gdb.implicit_gdb_refusal("zzz_not_gdb") is None  # a symbol name: crash looks it up, gdb reads nothing
    many = gdb.implicit_gdb_refusal("s") or ""  # gdb has more than five commands in s: five named, then ...
    assert many.startswith("'s' is not a crash command: crash would pass it to gdb, which reads it as ")
    assert many.endswith("...; refused") and many.split("reads it as ")[1].count(", ") == 4
    assert gdb.implicit_gdb_refusal("pipe") == ("'pipe' is not a crash command: crash would pass it to gdb, which "
                                                "reads it as pipe; refused")
