"""Messages to a capture's actor: the requests its tools send, each a `Message[<its reply>]`."""

from __future__ import annotations

from dataclasses import dataclass

from diagd.actors.capture.replies import CaptureSummary
from diagd.actors.message import Message


class Stopping(CaptureSummary):
    """What `Stop` answers: the capture as it was when told to stop, and from whom it was taken."""

    took_over_from: str | None


@dataclass(frozen=True)
class Stop(Message[Stopping]):
    """Stop the capture (its owner, a client whose owner has gone, or `force`)."""

    client: str
    force: bool = False
