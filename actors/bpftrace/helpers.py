"""The builtins and functions `list_helpers` reports: a hand-checked table for bpftrace 0.17, merged with the
installed man page (roff parsed here), and the program whose dry run tells which names the installed binary
lacks. Pure data and text parsing; running bpftrace stays with the back end.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from diagd.actors.bpftrace.replies import HelperInfo, HelperKind


@dataclass(frozen=True)
class Helper:
    name: str
    kind: HelperKind
    description: str
    signatures: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()  # unsafe, async, compile_time
    type: str | None = None  # builtins: the value type

    def to_json(self) -> HelperInfo:
        out: HelperInfo = {"name": self.name, "kind": self.kind, "description": self.description}
        if self.signatures:
            out["signatures"] = list(self.signatures)
        if self.flags:
            out["flags"] = list(self.flags)
        if self.type:
            out["type"] = self.type
        return out


def _b(name: str, type_: str, description: str) -> Helper:
    return Helper(name, "builtin", description, type=type_)


def _f(name: str, sig: str | tuple[str, ...], description: str, *flags: str, kind: HelperKind = "function") -> Helper:
    return Helper(name, kind, description, (sig,) if isinstance(sig, str) else sig, flags)


def _m(name: str, sig: str, description: str, *flags: str) -> Helper:
    return _f(name, sig, description, *flags, kind="map_function")


# bpftrace 0.17, from its man page and verified against the 0.17.0 binary (debugf, args, ctx and
# username work but are missing from the man page). At run time every name is checked again
# against the installed binary, and names only the installed man page knows are added.
HELPERS_0_17: tuple[Helper, ...] = (
    _b("$1, $2, ...$n", "int64", "Positional parameters (0 when absent; str($1) for strings)."),
    _b("$#", "int64", "Number of positional parameters."),
    _b("arg0, arg1, ...argn", "int64", "Arguments of the traced function, from registers (kprobe, uprobe, usdt)."),
    _b("sarg0, sarg1, ...sargn", "int64", "Arguments read from the stack (kprobe, uprobe)."),
    _b("args", "struct", "Arguments as a struct: args->filename (tracepoint, kfunc, uprobe with DWARF)."),
    _b("ctx", "pointer", "The probe's raw context (pt_regs, or the tracepoint record)."),
    _b("cgroup", "uint64", "cgroup v2 ID of the current task."),
    _b("comm", "string[16]", "Name of the current task, as in /proc/<pid>/comm."),
    _b("cpid", "uint32", "PID of the child started with -c (diagd does not use -c)."),
    _b("cpu", "uint32", "CPU running the probe."),
    _b("curtask", "uint64", "Pointer to the current task's struct task_struct."),
    _b("elapsed", "uint64", "Nanoseconds since bpftrace started."),
    _b("func", "string", "Name of the traced function (kprobe, uprobe, kfunc)."),
    _b("gid", "uint64", "Group ID of the current task."),
    _b("kstack", "kstack", "Kernel stack trace of the current task."),
    _b("nsecs", "uint64", "Nanoseconds since boot (including suspend where ktime_get_boot_ns exists)."),
    _b("numaid", "uint32", "NUMA node running the probe."),
    _b("pid", "uint64", "Process ID (thread group ID) of the current task."),
    _b("probe", "string", "Full name of the probe that fired."),
    _b("rand", "uint32", "A pseudo-random number."),
    _b("retval", "int64", "Return value of the traced function (kretprobe, uretprobe, kretfunc)."),
    _b("tid", "uint64", "Thread ID of the current task."),
    _b("uid", "uint64", "User ID of the current task."),
    _b("username", "string", "User name of the current task's UID."),
    _b("ustack", "ustack", "User-space stack trace of the current task."),
    _m("avg", "avg(int64 n)", "Running average of n."),
    _m("clear", "clear(map m)", "Remove every key of a map.", "async"),
    _m("count", "count()", "Count events (per-CPU map: cheaper than @++)."),
    _m("delete", "delete(map m[key])", "Delete one key of a map."),
    _m("hist", "hist(int64 n)", "Power-of-2 histogram of n."),
    _m("lhist", "lhist(int64 n, int64 min, int64 max, int64 step)", "Linear histogram of n over [min, max)."),
    _m("max", "max(int64 n)", "Largest n seen."),
    _m("min", "min(int64 n)", "Smallest n seen."),
    _m("stats", "stats(int64 n)", "Count, average and total of n in one map."),
    _m("sum", "sum(int64 n)", "Sum of n."),
    _m("zero", "zero(map m)", "Set every value of a map to zero.", "async"),
    _f("bswap", "uintN bswap(uintN n)", "Reverse the byte order of an integer."),
    _f("buf", "buf_t buf(void *data, [int64 length])", "Bytes at data, printable with %r (hex for non-ASCII)."),
    _f("cat", "void cat(string namefmt, [...args])", "Print a file's contents (printf-style name).", "async"),
    _f("cgroup_path", "cgroup_path_t cgroup_path(int cgroupid, [string filter])", "Path of a cgroup ID."),
    _f("cgroupid", "uint64 cgroupid(const string path)", "cgroup v2 ID of the cgroup at path.", "compile_time"),
    _f("debugf", "void debugf(string fmt, ...)", "printf to the kernel trace pipe (bpf_trace_printk), not stdout."),
    _f("exit", "void exit()", "Stop bpftrace as on SIGINT: END runs and maps are printed.", "async"),
    _f("join", "void join(char *arr[], [char *sep])", "Print a string array (e.g. argv) joined by sep.", "async"),
    _f("kaddr", "uint64 kaddr(const string name)", "Address of a kernel symbol.", "compile_time"),
    _f("kptr", "T *kptr(T *ptr)", "Mark a pointer as a kernel address space pointer."),
    _f("ksym", "ksym_t ksym(uint64 addr)", "Name of the kernel function containing addr.", "async"),
    _f("kstack", "kstack_t kstack([StackMode mode, ][int limit])", "Kernel stack with mode (bpftrace, perf, raw) "
       "and depth limit."),
    _f("macaddr", "macaddr_t macaddr(char[6] mac)", "A MAC address, printable with %s."),
    _f("ntop", "inet_t ntop([int af, ]int|char[4|16] addr)", "Text form of an IPv4 or IPv6 address."),
    _f("override", "void override(uint64 rc)", "Skip the probed kernel function and return rc (kprobe).", "unsafe"),
    _f("path", "char *path(struct path *path)", "Full path of a struct path (kfunc, kretfunc, iter; kernel 5.10)."),
    _f("print", ("void print(T val)", "void print(@map[, uint64 top[, uint64 div]])"),
       "Print a value or a map with its default formatting.", "async"),
    _f("printf", "void printf(const string fmt, args...)", "Formatted output.", "async"),
    _f("pton", "char addr[4|16] pton(const string addr)", "IPv4/IPv6 text address to bytes.", "compile_time"),
    _f("reg", "uint64 reg(const string name)", "Value of a CPU register (kprobe, uprobe)."),
    _f("signal", ("void signal(const string sig)", "void signal(uint32 signum)"),
       "Send a signal to the current task (kernel 5.3).", "unsafe"),
    _f("sizeof", ("uint64 sizeof(TYPE)", "uint64 sizeof(EXPRESSION)"), "Size in bytes of a type or expression.",
       "compile_time"),
    _f("skboutput", "uint32 skboutput(const string path, struct sk_buff *skb, uint64 length, const uint64 offset)",
       "Write sk_buff data to a PCAP file (kernel 5.5)."),
    _f("str", "string str(char *data[, uint32 length])", "Read a NUL-terminated string."),
    _f("strcontains", "int64 strcontains(const char *haystack, const char *needle)", "Whether haystack contains "
       "needle."),
    _f("strerror", "strerror_t strerror(int error)", "Text of an errno value."),
    _f("strftime", "timestamp strftime(const string fmt, int64 timestamp_ns)", "Format a boot-time ns timestamp as "
       "date/time.", "async"),
    _f("strncmp", "int64 strncmp(char *s1, char *s2, int64 n)", "Compare up to n characters (0 when equal)."),
    _f("system", "void system(string namefmt [, ...args])", "Run a shell command and print its output.", "unsafe",
       "async"),
    _f("time", "void time(const string fmt)", "Print the current wall-clock time.", "async"),
    _f("uaddr", "T *uaddr(const string sym)", "Address of a user-space symbol (uprobe; no ASLR support)."),
    _f("unwatch", "void unwatch(void *addr)", "Remove a watchpoint.", "async"),
    _f("uptr", "T *uptr(T *ptr)", "Mark a pointer as a user address space pointer."),
    _f("ustack", "ustack_t ustack([StackMode mode, ][int limit])", "User stack with mode and depth limit."),
    _f("usym", "usym_t usym(uint64 addr)", "Name of the user-space symbol containing addr.", "async"),
)

MAN_PAGES = (Path("/usr/share/man/man8/bpftrace.8.gz"), Path("/usr/local/share/man/man8/bpftrace.8.gz"),
             Path("/usr/share/man/man8/bpftrace.8"), Path("/usr/local/share/man/man8/bpftrace.8"))
_MAN_SECTIONS: dict[str, HelperKind] = {"MAP FUNCTIONS": "map_function", "FUNCTIONS": "function",
                                        "OUTPUT FORMATTING": "function"}
_ROFF = [(r"\(cq", "'"), (r"\(aq", "'"), (r"\*(Aq", "'"), (r"\(rs", "\\"), (r"\-", "-"), (r"\(bu", "*"),
         (r"\(lq", '"'), (r"\(rq", '"'), (r"\(em", "--"), (r"\(en", "-"), (r"\&", ""), (r"\c", "")]


def _unroff(text: str) -> str:
    text = re.sub(r"\\f(\(..|\[[^\]]*\]|.)", "", text)
    for escape, plain in _ROFF:
        text = text.replace(escape, plain)
    return re.sub(r"\s+", " ", text).strip()


def parse_man_page(text: str) -> list[Helper]:
    """Functions and map functions of the installed man page (asciidoctor roff): name, signatures,
    flags and the first sentence of the description."""
    helpers: list[Helper] = []
    section = ""
    entry: tuple[str, list[str]] | None = None

    def close() -> None:
        if entry is not None and section in _MAN_SECTIONS:
            helpers.append(_man_entry(entry[0], _MAN_SECTIONS[section], entry[1]))

    for line in text.splitlines():
        if found := re.match(r'^\.SH "(.*)"', line):
            close()
            section, entry = found[1], None
        elif found := re.match(r'^\.SS "(.*)"', line):
            close()
            entry = (found[1], [])
        elif entry is not None:
            entry[1].append(line)
    close()
    return helpers


def _man_entry(name: str, kind: HelperKind, lines: list[str]) -> Helper:
    signatures: list[str] = []
    flags: list[str] = []
    paragraphs: list[list[str]] = [[]]
    block, indented, literal = "", False, False
    for line in lines:
        if line.startswith(".B "):
            block = line[3:].strip()
        elif line.startswith(".RS"):
            indented = True
        elif line.startswith(".RE"):
            indented = False
        elif line.startswith(".nf"):
            literal = True
        elif line.startswith(".fi"):
            literal = False
        elif line.startswith(".sp"):
            paragraphs.append([])
        elif literal or line.startswith(".") or line.startswith("\\h'"):
            continue
        elif indented:
            if block == "variants":
                signatures.append(_unroff(line))
        elif _unroff(line) in ("unsafe", "async", "compile time"):
            flags.append(_unroff(line).replace(" ", "_"))
        elif not line.startswith(("\\fBKernel\\fP", "\\fBHelper\\fP")):
            paragraphs[-1].append(_unroff(line))
    prose = [" ".join(p) for p in paragraphs if p and not p[0].startswith(("Probe types", "Does not work"))]
    text = prose[0] if prose else ""
    first = re.split(r"(?<=[.!?])\s+(?=[A-Z`'\"(])", text, maxsplit=1)[0]
    return Helper(name, kind, first[:200], tuple(signatures), tuple(flags))


def read_installed_man_page() -> tuple[Path | None, list[Helper]]:
    """The first of MAN_PAGES that exists, and the helpers it documents (none without a man page)."""
    man = next((p for p in MAN_PAGES if p.exists()), None)
    if man is None:
        return None, []
    raw = man.read_bytes()
    return man, parse_man_page((gzip.decompress(raw) if man.suffix == ".gz" else raw).decode(errors="replace"))


def merged_helpers(man: list[Helper]) -> list[Helper]:
    known = {(h.name, h.kind) for h in HELPERS_0_17}
    return [*HELPERS_0_17, *(h for h in man if (h.name, h.kind) not in known)]


def verification_program(helpers: Sequence[Helper]) -> str:
    """A program naming every helper: a dry run of it reports the names the binary does not know."""
    calls = [f"{h.name}();" for h in helpers if h.kind != "builtin" and h.name.isidentifier()]
    reads = [f"$v{i} = {h.name};" for i, h in enumerate(helpers) if h.kind == "builtin" and h.name.isidentifier()]
    return "BEGIN { " + " ".join(reads + calls) + " }"


UNKNOWN = re.compile(r"ERROR: Unknown (function|identifier): '?(\w+)'?")
