"""Argument schemas the bpftrace tools share (their replies are models: replies.py)."""

from __future__ import annotations

from diagd.actors.bpftrace.store import EXECUTION_ID

EXECUTION_ID_ARG = {"type": "string", "pattern": EXECUTION_ID.pattern, "description": "as returned by exec_program"}
