"""The docs hold together: a short README that guides, links and anchors that resolve, no tracker numbers.

README.md is a guide (at most 250 lines) whose first lines are the two setup commands, with the
`pipx install` / `uv tool install` path beside them; CI runs exactly the test command it gives. The
reference lives in docs/ (one file per topic). In README.md, docs/*.md and the other READMEs: every
relative link points at a file that exists, and a `#fragment` at a heading of that file (GitHub's
anchor rules); no internal issue numbers ("issue 13", "#14"), which mean nothing to a reader; and
no http(s) URL anywhere in the repository names a host or repository not known to exist (a made-up
GitHub repository in a unit's Documentation= was such a dead link).

Numbers the docs take from the code or the bench cannot drift: the `tools/list` size table is
recomputed from a real daemon's registry; every list of back ends or tool groups names them all;
every config block and defaults table gives real settings at their defaults; limits, timeouts,
protocol versions and error codes the pages state are generated from the code's constants here;
docs/benchmarks.md is one table of today's figures, short cells each with the date of its run, and
names every bench script; docs/testing.md gives no count or time without the date it was measured.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from diagd.actors import _user_regex, heap
from diagd.actors.bpftrace import backend as bpftrace_backend
from diagd.actors.bpftrace.settings import BpftraceSettings
from diagd.actors.capture import recording
from diagd.actors.capture.settings import CaptureSettings
from diagd.actors.crash import messages as crash_messages
from diagd.actors.crash import sessions as crash_sessions
from diagd.actors.crash.settings import CrashSettings
from diagd.actors.pcap.engine import session as pcap_session
from diagd.actors.pcap.settings import PcapSettings
from diagd.actors.pcap.warm import standby
from diagd.actors.serial.settings import SerialConfig
from diagd.daemon import config as config_mod
from diagd.daemon import discovery
from diagd.daemon.config import DaemonConfig, McpConfig
from diagd.daemon.http_settings import HttpConfig
from diagd.daemon.server import audit, control_server, eras, heap_trim
from diagd.daemon.server import tools as registry
from diagd.daemon.server.mcp import lines as mcp_lines
from diagd.daemon.tool_groups import BUILTIN
from diagd.protocol.errors import ErrorCode
from tests import module_times
from tests.support import listed_tools
from tests.test_structure import MAX_FUNCTION_LINES, MAX_MODULE_LINES

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


# -- Numbers that come from the code ---------------------------------------------------------------
# A figure a page states that the code or a measurement decides is either recomputed here or
# generated from the code below, so that changing the code without the page fails.

BENCHMARKS = TOP / "docs" / "benchmarks.md"
Measured = dict[str, dict[str, listed_tools.Listed]]  # "off" / "on" (capture), then per selection
CAPTURE_ON = {"capture": {"allowed_interfaces": ["lo"]}}  # without it the capture group lists no tools
SIZE_HEADER = ["`diagd mcp --tools`", "tools", "to the model", "`tools/list`", "instructions"]
SLACK_KIB = 0.2  # what benchmarks.md allows a size cell to be off by (a reworded description, not a new tool)
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def tables(text: str) -> Iterator[list[list[str]]]:
    """Each Markdown table outside code blocks: its rows (header first, the --- row dropped) as cells."""
    rows: list[list[str]] = []
    for _, line in [*prose_raw(text), (0, "")]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            yield rows
            rows = []


def prose_raw(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code kept."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, line


def flat(text: str) -> str:
    """The text with every run of whitespace (line breaks included) as one space."""
    return re.sub(r"\s+", " ", text)


def binary(n: int) -> str:
    """16777216 -> '16 MiB': how the docs write a power-of-two size."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n % scale == 0:
            return f"{n // scale} {unit}"
    raise AssertionError(f"{n} bytes is not a whole number of KiB")


def kib(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d)?) KiB", text)
    assert match, f"{text!r}: a size is written '12.3 KiB'"
    return float(match.group(1))


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> Measured:
    """What a client reads per group, capture off (as bench/tools_list.py's daemon) and on."""
    return {"off": listed_tools.measure({}, tmp_path_factory.mktemp("off")),
            "on": listed_tools.measure(CAPTURE_ON, tmp_path_factory.mktemp("on"))}


def expected_row(label: str, listed: Measured) -> listed_tools.Listed | None:
    if label == "(every group)":
        return listed["off"][listed_tools.ALL]
    if label == "(every group, capture on)":
        return listed["on"][listed_tools.ALL]
    match = re.match(r"`(\w+)`", label)
    if match is None:
        return None
    group = match.group(1)
    return listed["off"].get(group) or listed["on"].get(group)


