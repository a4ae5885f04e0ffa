"""structlog JSON lines on stderr: journald keeps one event per line."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info") -> None:
    numeric = logging.getLevelName(level.upper())
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(),
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries (the MCP SDK among them) log through stdlib logging: keep it on stderr, quiet.
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format='{"level":"%(levelname)s","logger":"%(name)s","event":"%(message)s"}')
