"""pcap_list_fields and pcap_fields_search, run in-process on the real catalogue, equal the `tshark -G fields`
lines filtered independently (tests/support/pcap_oracle.py and Python's `re`, not diagd's search code)."""

from __future__ import annotations

import re
import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from diagd.actors.pcap.shark.facts import Wireshark
from diagd.actors.pcap.tools import fields_search, list_fields
from tests.support import pcap_oracle as oracle

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

LIMIT = 2000
# What the two tools read of the back end: its config and its catalogue (read once for every test here).
BACKEND = SimpleNamespace(runtime=SimpleNamespace(config=lambda: SimpleNamespace(regex_budget_s=30.0)),
                          catalogue=Wireshark().catalogue)

# Literals and regexes over names and descriptions, each way of matching case, with and without a
# protocol filter; some match thousands of fields (truncated at the limit), some none.
LIST_QUERIES: list[dict[str, Any]] = [
    {"query": q, **case, **protos}
    for q in ("cause", "TEID", "Session-Id", "ngap.", "IMSI", "5gmm", "response in", "qfi", "e", "zz_never_zz")
    for case in ({}, {"case_sensitive": True})
    for protos in ({}, {"include_protocols": ["ngap", "nas-5gs", "pfcp", "diameter"]})
] + [
    {"query": q, "is_regex": True, **case, **protos}
    for q in (r"^pfcp\.(seid|cause)", r"response.?in$", r"\bTEID\b", r"^nas_5gs\.mm\.[a-z]+_cause",
              r"(?i)ue.ngap.id", r"[0-9]{3}", r"^$", r"sst|sd$")
    for case in ({}, {"case_sensitive": True})
    for protos in ({}, {"include_protocols": ["ngap", "nas-5gs", "pfcp", "diameter", "sctp"]})
] + [{"query": "", "include_protocols": [p]} for p in ("sctp", "ngap", "nas-5gs", "no-such-protocol")]

SEARCH_QUERIES: list[dict[str, Any]] = [
    {"prefix": p, "keyword": k}
    for p in ("ngap.", "nas_5gs.mm.", "pfcp.", "sctp.assoc", "http2.headers.", "diameter.", "ip.", "zzz.nothing.")
    for k in ("", "cause", "SEID", "Id", "path")
]


def listed(query: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The list_fields matches: name or description holds the query (a regex with is_regex; in any
    case unless case_sensitive), of the protocols asked for, in catalogue order."""
    text = query["query"] if query.get("is_regex") else re.escape(query["query"])
    pattern = re.compile(text, 0 if query.get("case_sensitive") else re.IGNORECASE)
    protocols = set(query.get("include_protocols", []))
    return [row for row in oracle.field_catalogue()
            if (not protocols or row[3] in protocols) and (pattern.search(row[0]) or pattern.search(row[1]))]


def searched(query: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The fields_search matches: the name starts with the prefix, and name or description holds the
    keyword in any case, in catalogue order."""
    keyword = query["keyword"].lower()
    return [row for row in oracle.field_catalogue() if row[0].startswith(query["prefix"])
            and (keyword in row[0].lower() or keyword in row[1].lower())]


@pytest.mark.parametrize("query", LIST_QUERIES, ids=repr)
def test_list_fields_equals_the_glossary_filtered(query: dict[str, Any]) -> None:
    args = {"query": "", "is_regex": False, "case_sensitive": False, "limit": LIMIT, "include_protocols": [],
            **query}
    answer = trio.run(list_fields, BACKEND, None, args)
    expected = listed(query)
    assert answer["total"] == len(expected) and answer["truncated"] == (len(expected) > LIMIT)
    assert [(f["name"], f["description"], f["type"], f["protocol"]) for f in answer["fields"]] == expected[:LIMIT]


@pytest.mark.parametrize("query", SEARCH_QUERIES, ids=repr)
def test_fields_search_equals_the_glossary_filtered(query: dict[str, Any]) -> None:
    answer = trio.run(fields_search, BACKEND, None, {"limit": LIMIT, **query})
    expected = searched(query)
    assert answer["total"] == len(expected) and answer["truncated"] == (len(expected) > LIMIT)
    assert [(f["name"], f["description"], f["type"]) for f in answer["fields"]] == [r[:3] for r in expected[:LIMIT]]


def test_the_queries_find_something() -> None:
    """Most queries match (an all-empty comparison would prove nothing), some hit the limit."""
    sizes = [len(listed(q)) for q in LIST_QUERIES] + [len(searched(q)) for q in SEARCH_QUERIES]
    assert sum(1 for s in sizes if s) > 0.7 * len(sizes) and any(s > LIMIT for s in sizes)
