"""protocol/errors.py: one conversion between exceptions and the wire's {code, message, details}."""

from __future__ import annotations

from diagd.protocol.errors import DiagdError, ErrorCode, as_error


def test_an_error_goes_to_the_wire_and_comes_back_with_its_code_and_details() -> None:
    sent = DiagdError(ErrorCode.BUSY, "port held", owner="mcp:1")
    back = DiagdError.from_wire(**sent.to_wire())
    assert (back.code, back.message, back.details) == (ErrorCode.BUSY, "port held", {"owner": "mcp:1"})


def test_a_code_this_version_does_not_know_is_an_internal_error() -> None:
    assert DiagdError.from_wire("NEW_CODE", "from a newer peer").code == ErrorCode.INTERNAL_ERROR


def test_a_bug_becomes_internal_error_naming_what_failed_and_a_coded_error_stays_itself() -> None:
    coded = DiagdError(ErrorCode.NOT_FOUND, "gone")
    assert as_error(coded, "x") is coded
    bug = as_error(KeyError("k"), "pcap_info")
    assert bug.code == ErrorCode.INTERNAL_ERROR and bug.message == "pcap_info failed: KeyError: 'k'"
