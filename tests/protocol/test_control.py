"""Control-socket framing and typed messages: round trips, and malformed input as coded errors."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagd.protocol import control
from diagd.protocol.errors import DiagdError, ErrorCode


@pytest.mark.parametrize(
    "msg",
    [
        control.Hello(version=1, client="x"),
        control.StatusRequest(id=1),
        control.CallRequest(id=2, tool="echo", arguments={"a": [1, 2], "b": "é"}),
        control.CallRequest(id=2, tool="echo", progress=True),
        control.Progress(id=2, progress=0.5, total=1.0, message="loading"),
        control.Progress(id=2, progress=3.0),
        control.StopActorRequest(id=3, actor_id="echo-1"),
        control.Reply(id=4, result={"x": 1}),
        control.ErrorReply(id=5, code="NOT_FOUND", message="nope", details={"k": 1}),
    ],
)
def test_messages_round_trip(msg: control.Message) -> None:
    frame = control.encode(msg)
    assert control.frame_length(frame[: control.HEADER_SIZE]) == len(frame) - control.HEADER_SIZE
    assert control.decode(frame[control.HEADER_SIZE:]) == msg


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"\xc1garbage", "not valid msgpack"),
        (msgpack.packb([1, 2]), "not a msgpack map"),
        (msgpack.packb({"t": "launch_missiles"}), "unknown message type"),
        (msgpack.packb({"t": "call", "id": 1}), "malformed"),
        (msgpack.packb({"t": "call", "id": "1", "tool": "x"}), "must be int"),
        (msgpack.packb({"t": "call", "id": 1, "tool": "x", "arguments": [1]}), "must be dict"),
        (msgpack.packb({"t": "progress", "id": 1, "progress": "half"}), "must be float"),
        (msgpack.packb({"t": "progress", "id": 1, "progress": 1, "message": 7}), "must be str"),
    ],
)
def test_malformed_frames_are_protocol_errors(body: bytes, why: str) -> None:
    with pytest.raises(DiagdError) as info:
        control.decode(body)
    assert info.value.code == ErrorCode.PROTOCOL_ERROR and why in info.value.message


def test_oversized_frame_header_is_refused_before_reading_the_body() -> None:
    header = (control.MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    with pytest.raises(DiagdError) as info:
        control.frame_length(header)
    assert info.value.code == ErrorCode.PROTOCOL_ERROR


@given(st.binary(max_size=256))
def test_decode_of_arbitrary_bytes_never_raises_anything_but_a_coded_error(body: bytes) -> None:
    try:
        control.decode(body)
    except DiagdError as exc:
        assert exc.code == ErrorCode.PROTOCOL_ERROR


def test_a_version_1_call_without_the_progress_field_still_decodes() -> None:
    # Version-1 clients never send `progress`: the daemon reads their calls as not asking for it.
    body = msgpack.packb({"t": "call", "id": 1, "tool": "echo", "arguments": {}})
    msg = control.decode(body)
    assert isinstance(msg, control.CallRequest) and msg.progress is False
    assert 1 in control.SUPPORTED_VERSIONS and control.PROTOCOL_VERSION in control.SUPPORTED_VERSIONS
