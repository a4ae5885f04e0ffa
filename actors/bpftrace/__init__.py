"""The bpftrace actor: one actor per execution, owning its bpftrace process and output buffer.

`exec_program` starts an actor (kind "bpftrace", resource = execution id) whose `start()` spawns
bpftrace and returns once its probes are attached or it has exited. bpftrace announces them
("Attaching N probes...", or `attached_probes` in JSON mode) after its own parser and semantic
analyser have passed, so a syntax error, an unknown tracepoint or an unsafe builtin comes back at
once as a coded error with line and column, at no extra cost; it attaches them afterwards and says
so on stderr when __BPFTRACE_NOTIFY_PROBES_ATTACHED is in its environment, so a probe the kernel
refuses (a kprobe on a kernel without kprobe_events) is exec_program's answer too, not a surprise
in get_result. (Through privileged_helper sudo drops that variable: there the announcement has to
do.) (bpftrace
0.17 has no `--dry-run`; `-d` runs the same passes plus LLVM codegen and dumps the AST and IR, a
second full compile per program.) The run then continues in the actor's nursery; the tools page
through its buffered output while it runs. Since exec_program returns at once, progress
notifications belong to `get_result` with `wait_s`: it long-polls for new output (or, with
until=done, for the end) and reports the tracing time against the timeout every 0.5 s.

Limits come from the `[bpftrace]` config table (see `BpftraceSettings`): run time (counted from
the attach: compiling and attaching are bounded by start_timeout_s), buffered lines and bytes
(then a graceful stop flagged `buffer_full`), and concurrent executions (the next one is refused
with BUSY). The actor's idle timeout covers the whole run, so it cannot expire mid-run; once the
run has ended it retires itself after linger_s.

Stopping is SIGINT first, so bpftrace detaches and prints its final maps, then SIGKILL. The grace
period grows with the number of attached probes: detaching costs one RCU grace period per probe
(about 75 ms each on a 2-vCPU VM, so ~27 s for 360 syscall tracepoints, and SIGKILL does not make
the kernel side any faster).

Executions (metadata and output lines) are persisted under `<state_dir>/bpftrace/<id>/`, so
`get_result` works after the actor expired and after a daemon restart; a run that was in flight
when the daemon stopped is reported as `interrupted`, and a bpftrace left behind by a daemon
that was killed is reaped at the next start.
"""

from __future__ import annotations

from diagd.actors.bpftrace.tools import register
from diagd.actors.system import Needs, Tool, check_bpf_privileges, check_tracefs

__all__ = ["SYSTEM_NEEDS", "register"]

# What `diagd setup bpftrace` installs and `diagd doctor` checks (tracefs is a mount, not a package).
SYSTEM_NEEDS = Needs(tools=(Tool("bpftrace", ("--version",), "bpftrace"),),
                     checks=(check_bpf_privileges, check_tracefs),
                     note="tracepoints need tracefs: sudo mount -t tracefs nodev /sys/kernel/tracing")
