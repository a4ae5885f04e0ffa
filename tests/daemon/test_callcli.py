"""`diagd call` argument parsing and banner format."""

from __future__ import annotations

import io

import pytest

from diagd.daemon.cli.callcli import (
    RULE,
    ArgumentError,
    banner_after,
    banner_before,
    parse_arguments,
    split_options,
    split_raw,
    take_raw,
)


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([], {}),
        (["limit=5"], {"limit": 5}),
        (["ratio=0.25", "flag=true", "nothing=null"], {"ratio": 0.25, "flag": True, "nothing": None}),
        (["frames=[1,2,3]"], {"frames": [1, 2, 3]}),
        (['obj={"a":1}'], {"obj": {"a": 1}}),
        (["name=plain text"], {"name": "plain text"}),  # a shell-quoted value with spaces
        (['quoted="42"'], {"quoted": "42"}),  # JSON string: stays a string
        (["filter=ngap && sctp"], {"filter": "ngap && sctp"}),
        (["eq=a=b"], {"eq": "a=b"}),  # only the first '=' splits
        (["empty="], {"empty": ""}),
        (["a=1", "\\", "b=2"], {"a": 1, "b": 2}),  # a literal backslash token from a continuation
        (["a=1 \\\nb=two"], {"a": 1, "b": "two"}),  # backslash-newline inside one token
        (["a=1", "a=2"], {"a": 2}),
    ],
)
def test_key_value_arguments_parse_as_json_when_they_parse(tokens: list[str], expected: dict[str, object]) -> None:
    assert parse_arguments(tokens) == expected


def test_args_json_is_merged_under_key_value_tokens() -> None:
    assert parse_arguments(["b=3"], '{"a": 1, "b": 2}') == {"a": 1, "b": 3}


@pytest.mark.parametrize("bad", [["novalue"], ["=5"]])
def test_tokens_without_key_are_refused(bad: list[str]) -> None:
    with pytest.raises(ArgumentError):
        parse_arguments(bad)


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]"])
def test_bad_args_json_is_refused(bad: str) -> None:
    with pytest.raises(ArgumentError):
        parse_arguments([], bad)


def test_verbose_banner_has_the_documented_shape() -> None:
    out = io.StringIO()
    banner_before("pcap_info", {"pcap_path": "/x.pcap"}, "verbose", out)
    banner_after("pcap_info", {"pcap_path": "/x.pcap"}, 1.4512, "verbose", out)
    assert out.getvalue() == (
        "📡 calling tool: pcap_info\n"
        "   args: {\n"
        '     "pcap_path": "/x.pcap"\n'
        "   }\n"
        f"{RULE}\n"
        "ℹ️ source: pcap_info\n"
        "   args: {\n"
        '     "pcap_path": "/x.pcap"\n'
        "   }\n"
        "   elapsed: 1.45s\n"
        f"{RULE}\n"
    )


def test_no_arguments_show_empty_braces() -> None:
    out = io.StringIO()
    banner_before("diagd_status", {}, "verbose", out)
    assert out.getvalue() == "📡 calling tool: diagd_status\n   args: {}\n"


def test_simple_banner_shows_only_the_tool_name() -> None:
    out = io.StringIO()
    banner_before("t", {"a": 1}, "simple", out)
    banner_after("t", {"a": 1}, 0.5, "simple", out)
    assert out.getvalue() == "📡 calling tool: t\n"


def test_visibility_off_prints_nothing() -> None:
    out = io.StringIO()
    banner_before("t", {"a": 1}, "off", out)
    banner_after("t", {"a": 1}, 0.5, "off", out)
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("tokens", "rest", "options"),
    [
        (["a=1", "--visibility", "off"], ["a=1"], {"visibility": "off"}),
        (["--visibility=simple", "a=1"], ["a=1"], {"visibility": "simple"}),
        (["--args-json", '{"a": 1}', "b=2"], ["b=2"], {"args_json": '{"a": 1}'}),
        (["x=--visibility"], ["x=--visibility"], {}),
    ],
)
def test_options_may_come_before_or_after_the_tool_arguments(
        tokens: list[str], rest: list[str], options: dict[str, str]) -> None:
    assert split_options(tokens) == (rest, options)


@pytest.mark.parametrize("bad", [["--visibility"], ["--visibility", "loud"]])
def test_bad_options_are_refused(bad: list[str]) -> None:
    with pytest.raises(ArgumentError):
        split_options(bad)


SCHEMA = {"type": "object", "required": ["pcap_path", "frame_number"],
          "properties": {"pcap_path": {"type": "string"}, "frame_number": {"type": "integer"}}}


def test_a_word_without_key_is_taken_by_the_next_required_argument_and_the_banner_shows_it_raw() -> None:
    pairs, raw = split_raw(["/tmp/x.pcap", "limit=5", "12"])
    arguments = parse_arguments(pairs)
    taken = take_raw(raw, arguments, SCHEMA)
    assert arguments == {"limit": 5, "pcap_path": "/tmp/x.pcap", "frame_number": 12}
    assert taken == [("/tmp/x.pcap", "pcap_path"), ("12", "frame_number")]
    out = io.StringIO()
    banner_before("pcap_frame", arguments, "simple", out, taken=taken)
    assert "raw: /tmp/x.pcap  (not key=value: taken as pcap_path" in out.getvalue()
    assert "raw: 12  (not key=value: taken as frame_number" in out.getvalue()


def test_a_word_with_no_required_argument_left_is_refused() -> None:
    with pytest.raises(ArgumentError, match="every required argument is given"):
        take_raw(["extra"], {"pcap_path": "a", "frame_number": 1}, SCHEMA)
    assert take_raw([], {}, SCHEMA) == []
