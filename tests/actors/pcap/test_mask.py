"""Subscriber-identity masking (actors/_pcap_mask.py) without a daemon: the text rules and the guard."""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pytest

from diagd.actors.pcap.masking.guard import SubscriberMask
from diagd.actors.pcap.masking.mask import Identities, Masker, identities_from
from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.shark.tree import hexdump
from diagd.actors.runtime import BackendConfig
from diagd.actors.tooling import CallContext
from diagd.protocol.errors import DiagdError, ErrorCode

IDS = identities_from({
    "e212.imsi": ["999991234567810", "001020000000064"],
    "e164.msisdn": ["1234567810", "0012000", "0015102000064"],
    "nas_5gs.mm.suci.msin": ["0000000031"],
    "http.request.uri": ["/namf-comm/v1/ue-contexts/imsi-208950000000031/n1-n2-messages"],
    "sip.from.user": ["+12675941249", "12675941249_Uclx8s21", "101"],
    "json.value.string": ["msisdn-200000000001", "suci-0-999-70-0000-0-0-0000000001"],
})
MASK = Masker(IDS)


def test_identities_are_sorted_by_kind_and_short_numbers_are_left_to_context() -> None:
    assert IDS.imsis == {"999991234567810", "001020000000064", "208950000000031"}
    assert IDS.numbers == {"1234567810", "0012000", "0015102000064", "12675941249", "200000000001"}
    assert IDS.msins == {"0000000031", "0000000001"}
    # An all-digit Subscription-Id-Data that is also an IMSI is an IMSI (it keeps MCC+MNC).
    both = identities_from({"e212.imsi": ["001010000000001"], "diameter.Subscription-Id-Data": ["001010000000001"]})
    assert both.imsis == {"001010000000001"} and not both.numbers


@pytest.mark.parametrize(("text", "shown"), [
    ("string;490;022;IMSI999991234567810", "string;490;022;IMSI99999**********"),
    ("IMSI: 001020000000064", "IMSI: 00102**********"),
    ("E.164 number (MSISDN): 0012000", "E.164 number (MSISDN): *******"),
    ("MSIN: 0000000031", "MSIN: **********"),
    ("/nudr-dr/v1/subscription-data/imsi-999700000000001/99970/provisioned-data",
     "/nudr-dr/v1/subscription-data/imsi-99970**********/99970/provisioned-data"),
    ("suci-0-208-95-0000-0-0-0000000031", "suci-0-208-95-0000-0-0-**********"),
    ("INVITE sip:+12263382742@1.2.3.4;transport=udp", "INVITE sip:+***********@1.2.3.4;transport=udp"),
    ("sip:101@10.0.0.1 sip:10.0.0.1:5060", "sip:***@10.0.0.1 sip:10.0.0.1:5060"),
    ("Request-URI User Part: 101", "Request-URI User Part: ***"),
    ('e212.imsi == "001029999999999"', 'e212.imsi == "00102**********"'),
    ("tel:+491701234567 msisdn-200000000001", "tel:+************ msisdn-************"),
    # TBCD bytes shown as hex (Diameter MSISDN AVP, S6a Subscription-Data).
    ("MSISDN: 2143658701", "MSISDN: **********"),
    ("val=005101020060f4", "val=**************"),
    ("Data: 00000590c000001028af2143658701000000", "Data: 00000590c000001028af**********000000"),
    # ASCII bytes shown as hex: "IMSI999991234567810".
    ("data: " + b"IMSI999991234567810".hex(), "data: " + b"IMSI99999".hex() + "*" * 20),
    # A dial prefix in front of an MSISDN; an MSIN at the end of an IMSI nobody listed.
    ("9998112675941249", "99981***********"),
    ("208950000000031", "20895**********"),
    # Pieces of identities cut at the edge of a snippet.
    ("234567810 cut at start", "********* cut at start"),
    ("cut at end 99999123", "cut at end 99999***"),
])
def test_text_rules(text: str, shown: str) -> None:
    assert MASK.text(text) == shown


@pytest.mark.parametrize("text", [
    "0x0000000000000001",  # a SEID: number literals are never identities
    "Time delta from previous captured frame: 0.001200000 seconds",
    "2021-05-05T20:29:54.903022Z",
    "Call-ID: 158936656982201062716@10.33.6.100",
    "sip:10.33.6.100:5060;transport=tcp",
    "frame.number == 4070 && e212.mcc == 208",
])
def test_other_numbers_stay(text: str) -> None:
    assert MASK.text(text) == text


