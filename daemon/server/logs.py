"""structlog JSON lines on stderr: journald keeps one event per line."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def quiet(level: str = "warning") -> Iterator[None]:
    """Within: only `level` and worse, as JSON lines on stderr; then the process's own logging config again.

    For the daemon's code run in another command (`diagd tools` with no daemon: server.offline_catalogue),
    whose stdout is its answer and whose stderr is a person's: structlog's unconfigured default prints
    every line on stdout."""
    configured, saved = structlog.is_configured(), structlog.get_config()
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
                        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr), cache_logger_on_first_use=False)
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()
