"""Every `diagd` sub-command's --help describes every option and argument it takes."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator

from diagd.daemon.cli import cli
from tests.conftest import DIAGD


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(the words after `diagd`, its parser) for diagd itself and every sub-command, nested ones too."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            described = {a.dest for a in action._choices_actions if a.help}
            for name, sub in action.choices.items():
                assert name in described, f"diagd {' '.join((*path, name))} has no help line in its parent's list"
                yield from commands(sub, (*path, name))


def test_every_option_of_every_subcommand_has_a_description_in_its_help() -> None:
    missing = []
    seen = 0
    for path, parser in commands(cli._parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            seen += 1
            name = "/".join(action.option_strings) or action.dest
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"diagd {' '.join(path)}: {name}")
            elif " ".join(action.help.split()) not in text:  # shown, not only declared
                missing.append(f"diagd {' '.join(path)}: {name} (not in --help)")
    assert seen > 40 and not missing, "\n".join(missing)


def test_the_installed_command_prints_the_descriptions() -> None:
    done = subprocess.run([DIAGD, "call", "--help"], capture_output=True, text=True, timeout=30, check=True)
    assert "banners on stderr" in done.stdout and "the tool's name" in done.stdout
    done = subprocess.run([DIAGD, "client", "add", "--help"], capture_output=True, text=True, timeout=30, check=True)
    assert "print the entry (JSON) instead of writing the file" in done.stdout
