"""actors/settings.py: one parser for every config table, refusing what it does not know."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from diagd.actors import pcap
from diagd.actors.bpftrace.settings import BpftraceSettings
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.runtime import BackendConfig
from diagd.actors.serial.settings import SerialConfig
from diagd.actors.settings import parse_table, setting
from diagd.daemon import config as config_mod
from diagd.protocol.errors import DiagdError, ErrorCode


@dataclass(frozen=True)
class Table:
    name: str = "x"
    count: int = setting(3, minimum=1, maximum=10)
    ratio: float = setting(0.5, positive=True)
    flag: bool = False
    where: Path = Path("/tmp")
    dirs: tuple[str, ...] = ()
    rows: tuple[dict[str, str], ...] = setting((), items=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    mode: str = setting("a", choices=("a", "b"))


def refused(raw: dict[str, Any], **kwargs: Any) -> DiagdError:
    with pytest.raises(DiagdError) as info:
        parse_table(Table, "t", raw, **kwargs)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    return info.value


def test_values_take_their_fields_kinds_and_inherited_defaults_fill_in() -> None:
    parsed = parse_table(Table, "t", {"count": 4, "ratio": 2, "where": "/var", "dirs": ["/a"], "rows": [{"k": "v"}],
                                      "extra": {"p": {"q": 1}}}, inherited={"dirs": ("/daemon",), "flag": True})
    assert parsed == Table(count=4, ratio=2.0, flag=True, where=Path("/var"), dirs=("/a",), rows=({"k": "v"},),
                           extra={"p": {"q": 1}})
    assert isinstance(parsed.ratio, float) and parse_table(Table, "t", {}) == Table()


def test_an_unknown_key_is_refused_naming_the_table_key_and_close_matches() -> None:
    error = refused({"cuont": 2})
    assert error.message == "[t] cuont is not a setting (did you mean count?)"
    assert error.details["setting"] == "[t] cuont" and error.details["did_you_mean"] == ["count"]


@pytest.mark.parametrize(("raw", "says"), [
    ({"count": True}, "[t] count must be an integer"),
    ({"count": 2.5}, "[t] count must be an integer"),
    ({"count": 0}, "[t] count must be at least 1"),
    ({"count": 11}, "[t] count must be at most 10"),
    ({"ratio": 0}, "[t] ratio must be positive"),
    ({"flag": "false"}, "[t] flag must be true or false"),
    ({"dirs": "/a"}, "[t] dirs must be a list of strings"),
    ({"rows": ["x"]}, "[t] rows must be a list of tables"),
    ({"extra": []}, "[t] extra must be a table"),
    ({"mode": "c"}, "[t] mode must be one of ['a', 'b']"),
])
def test_a_value_of_the_wrong_kind_or_out_of_bounds_is_refused(raw: dict[str, Any], says: str) -> None:
    error = refused(raw)
    assert error.message.startswith(says) and error.details["setting"] == f"[t] {next(iter(raw))}"


@pytest.mark.parametrize("parse", [
    lambda raw: BpftraceSettings.parse(raw),
    lambda raw: SerialConfig.parse(raw),
    lambda raw: CrashSettings.from_raw(raw),
    lambda raw: pcap.PcapSettings.from_config(BackendConfig(table=raw), Path("/state/pcap")),
    lambda raw: config_mod.parse({"daemon": raw}).daemon,
])
def test_every_table_refuses_a_misspelt_key(parse: Any) -> None:
    with pytest.raises(DiagdError) as info:
        parse({"max_lodaed": 1})
    assert "is not a setting" in info.value.message and info.value.details["setting"].endswith("max_lodaed")


def test_pcap_settings_inherit_the_daemons_dirs_and_keep_the_builtin_profiles() -> None:
    config = BackendConfig(table={"max_loaded": 2, "profiles": {"mine": {"decode_as": []}}}, allowed_dirs=("/d",))
    settings = pcap.PcapSettings.from_config(config, Path("/state/pcap"))
    assert settings.allowed_dirs == ("/d",) and settings.output_dir == Path("/state/pcap/exports")
    assert settings.max_loaded == 2 and set(settings.profiles) == {"5gc-lab", "mine"}
    with pytest.raises(DiagdError, match=r"\[pcap\] profiles.mine must be a table"):
        pcap.PcapSettings.from_config(BackendConfig(table={"profiles": {"mine": 1}}), Path("/s"))


def test_serial_port_tables_are_checked_when_the_config_is_read_and_the_first_match_wins() -> None:
    config = SerialConfig.parse({"line_ending": "lf", "baudrate": 9600,
                                 "ports": {"ttyUSB*": {"line_ending": "crlf"}, "/dev/ttyUSB0": {"baudrate": 57600}}})
    assert config.port_settings("/dev/ttyUSB0").line_ending == "crlf"  # ttyUSB* means /dev/ttyUSB*, first
    assert config.port_settings("/dev/ttyUSB0").baudrate == 9600
    assert (config.port_settings("/dev/ttyACM0").line_ending, SerialConfig().port_settings("/x").line_ending) == (
        "lf", "cr")
    for ports, says in [({"/dev/x": {"line_endin": "cr"}}, '[serial.ports."/dev/x"] line_endin is not a setting '
                                                          "(did you mean line_ending?)"),
                        ({"/dev/x": {"parity": "Q"}}, '[serial.ports."/dev/x"] parity must be one of'),
                        ({"/dev/x": {"stopbits": 3}}, '[serial.ports."/dev/x"] stopbits must be one of'),
                        ({"/dev/x": "crlf"}, '[serial] ports."/dev/x" must be a table')]:
        with pytest.raises(DiagdError) as info:
            SerialConfig.parse({"ports": ports})
        assert info.value.message.startswith(says), info.value.message
    with pytest.raises(DiagdError, match=r"\[serial\] line_ending must be one of"):
        SerialConfig.parse({"line_ending": "CR"})


def test_a_setting_above_every_table_is_refused_naming_its_table() -> None:
    with pytest.raises(DiagdError, match=r"call_timeout_s is outside any table.*did you mean \[daemon\] "
                                         r"call_timeout_s"):
        config_mod.parse({"call_timeout_s": 5, "daemon": {}})
