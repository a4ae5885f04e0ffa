"""What crash commands mean to the session (policy, context, cache) and parsers of their output.

Policy: one command per call, never the ways out of crash (`!cmd`, pipes, redirections and input
files, gdb commands other than read-only inspection however abbreviated or nested, see `gdb`), never
a new alias (an alias is judged when it is used, by its name alone: `alias zz gdb` then `zz she id`
reached gdb's shell), only the crash `set` variables that change output (`set gdb on` hands every
later line to gdb, `set error <file>` writes a file), never `quit` (closing is close_vmcore_session's
job); `extend` only when configured. With no alias definable and crash's .crashrc files off
(`--no_crashrc`, HOME a directory that does not exist), the only aliases are crash's builtins, which
`expand_alias` spells out before anything is decided. The sandbox (`diagd.actors.sandbox`: seccomp
denies every execve, Landlock the files) is the barrier; this is defence in depth.

Cache keys: output depends on the current context (`set <pid>` changes what `bt`, `task`, `vm`,
`files`, `sig`, `net -s` and `rd -u` show), and on session state (`mod -s` loads symbols, `set radix`,
`hex`, `alias`, `gdb set` change later output). Every cacheable command is keyed by the context
(pid, task, cpu) and a state generation; context and state commands are never cached and refresh
the context after they run, so `set <pid>` then `bt` can never be answered with another task's trace.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from diagd.actors.crash import gdb as gdb_text
from diagd.protocol.errors import DiagdError, ErrorCode

MAX_COMMAND_CHARS = 1500
EXIT_VERBS = frozenset({"q", "quit", "exit"})
# crash 8.0.2's own commands (`help` on the fixture). Any other first word goes to gdb (after crash
# tries kernel symbol and type names), which `gdb.implicit_gdb_refusal` checks.
CRASH_COMMANDS = frozenset({
    "*", "alias", "ascii", "bpf", "bt", "btop", "dev", "dis", "eval", "exit", "extend", "files", "foreach", "fuser",
    "gdb", "help", "ipcs", "irq", "kmem", "list", "log", "mach", "mod", "mount", "net", "p", "ps", "pte", "ptob",
    "ptov", "q", "rd", "repeat", "runq", "sbitmapq", "search", "set", "sig", "struct", "swap", "sym", "sys", "task",
    "timer", "tree", "union", "vm", "vtop", "waitq", "whatis", "wr"})
# crash's builtin aliases (`alias` on the fixture): expanded before anything is decided, so `g she id`
# is judged as `gdb she id` and `sn` as `set scroll on`.
CRASH_ALIASES = {"man": "help", "?": "help", "quit": "q", "sf": "set scroll off", "sn": "set scroll on",
                 "hex": "set radix 16", "dec": "set radix 10", "g": "gdb", "px": "p -x", "pd": "p -d",
                 "for": "foreach", "size": "*", "dmesg": "log", "lsmod": "mod", "last": "ps -l"}
# repeat re-runs a command forever; wr writes memory (of a live system).
REFUSED_VERBS = frozenset({"repeat", "wr"})
# crash `set` variables (`help set` on crash 8.0.2) that only change how output looks. Refused: scroll
# (on pipes every output through less, an external program), console and error (write to a file or
# device), gdb (hands every later line to gdb, prompt "gdb>"), silent (no prompt), core (dumps core),
# debug, edit and namelist.
SET_VARIABLES = frozenset({"radix", "refresh", "print_max", "print_array", "hash", "zero_excluded", "null-stop",
                           "scope", "offline", "redzone"})
STATE_VERBS = frozenset({"alias", "hex", "dec", "extend", "gdb"})
MOD_STATE_FLAGS = frozenset({"-s", "-S", "-d", "-D", "-r", "-R", "-o", "-g"})


class Kind(enum.StrEnum):
    PLAIN = "plain"  # read-only: cached per (command, context, state generation)
    CONTEXT = "context"  # changes the current task/cpu
    STATE = "state"  # changes how later commands answer


def as_crash_reads(command: str) -> str:
    """The command as crash 8.0.2 runs it, so every check judges what runs: surrounding whitespace gone;
    a first word with a leading backslash (quotes around it dropped, as crash's parser drops them) loses
    that one backslash and is not alias-expanded (crash's exec_command: `\\gdb` is `gdb`, `\\g` is `g`,
    no alias); otherwise a builtin alias in first position spelled out (`expand_alias`)."""
    stripped = command.strip()
    parts = stripped.split(None, 1)
    if not parts:
        return stripped
    word = parts[0].strip("\"'")
    if word.startswith("\\") and len(word) > 1:
        return word[1:] + (" " + parts[1] if len(parts) > 1 else "")
    return expand_alias(stripped)


def expand_alias(command: str) -> str:
    """The command with crash's builtin alias in first position spelled out (quotes around the word
    dropped, as crash's parser drops them)."""
    tokens = command.split(None, 1)
    if tokens and tokens[0].strip("\"'") in CRASH_ALIASES:
        return CRASH_ALIASES[tokens[0].strip("\"'")] + (" " + tokens[1] if len(tokens) > 1 else "")
    return command


def is_gdb_passthrough(command: str) -> bool:
    """`gdb ...` (or `g ...`): gated where Landlock is unavailable, see `sandbox.require_confinement`."""
    tokens = as_crash_reads(command).split()
    return bool(tokens) and gdb_text.command_word(tokens[0].strip("\"'")) == "gdb"


def classify(command: str, *, allow_shell: bool = False, allow_extend: bool = False) -> Kind:
    """Refuse what must not run (INVALID_ARGUMENT, with the alternative) and say what the rest does."""
    if not command.strip():
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "empty crash command")
    if len(command) > MAX_COMMAND_CHARS:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"crash command longer than {MAX_COMMAND_CHARS} characters")
    if any(ord(c) < 32 and c != "\t" for c in command):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "one crash command per call: no newlines or control characters")
    command = as_crash_reads(command)
    tokens = command.split()
    verb = tokens[0].strip("\"'")
    if verb.startswith("\\"):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "a command word may start with one backslash only "
                         "(crash takes one off, to skip alias expansion)", hint="type the command itself")
    if verb in EXIT_VERBS:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, f"{verb!r} would end the shared crash session",
                         hint="use close_vmcore_session")
    if not allow_shell:
        _refuse_escapes(command, tokens, allow_extend=allow_extend)
    if verb == "extend" and not allow_extend:
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "loading crash extensions is disabled",
                         hint="set [crash] allow_extend = true (extensions run native code inside crash)")
    args = tokens[1:]
    if verb == "set":
        if not args or args == ["-v"]:
            return Kind.PLAIN
        if args[0] in ("-p", "-c", "-a") or (len(args) == 1 and _is_task_ref(args[0])):
            return Kind.CONTEXT
        if len(args) == 1:
            return Kind.PLAIN  # `set radix` shows a variable
        return Kind.STATE
    if verb in STATE_VERBS or (verb == "mod" and MOD_STATE_FLAGS & set(args)):
        return Kind.STATE
    return Kind.PLAIN


