"""Reading what bpftrace prints: the attach announcement and events on stdout, and on stderr its located
compile errors, warnings and harmless notices, plus turning a refusal into the coded error a caller should
see. Text in, values out; kept apart so the actor only decides when to read, not how.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass, field
from typing import Any

from diagd.actors import system
from diagd.protocol.errors import DiagdError, ErrorCode

# ---------------------------------------------------------------------------------------------
# stdout: the attach announcement, lost events, JSON events

_ATTACH_TEXT = re.compile(r"^Attaching (\d+) probes?\.\.\.$")
# Set in bpftrace's environment, this variable makes it print itself as a line on stderr once every
# probe is attached (bpftrace's runtime tests wait for it the same way).
ATTACHED_MARKER = "__BPFTRACE_NOTIFY_PROBES_ATTACHED"
LOST_TEXT = re.compile(r"^Lost (\d+) events$")


def parse_json_line(line: str) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    return event if isinstance(event, dict) else {"type": "text", "data": line}



def attach_count(line: str, output_format: str) -> int | None:
    if output_format == "json":
        if not line.startswith('{"type": "attached_probes"'):
            return None
        data = parse_json_line(line).get("data")
        return int(data.get("probes", 0)) if isinstance(data, dict) else None
    found = _ATTACH_TEXT.match(line)
    return int(found[1]) if found else None



# ---------------------------------------------------------------------------------------------
# bpftrace's stderr: located diagnostics, harmless notices, everything else


@dataclass(frozen=True)
class Diagnostic:
    level: str  # "error" | "warning"
    message: str
    line: int | None = None
    column: int | None = None
    end_column: int | None = None
    source: str | None = None  # the program line bpftrace quoted

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}: " if self.line is not None else ""
        return f"{where}{self.message}"


@dataclass
class StderrReport:
    errors: list[Diagnostic] = field(default_factory=list)
    warnings: list[Diagnostic] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)

    def text(self) -> str:
        return "\n".join([*(str(e) for e in self.errors), *self.other])


_LOCATED = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?P<col>\d+)(?:-(?P<end>\d+))?: "
                      r"(?P<level>ERROR|WARNING): (?P<msg>.*)$")
_CARET = re.compile(r"^[ \t~]*$")  # under the quoted line; all blanks for an error at end of input
# bpftrace 0.17 prints this as an ERROR on every run here; since Linux 5.11 BPF memory is charged
# to the cgroup and RLIMIT_MEMLOCK no longer matters.
_MEMLOCK = re.compile(r"ERROR: Unknown error -?\d+: couldn't set RLIMIT_MEMLOCK for bpftrace\.[^\n]*")
# Printed without a trailing newline, so it runs into the next message.
_TRACEABLE = re.compile(r"Error while reading traceable functions from (\S+): (.*?)(?=ERROR:|WARNING:|\n|$)")
_UNSAFE = re.compile(r"(\w+)\(\) is an unsafe function being used in safe mode")
# bpftrace 0.17 quotes a kprobe's name (`'kprobe:f'`), not a hardware probe's (`hardware:cpu-cycles:1000000`).
_ATTACH_FAILED = re.compile(r"Error attaching probe: (?:'([^']*)'|([^'\s]\S*))")


def _kernel_at_least(major: int, minor: int) -> bool:
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    return found is not None and (int(found[1]), int(found[2])) >= (major, minor)


def parse_stderr(text: str) -> StderrReport:
    report = StderrReport()

    def memlock(match: re.Match[str]) -> str:
        if _kernel_at_least(5, 11):
            report.notices.append("bpftrace could not raise RLIMIT_MEMLOCK (harmless: this kernel charges BPF "
                                  "memory to the cgroup)")
            return "\n"
        return match[0] + "\n"

    def traceable(match: re.Match[str]) -> str:
        report.notices.append(f"bpftrace cannot read {match[1]} ({match[2].strip()}): kprobe names are not "
                              "checked before attaching")
        return "\n"

    text = _TRACEABLE.sub(traceable, _MEMLOCK.sub(memlock, text))
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.strip() or line == ATTACHED_MARKER:
            continue
        located = _LOCATED.match(line)
        if located:
            source = None
            if i + 1 < len(lines) and _CARET.match(lines[i + 1]):
                source = lines[i]
                i += 2
            diag = Diagnostic("error" if located["level"] == "ERROR" else "warning", located["msg"].strip(),
                              int(located["line"]), int(located["col"]),
                              int(located["end"]) if located["end"] else None, source)
            (report.errors if diag.level == "error" else report.warnings).append(diag)
        elif line.startswith("ERROR: ") or line.startswith("FATAL: "):
            report.errors.append(Diagnostic("error", line.split(": ", 1)[1].strip()))
        elif line.startswith("WARNING: "):
            report.warnings.append(Diagnostic("warning", line[len("WARNING: "):].strip()))
        else:
            report.other.append(line)
    return report


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def tracefs_fix() -> str:
    return system.check_tracefs().fix


def tracefs_error(what: str, **details: Any) -> DiagdError:
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE,
                      f"tracefs is not mounted (no /sys/kernel/tracing/available_events), so {what}: fix as root "
                      f"with `{tracefs_fix()}` (diagd doctor checks it)", fix=tracefs_fix(), **details)


def classify_failure(report: StderrReport, returncode: int | None, *, before_attach: bool,
                     doing: str = "before attaching its probes") -> DiagdError:
    """Turn bpftrace's refusal into the coded error the caller should see."""
    everything = "\n".join([*(d.message for d in report.errors), *report.other])
    details: dict[str, Any] = {"exit_code": returncode, "stderr": report.text()[-4000:]}
    if "only supports running as the root user" in everything:
        return DiagdError(ErrorCode.PERMISSION_DENIED, "bpftrace 0.17 runs only as root (euid 0; CAP_BPF+CAP_PERFMON "
                          "are not enough for this version): run diagd as root or set [bpftrace] privileged_helper "
                          "= \"sudo -n\" with a NOPASSWD sudoers rule for bpftrace", **details)
    if re.search(r"sudo: (a password is required|a terminal is required|.*not allowed)", everything):
        return DiagdError(ErrorCode.PERMISSION_DENIED, "the privileged helper refused to run bpftrace without a "
                          "password: add a NOPASSWD sudoers rule for bpftrace (diagd never answers prompts)",
                          **details)
    unsafe = sorted({m[1] for d in report.errors if (m := _UNSAFE.search(d.message))})
    if unsafe:
        return DiagdError(ErrorCode.PERMISSION_DENIED, f"the program uses unsafe builtin(s) {', '.join(unsafe)}(), "
                          "refused: set [bpftrace] allow_unsafe = true to allow them", unsafe=unsafe,
                          errors=[d.to_json() for d in report.errors], **details)
    if "tracepoint not found" in everything and system.tracefs_dir() is None:
        return tracefs_error("bpftrace cannot find any tracepoint", **details)
    failed_probe = _ATTACH_FAILED.search(everything)
    if failed_probe:
        # Announced ("Attaching N probes...") but refused by the kernel: bpftrace's lines before its
        # ERROR (e.g. `create_probe_event: open(.../kprobe_events): No such file or directory`) say why.
        probe = failed_probe[1] if failed_probe[1] is not None else failed_probe[2]
        why = "; ".join(line for line in report.other if line.strip()) or failed_probe[0]
        message = f"bpftrace could not attach {probe}: {why}"
        if "kprobe_events" in why and not os.path.exists("/sys/kernel/tracing/kprobe_events"):
            message += " (this kernel has no kprobe_events: kprobes cannot be used here; tracepoints can)"
        return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, message, probe=probe,
                          warnings=[str(w) for w in report.warnings], **details)
    located = [d for d in report.errors if d.line is not None]
    if located and before_attach:
        first = located[0]
        return DiagdError(ErrorCode.INVALID_ARGUMENT, f"bpftrace rejected the program: {first}", line=first.line,
                          column=first.column, end_column=first.end_column, source=first.source,
                          errors=[d.to_json() for d in report.errors], **details)
    if returncode is not None and returncode < 0:
        message = f"bpftrace was killed by {signal_name(returncode)} {doing}"
    else:
        message = f"bpftrace failed {doing}: " + (everything.strip() or f"exit status {returncode}")
    return DiagdError(ErrorCode.BACKEND_UNAVAILABLE, message, **details)
