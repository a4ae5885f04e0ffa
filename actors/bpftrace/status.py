"""A bpftrace run's status and why it stopped: the values its record and its replies hold."""

from __future__ import annotations

import enum


class Status(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"  # bpftrace exited by itself, or at the end of the duration it was given
    FAILED = "failed"
    TIMED_OUT = "timed_out"  # only in records of older versions, which so called a run that reached its duration
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"


class StopReason(enum.StrEnum):
    REQUESTED = "stop_execution"
    # exec_program's `timeout` is how long to trace: reaching it is the normal end (END runs, maps print).
    DURATION = "duration_reached"
    TIMEOUT = "timeout"  # older versions' name for DURATION, read from their records
    BUFFER_FULL = "buffer_full"
    ACTOR_STOPPED = "actor_stopped"  # diagd_stop_actor, or the actor crashed
    SHUTDOWN = "daemon_shutdown"
    DAEMON_DIED = "daemon_exited"  # found in flight at the next start
