"""The docs hold together: a short README that guides, links and anchors that resolve, no tracker numbers.

README.md is a guide (at most 250 lines) whose first lines are the two setup commands, with the
`pipx install` / `uv tool install` path beside them; CI runs exactly the test command it gives. The
reference lives in docs/ (one file per topic). In README.md, docs/*.md and the other READMEs: every
relative link points at a file that exists, and a `#fragment` at a heading of that file (GitHub's
anchor rules); no internal issue numbers ("issue 13", "#14"), which mean nothing to a reader; and
no http(s) URL anywhere in the repository names a host or repository not known to exist (a made-up
GitHub repository in a unit's Documentation= was such a dead link).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
README = TOP / "README.md"
DOCS = sorted((TOP / "docs").glob("*.md"))
PAGES = [README, *DOCS, TOP / "bench" / "README.md", TOP / "systemd" / "README.md"]
MAX_README_LINES = 250

# Hosts a URL may name: documentation sites known to exist, and names that are never real (loopback,
# RFC 2606/6761 example and test names), which examples and tests use.
KNOWN_HOSTS = frozenset({
    "trio.readthedocs.io", "modelcontextprotocol.io", "spec.modelcontextprotocol.io",
    "www.wireshark.org", "wireshark.org", "docs.python.org", "pypi.org", "pipx.pypa.io",
    "docs.astral.sh", "www.rfc-editor.org", "datatracker.ietf.org", "mermaid.js.org",
    "drgn.readthedocs.io", "crash-utility.github.io", "systemd.io", "www.freedesktop.org",
    "man7.org", "docs.kernel.org", "www.kernel.org", "www.3gpp.org", "jsonrpc.org", "www.jsonrpc.org",
    "raw.githubusercontent.com",  # the test corpus' pinned sources (tests/support/corpus_cache.py)
})
NEVER_REAL = re.compile(r"^(localhost|127\.0\.0\.1|\[::1\]|::1|0\.0\.0\.0|([\w-]+\.)*(example|test|invalid)"
                        r"|example\.(com|org|net))$")
# github.com/<owner>/<repo> URLs are allowed only for these (public repositories that exist).
KNOWN_REPOS = ("modelcontextprotocol/", "python-trio/trio", "bpftrace/bpftrace", "osandov/drgn",
               "crash-utility/crash", "pyserial/pyserial", "mermaid-js/mermaid")
SCANNED_FOR_URLS = ("README.md", "docs", "bench", "systemd", "daemon", "actors", "protocol", "scripts",
                    "tests", ".ci", "pyproject.toml")
URL = re.compile(r"https?://([^/\s)\"'`<>,]+)([^\s)\"'`<>]*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
HASH_NUMBER = re.compile(r"(?<![\w&/`\[])#\d+\b")


def prose(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", "``", line)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (lowercase, punctuation dropped, spaces to '-')."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def code_blocks(text: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def test_readme_is_a_short_guide() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move reference text to docs/<topic>.md")


def test_readme_starts_with_the_two_setup_commands_and_the_user_install_beside_them() -> None:
    text = README.read_text()
    before_first_section = text.split("\n## ", 1)[0]
    blocks = code_blocks(before_first_section)
    assert len(blocks) == 2, "the README opens with the setup block and the pipx/uv block, before any section"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0]]
    assert commands == ["./scripts/setup.sh start", "./scripts/setup.sh test"]
    assert blocks[1][0].startswith("pipx install .") and "uv tool install ." in blocks[1][0]


def test_ci_runs_the_test_command_the_readme_gives() -> None:
    readme_test = code_blocks(README.read_text())[0][1].split("#", 1)[0].strip()
    ci = (TOP / ".ci" / "run").read_text().splitlines()
    execs = [line.removeprefix("exec ").strip() for line in ci if line.startswith("exec ")]
    assert execs == [readme_test]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(TOP).as_posix())
def test_no_internal_issue_numbers(page: Path) -> None:
    name = page.relative_to(TOP)
    found = [f"{name}:{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1)
             if ISSUE.search(line)]
    found += [f"{name}:{n}: {line.strip()}" for n, line in prose(page.read_text()) if HASH_NUMBER.search(line)]
    assert not found, "internal tracker references mean nothing to a reader; say what changed instead:\n" + \
        "\n".join(found)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(TOP).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for number, line in prose(page.read_text()):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(TOP)}:{number}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(TOP)}:{number}: {target} (no heading #{fragment} in {dest.name})")
    assert not broken, "\n".join(broken)


def test_the_docs_folder_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, line in prose(README.read_text())
              for t in LINK.findall(line)}
    assert [d.name for d in DOCS if d.resolve() not in linked] == []


def scanned_files() -> Iterator[Path]:
    for name in SCANNED_FOR_URLS:
        root = TOP / name
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        yield from (f for f in files if f.is_file() and "__pycache__" not in f.parts
                    and f.suffix in ("", ".md", ".py", ".toml", ".sh", ".service", ".socket", ".txt", ".json"))


def test_no_url_points_nowhere() -> None:
    unknown = []
    for path in scanned_files():
        for host, rest in URL.findall(path.read_text(errors="replace")):
            bare = re.sub(r":(\d+|\{\w+\})$", "", host.lower())
            if NEVER_REAL.match(bare) or bare in KNOWN_HOSTS:
                continue
            if bare == "github.com" and rest.lstrip("/").startswith(KNOWN_REPOS):
                continue
            unknown.append(f"{path.relative_to(TOP)}: {host}{rest}")
    assert not unknown, "URLs to hosts or repositories not known to exist (add real ones to KNOWN_*):\n" + \
        "\n".join(unknown)


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## What `allow_*` opens\n\nsee [x](page.md#what-allow_-opens), before issue 12 "
                    "and #14 here; `#2` in code is fine\n")
    assert anchors(page) == {"title", "what-allow_-opens"}
    lines = [line for _, line in prose(page.read_text())]
    assert any(ISSUE.search(line) for line in lines)
    assert [m.group() for line in lines for m in HASH_NUMBER.finditer(line)] == ["#14"]
    dead = "Documentation=" + "https" + "://github.com/nobody/diagd"  # split: this file is scanned too
    assert URL.findall(dead) == [("github.com", "/nobody/diagd")]