def _refuse(what: str, hint: str = "it can run programs, scripts or write files; use drgn or the stored outputs"
            ) -> DiagdError:
    return DiagdError(ErrorCode.INVALID_ARGUMENT, what, hint=hint)


def _refuse_escapes(command: str, tokens: list[str], *, allow_extend: bool) -> None:
    """Every way out of crash found on crash 8.0.2 (see tests/actors/crash/test_text.py for the list)."""
    if command.startswith("!"):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT, "shell escapes (!cmd) are disabled",
                         hint="set [crash] allow_shell = true to allow them")
    if _unquoted(command, "|><"):
        raise DiagdError(ErrorCode.INVALID_ARGUMENT,
                         "pipes, redirections and input files (|, >, <) go to the shell or read files and are disabled",
                         hint="run the command alone, then filter its stored output with search_command_output "
                              "(regex) or page it with get_command_output; [crash] allow_shell = true allows them")
    verb = tokens[0].strip("\"'")
    if verb in REFUSED_VERBS:
        raise _refuse(f"crash command {verb!r} is disabled in diagd")
    if verb == "gdb":
        reason = gdb_text.gdb_refusal(tokens[1:])
        if reason:
            raise _refuse(reason)
    elif verb == "alias":
        if len(tokens) > 2:  # `alias` lists, `alias name` shows one; `alias name body` defines or deletes
            raise _refuse("defining crash aliases is disabled in diagd: an alias is judged by its name when it "
                          "is used, so its body would escape the command check",
                          hint="type the command itself; `alias` lists the builtin aliases")
    elif verb == "set":
        _refuse_set(tokens[1:])
    elif verb not in CRASH_COMMANDS:
        reason = gdb_text.implicit_gdb_refusal(verb)
        if reason:
            raise _refuse(reason, hint="use p <symbol>, struct <type>, or `gdb <read-only command>`")


