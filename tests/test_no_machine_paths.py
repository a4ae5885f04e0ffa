"""No file of the repository names a path of the development machine: a checkout anywhere else finds its
captures through the corpus cache (tests/corpus.toml), and the README's prompts run on the samples diagd
ships. Every tracked file is read (and every new one git would add), text or not."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
# The development machine's tree (the checkout, the shared corpus and fixtures beside it) and root's own
# install and cache folders there. `/root/.ssh/...` stays allowed: tests name it as a path to refuse.
MACHINE_PATHS = re.compile(rb"/work/[\w.-]+|/root/\.(?:local|cache)/")


def repository_files() -> list[str]:
    if not (TOP / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listed = subprocess.run(["git", "-C", str(TOP), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True, timeout=60).stdout.decode()
    return sorted(set(filter(None, listed.split("\0"))))


def test_no_repository_file_names_a_path_of_the_development_machine() -> None:
    me = Path(__file__).resolve().relative_to(TOP).as_posix()
    found = []
    for name in repository_files():
        path = TOP / name
        if name == me or not path.is_file():
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if match := MACHINE_PATHS.search(line):
                found.append(f"{name}:{number}: {match.group().decode(errors='replace')}")
    assert not found, "paths of the development machine (use a relative path, the corpus cache or the samples):\n" + \
        "\n".join(found)
