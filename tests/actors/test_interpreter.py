"""Python processes of diagd trust no directory (actors/interpreter.py): the PYTHONPATH rules, and no
module starting `sys.executable` any other way."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from diagd.actors import interpreter

TOP = Path(__file__).resolve().parents[2]
# The modules that may start this interpreter: the rules themselves, and the sandbox launcher (`-I -S`).
STARTS_PYTHON = {"actors/interpreter.py", "actors/sandbox/__init__.py"}


def test_only_absolute_pythonpath_entries_are_kept() -> None:
    assert interpreter.safe_pythonpath("/a::rel:./x:/b:/a") == "/a:/b"
    assert interpreter.safe_pythonpath(":") is None and interpreter.safe_pythonpath(None) is None
    assert interpreter.unsafe_entries("/a::rel") == ["", "rel"]
    env = interpreter.child_env({"PYTHONPATH": "rel:", "KEEP": "1"}, EXTRA="2")
    assert env == {"KEEP": "1", "EXTRA": "2"}


def test_settle_forgets_the_start_directory_on_sys_path_and_in_pythonpath_then_moves_to_slash(
        tmp_path: Path) -> None:
    probe = ("import os, sys\nfrom diagd.actors import interpreter\nbefore = os.getcwd() in sys.path\n"
             "interpreter.settle()\nprint(before, os.getcwd() in sys.path, sys.path.count(''), os.getcwd(),"
             " os.environ.get('PYTHONPATH'))\n")
    env = {**os.environ, "PYTHONPATH": "/nowhere::lib"}
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False", "0", "/", "/nowhere"]


def test_no_module_starts_python_but_through_the_interpreter_rules() -> None:
    offenders = []
    for folder in ("daemon", "actors", "protocol", "diagd"):
        for path in sorted((TOP / folder).rglob("*.py")):
            rel = path.relative_to(TOP).as_posix()
            tree = ast.parse(path.read_text())
            uses = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "executable"
                    and isinstance(n.value, ast.Name) and n.value.id == "sys"]
            if uses and rel not in STARTS_PYTHON:
                offenders.append(f"{rel}:{uses}")
    assert not offenders, f"start Python with interpreter.module_argv (`-P`): {offenders}"