def _refuse_set(args: list[str]) -> None:
    """`set` with a context (pid, task, -p, -c, -a), -v, or an output variable; nothing else."""
    if not args or args[0] in ("-v", "-p", "-c", "-a") or (len(args) == 1 and _is_task_ref(args[0])):
        return
    name = args[0].strip("\"'")
    if name in SET_VARIABLES or [name, *args[1:]] == ["scroll", "off"] or args == ["scroll"]:
        return
    raise _refuse(f"crash `set {name}` is disabled in diagd (allowed: set <pid|task>, -p, -c, -a, -v, scroll off, "
                  f"{', '.join(sorted(SET_VARIABLES))})",
                  hint="`set gdb on` would hand every later line to gdb, `set error`/`console` write files; "
                       "outputs are stored and paged by diagd, so scroll stays off")


def _is_task_ref(arg: str) -> bool:
    return arg.isdigit() or bool(re.fullmatch(r"(0x)?[0-9a-fA-F]{8,16}", arg))


def _unquoted(command: str, chars: str) -> bool:
    quote: str | None = None
    for c in command:
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c in chars:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Context


@dataclass(frozen=True)
class Context:
    pid: int
    task: str
    cpu: int
    command: str = ""
    state: str = ""

    @property
    def key(self) -> str:
        return f"{self.pid}/{self.task}/{self.cpu}"

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "task": self.task, "cpu": self.cpu, "command": self.command, "state": self.state}


def parse_context(text: str) -> Context | None:
    """`set` output ->  PID / COMMAND / TASK / CPU / STATE."""
    fields = _colon_fields(text)
    try:
        pid = int(fields["PID"])
        cpu = int(fields.get("CPU", "-1").split()[0])
        task = fields["TASK"].split()[0]
    except (KeyError, ValueError, IndexError):
        return None
    return Context(pid, task, cpu, fields.get("COMMAND", "").strip('"'), fields.get("STATE", ""))


def _colon_fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and key.strip().upper() == key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


# ---------------------------------------------------------------------------------------------
# Parsers for the triage report


def parse_sys(text: str) -> dict[str, str]:
    """`sys` -> {"kernel": ..., "panic": "Kernel panic - not syncing: ...", "tasks": "2", ...}."""
    return {k.lower().replace(" ", "_"): v.strip('"') for k, v in _colon_fields(text).items()}


_PS_ROW = re.compile(r"^(?P<active>>?)\s*(?P<pid>\d+)\s+(?P<ppid>\d+)\s+(?P<cpu>\d+)\s+(?P<task>[0-9a-f]+)\s+"
                     r"(?P<st>[A-Z]{2})\s+(?P<mem>[\d.]+)\s+(?P<vsz>\d+)\s+(?P<rss>\d+)\s+(?P<comm>.*)$")


