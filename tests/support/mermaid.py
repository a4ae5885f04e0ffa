"""Mermaid sequence diagrams read back: a grammar-level reader (participants, arrows, notes) and, when
installed, the real `mermaid` parser (node + jsdom, installed by scripts/setup.sh outside the repo)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

SCRIPT = Path(__file__).with_name("mermaid_parse.mjs")
RENDER = Path(__file__).with_name("mermaid_render.mjs")
PARTICIPANT = re.compile(r"^    participant ([A-Za-z]+_\d+) as ([^;#\n]+)$")
ARROW = re.compile(r"^    ([A-Za-z]+_\d+)(->>|-x)([A-Za-z]+_\d+): \[(\d+)\] ([^;#\n]*)$")
NOTE = re.compile(r"^    Note (?:over [A-Za-z]+_\d+(?:,[A-Za-z]+_\d+)?|right of [A-Za-z]+_\d+): [^;#\n]+$")
BESIDE = "    Note right of "  # a Note on the arrow before it (cause, verdict); `Note over`: a pause before the next


@dataclass(frozen=True)
class Arrow:
    frame: int
    src: str  # the participant's shown name
    dst: str
    text: str  # the whole message text, "[frame] ..."
    failed: bool
    notes: tuple[str, ...] = ()  # the Notes written right after it (cause, verdict and rule)


def read(diagram: str) -> tuple[dict[str, str], list[Arrow]]:
    """(participant id -> shown name, arrows); every line must be one of the forms diagd writes."""
    lines = diagram.rstrip("\n").split("\n")
    assert lines[0] == "sequenceDiagram", lines[0]
    names: dict[str, str] = {}
    arrows: list[Arrow] = []
    for line in lines[1:]:
        if m := PARTICIPANT.match(line):
            assert not arrows, f"participant declared after the first arrow: {line!r}"
            names[m.group(1)] = m.group(2)
        elif m := ARROW.match(line):
            src, kind, dst, frame, _ = m.groups()
            assert src in names and dst in names, line
            text = line.split(": ", 1)[1]
            arrows.append(Arrow(int(frame), names[src], names[dst], text, kind == "-x"))
        else:
            assert NOTE.match(line), f"not a line of the expected grammar: {line!r}"
            if line.startswith(BESIDE) and arrows:
                arrows[-1] = replace(arrows[-1], notes=(*arrows[-1].notes, line.split(": ", 1)[1]))
    return names, arrows


def parser_dir() -> Path | None:
    """Where `mermaid` and `jsdom` are installed, or None (tests then skip the real parser only)."""
    root = Path(os.environ.get("DIAGD_MERMAID_DIR", Path.home() / ".cache" / "diagd" / "mermaid"))
    ok = all((root / "node_modules" / name / "package.json").exists() for name in ("mermaid", "jsdom"))
    return root if ok and shutil.which("node") else None


def require_parser() -> Path:
    """The parser's folder, or a pytest skip naming what is missing (so the CI skip policy sees it)."""
    import pytest

    root = parser_dir()
    if root is None:
        pytest.skip("the Mermaid parser (node, mermaid, jsdom) is not installed: scripts/setup.sh test installs it")
    return root


def parse(diagrams: list[str], script: Path = SCRIPT) -> list[dict[str, object]]:
    """The real Mermaid parser's verdict on each diagram."""
    root = parser_dir()
    assert root is not None
    done = subprocess.run(["node", str(script)], input=json.dumps(diagrams), capture_output=True, text=True,
                          env={**os.environ, "MERMAID_DIR": str(root)}, check=True, timeout=300)
    verdicts: list[dict[str, object]] = json.loads(done.stdout)
    return verdicts


def render(diagrams: list[str]) -> list[dict[str, object]]:
    """The real Mermaid renderer's verdict on each diagram (what a viewer does after parsing)."""
    return parse(diagrams, RENDER)
