"""single_pass_text.frames_of on what tshark -V prints: frames split at their first line, and no frame at
all in an output without one (a filter that matched nothing, a capture without packets), which once
raised inside the pcap actor."""

from __future__ import annotations

from diagd.actors.pcap.shark.single_pass_text import FrameText, frames_of


def test_an_output_without_a_frame_has_no_frames() -> None:
    assert frames_of("") == []
    assert frames_of("\n") == []
    assert frames_of("Running as user \"root\" and group \"root\". This could be dangerous.\n") == []


def test_frames_are_split_at_their_first_line() -> None:
    text = "Frame 1: 60 bytes on wire\n    a\n\nFrame 7: 62 bytes on wire\n    b\n\n"
    assert frames_of(text) == [FrameText(1, "Frame 1: 60 bytes on wire\n    a"),
                               FrameText(7, "Frame 7: 62 bytes on wire\n    b")]
