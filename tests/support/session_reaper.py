"""Run a command the way a CI container's PID 1 or a subreaper does: as its parent, in the starter's
own session, adopting and reaping every orphan below it.

`python -m tests.support.session_reaper ARGV...` starts ARGV as a child (same session, same process
group as this process), marks itself PR_SET_CHILD_SUBREAPER, forwards SIGTERM/SIGINT to that child
and reaps whatever it adopts until no child is left. A daemon killed under it hands its children to
a process inside its old session, which is what made a stopped sharkd's group not orphaned in CI
(daemon/launch.py: lead_a_session).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    child = os.fork()
    if child == 0:
        os.execvp(argv[0], argv)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    code = 0
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return code
        if pid == child:
            code = os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
