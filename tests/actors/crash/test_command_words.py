"""The command check reads a command's words as crash 8.0.2 does: only quotes come off a word, case counts.

What crash did with each word is its real answer on the vmcore fixture (tests/support/crash_outputs.py,
recorded once): `Xq`, `qX`, `Xwr`, `Xgdb`, `Xg`, `X\\q` are "command not found" (neither crash nor gdb
lowers a word or drops letters from it), `set "radix" 16` sets the radix and `"q"` quits. So a word that
only resembles a refused command is no refused command, and a quoted word is the word.
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from diagd.actors.crash import text as text
from diagd.protocol.errors import DiagdError
from tests.fixtures.vmcore import build
from tests.support import crash_outputs

# name in crash_outputs.COMMANDS: the word crash did not know
UNKNOWN_WORDS = {"x_q": "Xq", "q_x": "qX", "x_wr": "Xwr", "x_gdb": "Xgdb", "x_g": "Xg", "x_backslash_q": "X\\q"}


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    if shutil.which("crash") is None:
        pytest.skip("crash is not installed")
    return crash_outputs.outputs(build())


def refused(command: str) -> bool:
    try:
        text.classify(command)
    except DiagdError as err:
        assert err.code == "INVALID_ARGUMENT"
        return True
    return False


@pytest.mark.parametrize("name", sorted(UNKNOWN_WORDS))
def test_a_word_crash_does_not_know_is_not_the_command_it_resembles(recorded: dict[str, Any], name: str) -> None:
    word = UNKNOWN_WORDS[name]
    command = crash_outputs.COMMANDS[name]
    assert recorded["outputs"][name] == f"crash: command not found: {word}\n"
    assert text.as_crash_reads(command) == command  # no alias spelled out, no backslash taken off
    assert text.expand_alias(command) == command
    assert not text.is_gdb_passthrough(command)
    assert text.classify(command) == text.Kind.PLAIN


def test_quotes_around_a_word_are_dropped_as_crash_drops_them(recorded: dict[str, Any]) -> None:
    outputs = recorded["outputs"]
    # `set "radix" 16` is `set radix 16`: an output variable, allowed, a state change
    assert outputs["set_quoted_radix"] == "output radix: 16 (hex)\n"
    assert text.classify(crash_outputs.COMMANDS["set_quoted_radix"]) == text.Kind.STATE
    assert text.classify("set 'radix' 10") == text.Kind.STATE
    # `"q"` is `q`: crash quit there, the command after it never ran
    assert outputs["quoted_quit"] == "" and outputs["after_quoted_quit"] is None
    assert refused(crash_outputs.COMMANDS["quoted_quit"]) and refused("'exit'")


def test_set_variables_are_lower_case_words_and_one_word_is_no_exception() -> None:
    """`set` allows a context, -v, or the listed output variables; nothing else, with or without a value."""
    assert refused("set Xradix 16") and refused("set radixX 16")
    for word in ("gdb", "silent", "console", "error", "debug"):
        assert refused(f"set {word}"), word
    assert text.classify("set radix") == text.Kind.PLAIN


def test_a_task_address_in_upper_case_hex_is_a_context() -> None:
    assert text.classify("set FFFF8D8303DEB000") == text.Kind.CONTEXT
    assert text.classify("set 0xFFFF8D8303DEB000") == text.Kind.CONTEXT


def test_a_capital_x_neither_opens_a_quote_nor_is_a_pipe() -> None:
    assert text.classify("p X86_FEATURE_FPU") == text.Kind.PLAIN
    assert refused("p X86_FEATURE_FPU | sh") and refused("sym X > /tmp/out") and refused("log X < /tmp/in")
