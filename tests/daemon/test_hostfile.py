"""The host files' primitives, in-process: strict JSON and JSONC (daemon/cli/jsonedit.py), and reading and
replacing a file (daemon/cli/hostfile.py). Special files (FIFOs, devices) are tested through the real
command in test_clients.py, where a hang is a subprocess timeout, not a stuck suite."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from diagd.daemon.cli import hostfile, jsonedit
from diagd.protocol.errors import DiagdError, ErrorCode

ENTRY = {"command": "/bin/diagd", "args": ["mcp"]}


@pytest.mark.parametrize(("text", "said"), [
    ("[NaN]", "NaN is not a JSON number"), ('{"a": Infinity}', "Infinity is not a JSON number"),
    ("[-Infinity]", "-Infinity is not a JSON number"), ("[1e400]", "the number 1e400 is too large for a double"),
    ("[-1.5e309]", "the number -1.5e309 is too large"), ("[" + "9" * 5000 + "]", "Exceeds the limit (4300 digits)"),
    ("[" * 100_000, "nested too deeply"),
    ('{"a": 1,}', "Expecting property name enclosed in double quotes at line 1 column 9"),
    ("// c\n{}", "Expecting value at line 1 column 1"),
])
def test_strict_json_refuses_what_json_does_not_have(text: str, said: str) -> None:
    with pytest.raises(jsonedit.JsonError, match=said.replace("(", r"\(").replace(")", r"\)")):
        jsonedit.loads(text)


def test_what_is_written_is_never_nan_or_infinity() -> None:
    for number in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="not JSON compliant"):
            jsonedit.dumps({"x": number})
    with pytest.raises(ValueError, match="not JSON compliant"):
        jsonedit.set_member('{"a": {}}', ("a", "b"), float("nan"))
    assert jsonedit.loads("[1e308, -0.0, 12345678901234567890]") == [1e308, -0.0, 12345678901234567890]


def test_jsonc_comments_and_trailing_commas_are_read_and_strings_are_not_comments() -> None:
    text = '{\n  // c\n  "a": "x // y /* z */", /* b */\n  "b": [1, 2,],\n}\n'
    assert jsonedit.loads(text, comments=True) == {"a": "x // y /* z */", "b": [1, 2]}
    assert jsonedit.has_comments(text) and not jsonedit.has_comments('{"a": "//"}')
    assert jsonedit.loads("// only\n/* comments */", comments=True) is None
    with pytest.raises(jsonedit.JsonError, match=r"a /\* comment is not closed \(line 2 column 3\)"):
        jsonedit.loads('{\n  /* open\n}', comments=True)
    with pytest.raises(jsonedit.JsonError, match="Expecting ',' delimiter at line 4 column 1"):
        jsonedit.loads('{\n  "a": 1 /* two\nlines */\n"b": 2}', comments=True)  # positions kept across comments
    with pytest.raises(jsonedit.JsonError, match="NaN"):
        jsonedit.loads("[NaN] // c", comments=True)


@pytest.mark.parametrize(("before", "after"), [
    ("{}", '{"s": {"diagd": {"command": "/bin/diagd", "args": ["mcp"]}}}'),
    ('{"s":{"a":1}}', '{"s":{"a":1, "diagd": {"command": "/bin/diagd", "args": ["mcp"]}}}'),
    ('{\n  "s": {}\n}\n',
     '{\n  "s": {\n    "diagd": {\n      "command": "/bin/diagd",\n      "args": [\n        "mcp"\n      ]\n    }\n'
     '  }\n}\n'),
    ('{\n    "x": 1.50\n}', '{\n    "x": 1.50,\n    "s": {\n        "diagd": {\n            "command": "/bin/diagd",\n'
     '            "args": [\n                "mcp"\n            ]\n        }\n    }\n}'),
    ('{\n  "s": {\n    "diagd": {"old": 1}, // mine\n    "z": 0\n  }\n}',
     '{\n  "s": {\n    "diagd": {\n      "command": "/bin/diagd",\n      "args": [\n        "mcp"\n      ]\n'
     '    }, // mine\n    "z": 0\n  }\n}'),
])
def test_set_member_changes_only_the_members_span(before: str, after: str) -> None:
    assert jsonedit.set_member(before, ("s", "diagd"), ENTRY, comments=True) == after
    if "//" not in before:
        assert jsonedit.set_member(before, ("s", "diagd"), ENTRY) == after  # the same in plain JSON


@pytest.mark.parametrize(("before", "after"), [
    ('{"s": {"a": 1, "diagd": 2}}', '{"s": {"a": 1}}'),
    ('{"s": {"diagd": 2, "a": 1}}', '{"s": {"a": 1}}'),
    ('{"s": {"diagd": 2}}', '{"s": {}}'),
    ('{\n  "s": {\n    "diagd": 2\n  }\n}', '{\n  "s": {}\n}'),
    ('{\n  "s": {\n    "a": 1, // a\n    "diagd": 2\n  }\n}', '{\n  "s": {\n    "a": 1 // a\n  }\n}'),
    ('{\n  "s": {\n    "diagd": 2, // its comment goes with it\n    "a": 1,\n  },\n}',
     '{\n  "s": {\n    "a": 1,\n  },\n}'),
])
def test_remove_member_takes_out_the_member_and_one_comma(before: str, after: str) -> None:
    assert jsonedit.remove_member(before, ("s", "diagd"), comments=True) == after


def test_an_edit_that_cannot_be_made_in_place_is_none() -> None:
    assert jsonedit.set_member("// nothing\n", ("s", "d"), 1, comments=True) is None  # no object to edit
    assert jsonedit.set_member('{"s": []}', ("s", "d"), 1) is None  # not an object on the way
    assert jsonedit.remove_member('{"s": {}}', ("s", "d")) is None
    assert jsonedit.set_member('{"s": {"d": 1, "d": 2}}', ("s", "d"), 3) == '{"s": {"d": 1, "d": 3}}'  # the last counts


def test_replace_keeps_the_mode_makes_a_fresh_backup_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    file.write_text("{}")
    file.chmod(0o640)
    snap = hostfile.read(file)
    assert (snap.text, snap.mode, snap.link, snap.target) == ("{}", 0o640, None, file)
    backup = hostfile.replace(snap, '{"a": 1}\n')
    assert file.read_text() == '{"a": 1}\n' and stat.S_IMODE(file.stat().st_mode) == 0o640
    assert backup is not None and backup.read_text() == "{}" and stat.S_IMODE(backup.stat().st_mode) == 0o640
    assert backup.name.startswith("mcp.json.diagd-backup-") and sorted(tmp_path.iterdir()) == [file, backup]
    new = tmp_path / "sub" / "new.json"
    old_umask = os.umask(0o077)
    try:
        assert hostfile.replace(hostfile.read(new), "{}") is None
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o600 and list(new.parent.iterdir()) == [new]


def test_a_backup_name_taken_by_a_planted_link_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file, victim = tmp_path / "mcp.json", tmp_path / "victim"
    file.write_text("{}")
    victim.write_text("keep me")
    tokens = iter(["aaaa", "planted", "fresh0"])
    monkeypatch.setattr(hostfile.secrets, "token_hex", lambda n: next(tokens))
    monkeypatch.setattr(hostfile.time, "time_ns", lambda: 0)
    stamp = hostfile.time.strftime("%Y%m%dT%H%M%S", hostfile.time.localtime(0)) + ".000000"
    (tmp_path / f"mcp.json.diagd-backup-{stamp}-planted").symlink_to(victim)
    backup = hostfile.replace(hostfile.read(file), "[]")
    assert backup == tmp_path / f"mcp.json.diagd-backup-{stamp}-fresh0" and backup.read_text() == "{}"
    assert victim.read_text() == "keep me" and file.read_text() == "[]"


def test_a_file_changed_since_it_was_read_is_not_replaced(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    file.write_text("{}")
    snap = hostfile.read(file)
    file.write_text('{"written": "by the host meanwhile"}')
    with pytest.raises(DiagdError, match="changed while diagd was editing it") as raised:
        hostfile.replace(snap, "[]")
    assert raised.value.code == ErrorCode.BUSY
    assert json.loads(file.read_text()) == {"written": "by the host meanwhile"} and list(tmp_path.iterdir()) == [file]
    fresh = hostfile.read(tmp_path / "new.json")
    (tmp_path / "new.json").write_text("{}")
    with pytest.raises(DiagdError, match="changed while diagd"):
        hostfile.replace(fresh, "[]")


def test_undecodable_and_unreadable_files_are_coded_errors(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    file.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(DiagdError, match=r"is not UTF-8 text \(invalid start byte at byte 7\)") as raised:
        hostfile.read(file)
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT
    (tmp_path / "file").write_text("")
    assert hostfile.read(tmp_path / "file" / "mcp.json").data is None  # a path through a file: no such file