def test_the_daemon_loads_every_installed_back_end_as_a_group(listed: Measured) -> None:
    assert set(listed["on"]) - {listed_tools.ALL} == {b.name for b in discovery.installed()} | {BUILTIN}


def test_every_tools_list_size_table_matches_the_registry(listed: Measured) -> None:
    """benchmarks.md's "Tool list size" (and any copy of it): the tool count exactly, the sizes within
    SLACK_KIB of what a real daemon's registry serializes to (tests/support/listed_tools.py): what
    reaches the model (each tool's name, description and inputSchema: the budgets' measure), the
    whole tools/list result (output schemas included) and the instructions."""
    wrong, found = [], 0
    for page in PAGES:
        name = page.relative_to(TOP)
        for table in tables(page.read_text()):
            if table[0][0] != SIZE_HEADER[0]:
                continue
            found += 1
            if table[0] != SIZE_HEADER:
                wrong.append(f"{name}: columns {table[0]}, not {SIZE_HEADER} (no other column can be recomputed)")
                continue
            labels = [row[0] for row in table[1:]]
            want = {"(every group)", "(every group, capture on)"} | {f"`{g}`" for g in listed["on"]
                                                                      if g != listed_tools.ALL}
            missing = sorted(w for w in want if not any(label.split(" (")[0] == w or label == w for label in labels))
            if missing:
                wrong.append(f"{name}: no row for {', '.join(missing)}")
            for label, tools, *sizes in (row[:5] for row in table[1:]):
                real = expected_row(label, listed)
                if real is None:
                    wrong.append(f"{name}: row {label!r} names no group")
                    continue
                kb = [round(n / 1024, 1) for n in (real.model, real.whole, real.instructions)]
                off = [round(abs(kib(size) - k), 1) for size, k in zip(sizes, kb, strict=True)]
                if int(tools) != real.tools or max(off) > SLACK_KIB:
                    wrong.append(f"{name}: {label}: | {tools} | {' | '.join(sizes)} |, the code gives "
                                 f"| {real.tools} | {' | '.join(f'{k} KiB' for k in kb)} |")
    assert found, "benchmarks.md lost its tool list size table"
    assert not wrong, "\n".join(wrong)


