"""crash's gdb: which gdb commands diagd passes on, as an allow-list of read-only inspection.

gdb runs any unambiguous prefix of a command (`she` is `shell`), has aliases, and runs commands
from inside other commands (`eval`, `with ... --`, `thread apply`, `tfaas`, `interpreter-exec`,
`alias`, `source`): a list of refused words cannot be complete. So:
- `gdb <cmd>` (and crash's builtin alias `g`) passes only the commands in GDB_READ_ONLY, spelled in
  full or as their gdb aliases (`p`, `i`, `l`, `h`); `set` only with the subcommands in
  GDB_SET_READ_ONLY (`set logging` redirects output to any file and breaks gdb for the session).
- crash passes a word it does not know to gdb (after trying kernel symbol names), so such a word is
  refused when gdb would read it as one of its other commands, i.e. when it is a prefix of any name
  in GDB_COMMANDS that is not read-only. Kernel symbols and session aliases still work.
The Landlock sandbox around crash is the real barrier; this is defence in depth.
"""

from __future__ import annotations

import re

# Every top-level command name and alias of the gdb 10.2 inside crash 8.0.2 (`gdb help all` on the
# fixture, first words of each entry): gdb can only resolve a word to one of these.
_GDB_NAMES = """
    ! + - < > actions add-auto-load-safe-path add-auto-load-scripts-directory add-inferior add-symbol-file
    add-symbol-file-from-memory advance agent-printf alias append apropos attach awatch b backtrace br bre brea
    break break-range bt c call catch cd checkpoint cl clear clone-inferior collect commands compare-sections
    compile complete condition continue core-file d define define-prefix del delete demangle detach directory
    dis disa disable disassemble disconnect display do document dont-repeat dow down down-silently dprintf dump
    echo edit en enable end eval exec-file expression f faas fg file fin find finish flash-erase flushregs fo
    focus forward-search frame fs ftrace function gcore generate-core-file gr gu guile guile-repl h handle
    hbreak help i if ignore inf inferior info init-if-undefined inspect interpreter-exec interrupt j
    jit-reader-load jit-reader-unload jump kill l layout list load macro maintenance make mem monitor mt n
    new-ui next nexti ni nosharedlibrary output ov overlay ovly p passcount path pi pipe po print print-object
    printf printm ptype pwd py python python-interactive q queue-signal quit r rbreak rc rec record refresh
    remote remove-inferiors remove-symbol-file restart restore return rev reverse-continue reverse-finish
    reverse-next reverse-nexti reverse-search reverse-step reverse-stepi rn rni rs rsi run rwatch s save
    save-tracepoints search section select-frame set sharedlibrary shell show si signal skip source start starti
    step stepi stepping stop strace symbol-file t taas target task tbreak tcatch tdump teval tfaas tfind thbreak
    thread tp tr tra trac trace tsave tstart tstatus tstop tty tui tvariable u undisplay unset until up
    up-silently update w watch wh whatis where while while-stepping winheight with ws x |
"""
GDB_COMMANDS = frozenset(_GDB_NAMES.split())

GDB_READ_ONLY = frozenset({"print", "p", "inspect", "output", "printf", "echo", "ptype", "whatis", "info", "i",
                           "list", "l", "x", "disassemble", "show", "help", "h"})
GDB_SET_READ_ONLY = frozenset({"var", "variable", "print", "p", "radix", "output-radix", "input-radix", "width",
                               "height", "pagination", "language", "confirm"})
_WORD = re.compile(r"[A-Za-z0-9_-]+")


def command_word(token: str) -> str:
    """The word gdb reads as a command name: quotes dropped, cut where name characters end
    (`she\\ll` is `she`); a leading punctuation character is a command of its own (`!`, `|`)."""
    token = token.lstrip("\"'")
    m = _WORD.match(token)
    return m.group(0) if m else token[:1]


def gdb_refusal(words: list[str]) -> str | None:
    """Why `gdb <words>` is refused, or None when it is read-only inspection."""
    if not words:
        return None
    verb = command_word(words[0])
    if verb == "set":
        sub = command_word(words[1]) if len(words) > 1 else ""
        if sub in GDB_SET_READ_ONLY or sub.startswith("$"):
            return None
        return (f"gdb `set {sub}` is refused (only set {', '.join(sorted(GDB_SET_READ_ONLY))}): `set logging` "
                "writes files anywhere and breaks gdb for the session")
    if verb in GDB_READ_ONLY:
        return None
    return (f"gdb command {verb!r} is refused: diagd passes only read-only gdb commands "
            f"({', '.join(sorted(GDB_READ_ONLY))}, set var); gdb runs any prefix of a command, so no other "
            "command or abbreviation is passed")


def implicit_gdb_refusal(word: str) -> str | None:
    """crash hands a word it does not know to gdb: refuse it if gdb would run a command that is not
    read-only (the word names one, or is a prefix of one)."""
    verb = command_word(word)
    if verb in GDB_READ_ONLY or verb == "set":
        return None
    meant = sorted(c for c in GDB_COMMANDS if c.startswith(verb) and c not in GDB_READ_ONLY)
    if not meant:
        return None
    return (f"{verb!r} is not a crash command: crash would pass it to gdb, which reads it as "
            f"{', '.join(meant[:5])}{'...' if len(meant) > 5 else ''}; refused")