def test_values_keys_and_numbers() -> None:
    result = MASK.value({
        "rows": [{"frame.number": 12, "e212.imsi": "001020000000064", "sip.from.user": "101",
                  "nas_5gs.mm.suci.msin": "0000000099", "e164.msisdn": 12345678}],
        "fields_resolved": {"e212.imsi": "e212.imsi"}, "total": 4070,
        "ues": {"imsi-001020000000064": {"suci_msin": "0000000031"}}, "ok": True,
        "identity_as_number": 1234567810,
    })
    assert result == {
        "rows": [{"frame.number": 12, "e212.imsi": "00102**********", "sip.from.user": "***",
                  "nas_5gs.mm.suci.msin": "**********", "e164.msisdn": "********"}],
        "fields_resolved": {"e212.imsi": "e212.imsi"}, "total": 4070,
        "ues": {"imsi-00102**********": {"suci_msin": "**********"}}, "ok": True,
        "identity_as_number": "**********",
    }


def test_hexdump_hides_identity_bytes_across_lines_and_keeps_its_layout() -> None:
    data = (b"\x00" * 5 + b"Session-Id: string;490;022;IMSI999991234567810\r\n"
            + bytes.fromhex("089999992143658701f0") + bytes.fromhex("0000000013"))
    dump = hexdump(base64.b64encode(data).decode())
    masked = MASK.text("Frame 1\n    IMSI: 999991234567810\n\n" + dump)
    lines = masked.split("\n")
    assert lines[1] == "    IMSI: 99999**********"
    assert [len(x) for x in lines[3:]] == [len(x) for x in dump.split("\n")]
    assert lines[5] == "0020  49 4d 53 49 39 39 39 39 39 ** ** ** ** ** ** **   IMSI99999*******"
    # TBCD IMSI (type nibble 9 first): MCC+MNC nibbles stay, the rest and the TBCD MSIN go.
    assert lines[6] == "0030  ** ** ** 0d 0a 08 99 99 99 ** ** ** ** ** f0 **   ***......*****.*"
    assert lines[7].startswith("0040  ** ** ** **")
    assert "1234567810" not in masked.replace(" ", "")


def test_no_identities_still_masks_by_context() -> None:
    bare = Masker(Identities())
    # The AVP code in `MSISDN(701)` is not a value; `IMSI (…)` (a summary line) is.
    assert bare.text("AVP: MSISDN(701) l=17 f=VM- vnd=TGPP val=2143658701") == (
        "AVP: MSISDN(701) l=17 f=VM- vnd=TGPP val=**********")
    assert bare.text("Mobile identity - IMSI (001010000000001)") == "Mobile identity - IMSI (00101**********)"
    assert bare.text("imsi-001010000000001 and IMSI: 001010000000002 sip:2001@h") == (
        "imsi-00101********** and IMSI: 00101********** sip:****@h")


# -- the guard ----------------------------------------------------------------------------------


def fake_tshark(stdout: str, code: int = 0) -> list[str]:
    """An argv standing in for `tshark -r FILE`: prints `stdout`, exits with `code`, ignores the rest."""
    return [sys.executable, "-c", f"import sys; sys.stdout.write({stdout!r}); sys.exit({code})"]


def mask_for(tmp_path: Path, argv: list[str], enabled: bool = True) -> SubscriberMask:
    async def capture_of(args: dict[str, Any]) -> tuple[str, list[str]] | None:
        return ("key", argv) if "pcap_path" in args else None

    async def known() -> list[str]:
        return ["e212.imsi"]

    return SubscriberMask(enabled=lambda: enabled, output_dir=lambda: tmp_path, capture_of=capture_of,
                          known_fields=known)