def constant(path: Path, name: str) -> Any:
    """The value of a module-level constant, read from the source without importing it (a test module
    or a bench script, which imports what is beside it)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                names = [t.id for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                         if isinstance(t, ast.Name)]
                if name in names:
                    value = eval(compile(ast.Expression(node.value), str(path), "eval"))  # our own source
                    return value[names.index(name)] if isinstance(target, ast.Tuple) else value
    raise AssertionError(f"{path.relative_to(TOP)} has no {name}")


def test_the_tools_list_budgets_the_docs_give_are_the_ones_enforced() -> None:
    e2e = TOP / "tests" / "e2e" / "test_tool_groups.py"
    full, pcap = constant(e2e, "FULL_BUDGET"), constant(e2e, "PCAP_BUDGET")
    assert constant(TOP / "bench" / "tools_list.py", "BUDGETS") == {"all": full, "pcap": pcap}
    assert f"{binary(full)} for every back end, {binary(pcap)} for `pcap`" in flat(BENCHMARKS.read_text())


# A list of three or more back ends names them all, but for the groups a recording reads, said of one.
NAME = r"`?(?:actors/)?(?:{names})/?`?"
SEP = r"(?:\s*,\s*(?:or\s+|and\s+)?|\s+or\s+|\s+and\s+|\s*/\s*|\s*\+\s*|\s{2,})"


def back_end_lists(text: str, names: list[str]) -> Iterator[tuple[int, str, set[str], str]]:
    """(line number, line, the back ends of a list of three or more on it, its paragraph)."""
    one = NAME.format(names="|".join(names))
    pattern = re.compile(rf"(?<![\w./-]){one}(?:{SEP}{one}){{2,}}(?![\w-])")
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        for match in pattern.finditer(line):
            first = next((n for n in range(number - 1, 0, -1) if not lines[n - 1].strip()), 0)
            last = next((n for n in range(number, len(lines) + 1) if not lines[n - 1].strip()), len(lines) + 1)
            paragraph = "\n".join(lines[first:last - 1])
            yield number, line, set(re.findall(rf"\b(?:{'|'.join(names)})\b", match.group())), paragraph


def test_every_list_of_back_ends_or_groups_names_all_of_them() -> None:
    names = sorted(b.name for b in discovery.installed())
    recorded = {recording.CAPTURE_GROUP, recording.PCAP_GROUP, recording.SERIAL_GROUP, recording.BPFTRACE_GROUP}
    short = []
    for page in PAGES:
        for number, line, found, paragraph in back_end_lists(page.read_text(), names):
            where = f"{page.relative_to(TOP)}:{number}: {line.strip()}"
            if found == set(names):
                if re.search(r"\bgroups?\b", line) and f"`{BUILTIN}`" not in paragraph:
                    short.append(f"{where} (the groups: say `{BUILTIN}` is one too)")
            elif not (found <= recorded and "record" in line):
                short.append(f"{where} (lacks {', '.join(sorted(set(names) - found))})")
    assert not short, "a list of back ends or tool groups lacks some:\n" + "\n".join(short)


def test_the_back_end_list_check_finds_lists() -> None:
    names = ["bpftrace", "capture", "crash", "pcap", "serial"]
    text = ("groups: `pcap`, `serial`, `bpftrace`, `crash` here\n actors/pcap   actors/serial   actors/crash\n"
            "captures, serial logs, bpftrace and crash merged\n")
    assert [(n, f) for n, _, f, _ in back_end_lists(text, names)] == [
        (1, {"pcap", "serial", "bpftrace", "crash"}), (2, {"pcap", "serial", "crash"})]


def bench_scripts() -> set[str]:
    return {p.name for p in (TOP / "bench").glob("*.py") if not p.name.startswith("_")}


def test_benchmarks_names_every_bench_script_and_only_real_ones() -> None:
    text = BENCHMARKS.read_text()
    commands = {m for line in code_blocks(text)[0] for m in re.findall(r"bench/(\w+\.py)", line)}
    assert commands == bench_scripts(), "benchmarks.md's command block lists each bench/ script once"
    named = set(re.findall(r"bench/(\w+\.py)", text))
    named |= {script for row in todays_figures() for script in re.findall(r"^`(\w+\.py)", row[1])}
    assert named <= bench_scripts(), named - bench_scripts()


def todays_figures() -> list[list[str]]:
    section = BENCHMARKS.read_text().split("## Today's figures", 1)[1].split("\n## ", 1)[0]
    found = list(tables(section))
    assert len(found) == 1, "benchmarks.md's today's figures are one table"
    assert found[0][0] == ["what", "bench", "diagd", "vs", "ratio", "target", "run"]
    return found[0][1:]


def test_todays_figures_are_short_and_dated() -> None:
    """One figure per row: short cells (history goes to git, not into the cell) and the date of its run."""
    long = [f"{cell[:60]}... ({len(cell)} characters)" for row in todays_figures() for cell in row if len(cell) > 80]
    undated = [row[0] for row in todays_figures() if not re.search(r"\b20\d\d-\d\d-\d\d$", row[-1])]
    assert not long, "benchmarks.md cells of at most 80 characters:\n" + "\n".join(long)
    assert not undated, f"rows without the date of their run: {undated}"


def test_testing_md_gives_no_undated_count_or_duration() -> None:
    """A test count or a wall time drifts with every change: testing.md gives one only with the date it
    was measured (the run itself prints today's)."""
    undated = []
    for paragraph in re.split(r"\n\s*\n", (TOP / "docs" / "testing.md").read_text()):
        if (re.search(r"\b\d[\d,]*\s+(?:tests|test functions)\b|\b\d+\s*(?:min|minutes?|h)\b|quarter of an hour|"
                      r"\bhours?\b", paragraph)
                and not re.search(r"measured (?:on )?20\d\d-\d\d-\d\d", paragraph)):
            undated.append(flat(paragraph)[:120])
    assert not undated, "\n".join(undated)


def test_testing_md_gives_the_pytest_options_setup_sh_runs() -> None:
    setup = (TOP / "scripts" / "setup.sh").read_text()
    match = re.search(r'pytest -q -n "\$\{DIAGD_TEST_WORKERS:-(\d+)\}" --dist (\w+)', setup)
    assert match, "scripts/setup.sh's pytest line changed: update this test and docs/testing.md"
    workers, dist = match.groups()
    testing = flat((TOP / "docs" / "testing.md").read_text())
    assert f"`-n {workers} --dist {dist}`" in testing and f"on {WORDS[int(workers)]} workers" in testing


# Examples a config block shows on purpose, each with its default in its comment.
CONFIG_EXAMPLES = {("capture", "allowed_interfaces"), ("pcap", "allowed_dirs"), ("pcap", "output_dir"),
                   ("pcap", "packet_list_columns"), ("http", "listen")}


def settings_tables() -> dict[str, type]:
    return {"daemon": DaemonConfig, "mcp": McpConfig, "http": HttpConfig, "pcap": PcapSettings,
            "serial": SerialConfig, "bpftrace": BpftraceSettings, "crash": CrashSettings,
            "capture": CaptureSettings}


def defaults(cls: type) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def test_every_config_block_gives_real_settings_at_their_defaults() -> None:
    tables_ = settings_tables()
    assert {b.name for b in discovery.installed()} | set(config_mod.OWN_TABLES) == set(tables_)
    wrong = []
    for page in DOCS:
        for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S):
            for table, keys in tomllib.loads(block).items():
                assert table in tables_, f"{page.name}: [{table}] is no config table"
                known = defaults(tables_[table])
                for key, value in keys.items():
                    if key not in known:
                        wrong.append(f"{page.name}: [{table}] {key} is not a setting")
                    elif not isinstance(value, dict) and (table, key) not in CONFIG_EXAMPLES and value != known[key]:
                        wrong.append(f"{page.name}: [{table}] {key} = {value!r}, the default is {known[key]!r}")
    assert not wrong, "\n".join(wrong)


