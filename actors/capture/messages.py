"""Messages to a capture's actor: the requests its tools send."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stop:
    """Stop the capture (its owner, a client whose owner has gone, or `force`)."""

    client: str
    force: bool = False