def parse_ps(text: str) -> list[dict[str, Any]]:
    rows = []
    for line in text.splitlines():
        m = _PS_ROW.match(line)
        if m:
            rows.append({"pid": int(m["pid"]), "ppid": int(m["ppid"]), "cpu": int(m["cpu"]), "task": m["task"],
                         "state": m["st"], "mem_pct": float(m["mem"]), "vsz_kb": int(m["vsz"]),
                         "rss_kb": int(m["rss"]), "comm": m["comm"].strip(), "active": m["active"] == ">"})
    return rows


def summarize_ps(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_state: dict[str, int] = {}
    for r in rows:
        by_state[r["state"]] = by_state.get(r["state"], 0) + 1
    return {
        "total": len(rows),
        "by_state": by_state,
        "active": [{k: r[k] for k in ("pid", "cpu", "comm", "state")} for r in rows if r["active"]],
        "uninterruptible": [{k: r[k] for k in ("pid", "cpu", "comm")} for r in rows if r["state"] == "UN"],
        "top_rss": [{k: r[k] for k in ("pid", "comm", "rss_kb")}
                    for r in sorted(rows, key=lambda r: -int(r["rss_kb"]))[:5] if r["rss_kb"]],
    }


_KMEM_ROW = re.compile(r"^\s*(?P<name>[A-Z][A-Z ]*[A-Z])\s+(?P<pages>\d+)\s+(?P<total>\S+(?: [KMGT]?B)?)\s+"
                       r"(?P<pct>----|\d+% of TOTAL \w+)\s*$")


def parse_kmem_i(text: str) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        m = _KMEM_ROW.match(line)
        if m:
            pct = m["pct"]
            rows[m["name"].lower().replace(" ", "_")] = {
                "pages": int(m["pages"]), "size": m["total"],
                "percent": int(pct.split("%")[0]) if "%" in pct else None}
    return rows


_BT_HEAD = re.compile(r"PID:\s*(?P<pid>\d+)\s+TASK:\s*(?P<task>[0-9a-f]+)\s+CPU:\s*(?P<cpu>\d+)\s+"
                      r"COMMAND:\s*\"(?P<comm>[^\"]*)\"")
_BT_FRAME = re.compile(r"^\s*#(?P<n>\d+)\s+\[(?P<sp>[0-9a-f]+)\]\s+(?P<fn>\S+)\s+at\s+(?P<pc>[0-9a-f]+)")


def parse_bt(text: str) -> dict[str, Any]:
    head = _BT_HEAD.search(text)
    frames = [{"level": int(m["n"]), "function": m["fn"], "sp": m["sp"], "pc": m["pc"]}
              for m in (_BT_FRAME.match(line) for line in text.splitlines()) if m]
    result: dict[str, Any] = {"frames": frames, "functions": [f["function"] for f in frames]}
    if head:
        result.update(pid=int(head["pid"]), task=head["task"], cpu=int(head["cpu"]), comm=head["comm"])
    return result


PID_HASH_WARNING = "not found in PID hash"


def startup_limits(startup_output: str, crash_version: str | None, tasks_drgn: int, tasks_crash: int | None
                   ) -> list[str]:
    """Plain-language limits of this session, from what crash printed while loading."""
    limits = []
    if PID_HASH_WARNING in startup_output:
        seen = f"{tasks_crash}" if tasks_crash is not None else "only the on-CPU"
        drgn = f" drgn sees all {tasks_drgn}." if tasks_drgn >= 0 else ""
        limits.append(
            f"{crash_version or 'this crash'} cannot read this kernel's PID hash (it printed 'WARNING: active task "
            f"... not found in PID hash'): ps, foreach and sys TASKS list {seen} task(s), only those running on a "
            f"CPU.{drgn} bt, log, kmem, dis, struct, p, sym and mod still work. For the full task list use "
            "run_drgn_command (for_each_task(prog)), or crash >= 8.0.4 (Linux 6.1.y backported the "
            "pid.numbers[] change that crash 8.0.2 predates).")
    return limits