def literal(text: str) -> Any:
    """A default as the docs write it: `"x"` or `x` (a string), true/false, a number, '16 MiB'."""
    text = text.strip()
    size = re.fullmatch(r"(\d+) (KiB|MiB|GiB)", text)
    if size:
        return int(size.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[size.group(2)]
    text = text.strip("`")
    if text.startswith('"'):
        return json.loads(text)
    return {"true": True, "false": False}.get(text, json.loads(text.split()[0]) if text[:1].isdigit() else text)


def test_the_bpftrace_defaults_table_and_the_crash_keys_give_the_code_defaults() -> None:
    wrong = []
    bpftrace = defaults(BpftraceSettings)
    table = next(t for t in tables((TOP / "docs" / "bpftrace.md").read_text()) if t[0][0] == "`[bpftrace]` key")
    for keys, values, *_ in table[1:]:
        split = r"\s*(?:/|,)\s*"
        for key, value in zip(re.split(split, keys), re.split(split, values), strict=True):
            if literal(value) != bpftrace[key.strip("`")]:
                wrong.append(f"bpftrace.md: {key} = {value}, the default is {bpftrace[key.strip('`')]!r}")
    crash = defaults(CrashSettings)
    text = flat((TOP / "docs" / "crash.md").read_text())
    paragraph = text.split("`[crash]` keys:", 1)[1].split("`diagd reload`", 1)[0]
    named = set()
    for keys, value in re.findall(r"((?:`\w+`(?: / )?)+) \(([^)]*)\)", paragraph):
        value = re.split(r"[:;]", value)[0]
        for key in re.findall(r"`(\w+)`", keys):
            named.add(key)
            if not value.startswith("default") and literal(value) != crash[key]:
                wrong.append(f"crash.md: {key} ({value}), the default is {crash[key]!r}")
    assert named >= {k for k, v in crash.items() if isinstance(v, int | float) and not isinstance(v, bool)}, \
        "crash.md gives every numeric [crash] default"
    assert not wrong, "\n".join(wrong)


def claims() -> list[tuple[str, str]]:
    """(page, phrase): each phrase is made from the code's value and must appear in the page (whitespace
    and line breaks aside). Changing the value without the page fails here."""
    d, b, c, p = DaemonConfig(), BpftraceSettings(), CrashSettings(), PcapSettings()
    s, h = SerialConfig(), HttpConfig()
    assert control_server.SMALL_FRAME_BYTES == mcp_lines.SMALL_PARTIAL_BYTES  # one figure for both
    spawn = ", ".join(f"`{k}`" for k in crash_messages.SPAWN_SETTINGS)
    return [
        ("configuration.md", f"control frames and MCP lines over {binary(mcp_lines.SMALL_PARTIAL_BYTES)} share"),
        ("configuration.md", f"are at most {_user_regex.MAX_PATTERN_CHARS} characters long"),
        ("operations.md", f"{audit.RECENT_CALLS} calls and {binary(audit.RECENT_BYTES)} of their arguments"),
        ("operations.md", f"the latest {audit.DURATIONS_PER_TOOL:,} per tool"),
        ("operations.md", f"| {audit.MAX_TOOL_NAMES} tool names;"),
        ("operations.md", f"`[daemon] audit_max_bytes` ({binary(d.audit_max_bytes)})"),
        ("operations.md", f"strings cut at {registry.AUDIT_MAX_CHARS:,} characters"),
        ("operations.md", f"`[daemon] max_connections` ({d.max_connections})"),
        ("operations.md", f"{h.max_sessions_per_token} per token, {h.max_sessions} in all"),
        ("operations.md", f"`max_concurrent` ({b.max_concurrent}) running"),
        ("operations.md", f"`keep_executions` ({b.keep_executions}) on disk"),
        ("operations.md", f"{bpftrace_backend.LISTINGS_MAX} filters, each for `probe_cache_s` ({b.probe_cache_s:g} s)"),
        ("operations.md", f"{binary(pcap_session.CACHE_BUDGET)} per capture, pickled; "
                          f"`[pcap] max_loaded` ({p.max_loaded})"),
        ("operations.md", f"`max_sessions` ({c.max_sessions}) open, {crash_sessions.MAX_RECORDS} records"),
        ("operations.md", f"`urc_max_packets` ({s.urc_max_packets}) and `urc_max_bytes` ({binary(s.urc_max_bytes)})"),
        ("benchmarks.md", f"`CACHE_BUDGET` in `actors/pcap/engine/session.py`: {binary(pcap_session.CACHE_BUDGET)} "
                          "per capture"),
        ("benchmarks.md", f"{WORDS[heap.ARENA_MAX]} arenas; `daemon/server/heap_trim.py`: `malloc_trim` "
                          f"{heap_trim.QUIET_S:g} s after the last call"),
        ("benchmarks.md", f"`max_memory_mb` ({p.max_memory_mb}) in all"),
        ("pcap.md", f"{WORDS[standby.MAX_STANDBYS]} argvs are kept warm at most"),
        ("pcap.md", f"at most {standby.MAX_STANDBYS} argvs, a text one {standby.TEXT_DEPTH})"),
        ("pcap.md", f"keeps {WORDS[standby.TEXT_DEPTH]} waiting and replaces them {standby.TEXT_REPLACE_AFTER_S:g} s "
                    "after a run"),
        ("pcap.md", f"the next one starts {standby.REPLACE_AFTER_S:g} s later"),
        ("security.md", f"`[crash] scratch_mb` ({c.scratch_mb})"),
        ("crash.md", f"the {WORDS[len(crash_messages.SPAWN_SETTINGS)]} built into a session's processes when "
                     f"they start ({spawn})"),
        ("mcp-protocol.md", f"| handshake | {', '.join(eras.HANDSHAKE)} |"),
        ("mcp-protocol.md", f"| envelope | {', '.join(eras.ENVELOPE)} |"),
        ("mcp-protocol.md", f"gets `{eras.LATEST_HANDSHAKE}`, the newest handshake version"),
        ("mcp-protocol.md", f"`{eras.HEADER_MISMATCH}` `HeaderMismatch`"),
        ("mcp-protocol.md", f'`{eras.UNSUPPORTED_PROTOCOL_VERSION}` "Unsupported protocol version"'),
        ("mcp-protocol.md", f"`{json.dumps(list(eras.ADVERTISED))}`"),
        ("testing.md", f"its {WORDS[module_times.SHOWN]} slowest modules"),
        ("testing.md", f"{MAX_MODULE_LINES} lines a module and {MAX_FUNCTION_LINES} a function"),
        ("testing.md", f"a guide of at most {MAX_README_LINES} lines"),
        ("architecture.md", f"to {MAX_MODULE_LINES} lines and every function to {MAX_FUNCTION_LINES}"),
    ]


def test_the_docs_give_the_codes_values() -> None:
    missing = [f"docs/{page}: {phrase!r}" for page, phrase in claims()
               if phrase not in flat((TOP / "docs" / page).read_text())]
    assert not missing, "the page no longer says what the code does (update the page):\n" + "\n".join(missing)


def test_every_error_code_is_documented_and_every_listed_code_exists() -> None:
    text = flat("\n".join(p.read_text() for p in [README, *DOCS]))
    codes = {str(c) for c in ErrorCode}
    assert [c for c in sorted(codes) if not re.search(rf"\b{c}\b", text)] == []
    listed = re.search(r"a stable code \(([^)]*)\)", flat((TOP / "docs" / "architecture.md").read_text()))
    assert listed, "architecture.md lists the stable codes"
    assert set(re.findall(r"`([A-Z_]+)`", listed.group(1))) - codes == set()