async def test_guard_masks_results_errors_progress_and_tsv_exports(tmp_path: Path) -> None:
    mask = mask_for(tmp_path, fake_tshark("001019876543210\n"))
    tsv = tmp_path / "list.tsv"
    seen: list[str | None] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        await ctx.report_progress(0, 1, "loading imsi-001019876543210.pcap")
        tsv.write_text("No.\te212.imsi\tInfo\n1\t001019876543210\tfor 001019876543210\n")
        return {"output_path": str(tsv), "file_size_bytes": tsv.stat().st_size, "note": "x 001019876543210 y"}

    ctx = CallContext(client="t", progress=progress)
    result = await mask.guard("pcap_x", handler)(ctx, {"pcap_path": "/x"})
    assert result["note"] == "x 00101********** y"
    assert seen == ["loading imsi-00101**********.pcap"] and ctx.progress is progress
    assert tsv.read_text() == "No.\te212.imsi\tInfo\n1\t00101**********\tfor 00101**********\n"
    assert result["file_size_bytes"] == tsv.stat().st_size

    async def failing(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        raise DiagdError(ErrorCode.INVALID_FILTER, "bad filter near 001019876543210",
                         display_filter='e212.imsi == "001019876543210" &&')

    with pytest.raises(DiagdError) as caught:
        await mask.guard("pcap_x", failing)(ctx, {"pcap_path": "/x"})
    assert caught.value.code == ErrorCode.INVALID_FILTER
    assert caught.value.message == "bad filter near 00101**********"
    assert caught.value.details == {"display_filter": 'e212.imsi == "00101**********" &&'}

    async def crashing(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("001019876543210")

    with pytest.raises(DiagdError) as crashed:
        await mask.guard("pcap_x", crashing)(ctx, {})
    assert crashed.value.code == ErrorCode.INTERNAL_ERROR and "00101**********" in crashed.value.message


async def test_guard_fails_closed_when_identities_cannot_be_listed(tmp_path: Path) -> None:
    mask = mask_for(tmp_path, fake_tshark("", code=2))

    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"value": "42"}

    with pytest.raises(DiagdError) as caught:
        await mask.guard("pcap_x", handler)(CallContext(client="t"), {"pcap_path": "/x"})
    assert caught.value.code == ErrorCode.BACKEND_UNAVAILABLE and "withheld" in caught.value.message


async def test_guard_off_is_a_pass_through_and_binary_exports_are_flagged(tmp_path: Path) -> None:
    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        return {"imsi": "001019876543210", "output_path": str(tmp_path / "sub.pcapng")}

    off = mask_for(tmp_path, fake_tshark("", code=2), enabled=False)
    assert await off.guard("pcap_x", handler)(CallContext(client="t"), {"pcap_path": "/x"}) == {
        "imsi": "001019876543210", "output_path": str(tmp_path / "sub.pcapng")}
    on = mask_for(tmp_path, fake_tshark("001019876543210\n"))
    result = await on.guard("pcap_x", handler)(CallContext(client="t"), {"pcap_path": "/x"})
    assert result["imsi"] == "00101**********"
    assert "not masked" in result["warnings"][0]


@pytest.mark.parametrize(("value", "ok"), [(True, True), (False, True), ("false", False), (1, False)])
def test_the_setting_is_a_real_boolean(tmp_path: Path, value: object, ok: bool) -> None:
    """`mask_subscriber_ids = "false"` (a string) must not quietly mean true, nor 1 mean anything."""
    config = BackendConfig(table={"mask_subscriber_ids": value})
    if ok:
        assert PcapSettings.from_config(config, tmp_path).mask_subscriber_ids is value
    else:
        with pytest.raises(DiagdError) as caught:
            PcapSettings.from_config(config, tmp_path)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT and "true or false" in caught.value.message


async def test_an_export_named_after_an_identity_is_still_masked(tmp_path: Path) -> None:
    mask = mask_for(tmp_path, fake_tshark("001019876543210\n"))
    tsv = tmp_path / "imsi-001019876543210-20260101T000000-abcdef.tsv"

    async def handler(ctx: CallContext, args: dict[str, Any]) -> dict[str, Any]:
        tsv.write_text("No.\tInfo\n1\tIMSI 001019876543210\n")
        return {"output_path": str(tsv), "file_size_bytes": tsv.stat().st_size}

    result = await mask.guard("pcap_x", handler)(CallContext(client="t"), {"pcap_path": "/x"})
    assert result["output_path"] == str(tmp_path / "imsi-00101**********-20260101T000000-abcdef.tsv")
    assert tsv.read_text() == "No.\tInfo\n1\tIMSI 00101**********\n"
