"""pcap_list_fields' fast paths find exactly the fields the per-field search finds: on Wireshark's
real field catalogue (tshark -G fields) and on small made-up catalogues full of edge cases."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import trio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from diagd.actors._user_regex import Matcher, UserRegex, compile_user_regex
from diagd.actors.pcap.answers.field_search import FieldText, Row, fast_scan, scan_per_field, search_fields
from diagd.actors.pcap.shark.wireshark import Catalogue, read_catalogue
from diagd.protocol.errors import DiagdError, ErrorCode

BUDGET_S = 30.0

# Pieces of patterns: literals that fold in odd ways (ß, U+017F long s, U+212A Kelvin, dotted I,
# micro sign), anchors, classes that can and cannot match a newline, groups, lookarounds, repeats.
TOKENS = [
    "a", "e", "s", "k", "S", "K", "i", "d", "p", "g", "n", ".", "_", "-", " ", "1", "ss", "SS",
    "\u00df", "\u017f", "\u212a", "\u0130", "\u00b5", "\u00b0", "\u2013",
    "^", "$", r"\b", r"\B", r"\A", r"\Z", r"\w", r"\W", r"\d", r"\D", r"\s", r"\S", r"\.", r"\n",
    ".", ".*", ".+", "*", "+", "?", "*?", "{2}", "{1,3}", "|", "(", ")", "(?:", "(?i)", "(?s)", "(?m)",
    "(?-i:", "(?s:", "(?=", "(?!", "(?<=a)", "(?<!e)", r"\1", "[a-z]", "[^a]", "[^\n]", r"[\w.]", r"[\s]",
    "[0-9]", "[^\\W]",
]
patterns = st.lists(st.sampled_from(TOKENS), min_size=1, max_size=7).map("".join)

FOLDING_TEXTS = ["", "a", "A", "ss", "SS", "\u00df", "Stra\u00dfe", "\u017fs", "\u212aelvin", "k", "\u0130d", "id",
                 "\u00b5s", "\u03bcs", "a b", "a.b", "x_1", "-", "e\u2013e", "\u00b0C", "  ", "ngap.id", "NGAP ID"]


def reference(rows: list[Row], user: UserRegex) -> list[Row]:
    return scan_per_field(rows, Matcher(user, BUDGET_S, unit="field"))


def fast(index: FieldText, user: UserRegex) -> list[Row] | None:
    scan = fast_scan(user)
    return None if scan is None else scan(index, Matcher(user, BUDGET_S, unit="field"))


def compiled(pattern: str, *, literal: bool, case_sensitive: bool) -> UserRegex:
    try:
        return compile_user_regex(pattern, literal=literal, case_sensitive=case_sensitive)
    except DiagdError:
        assume(False)
        raise


@pytest.fixture(scope="module")
def real() -> Iterator[tuple[list[Row], FieldText, list[Row], FieldText]]:
    """The whole catalogue, and a sample of it (every 25th field plus every non-ASCII one) for the
    many generated patterns: a per-field scan of all 233k fields takes a second or two."""
    if shutil.which("tshark") is None:
        pytest.skip("tshark is not installed")
    cat = trio.run(read_catalogue)
    index = FieldText.build(cat)
    assert index.text.isascii()  # 1 byte a character
    non_ascii = set(index.non_ascii)
    sample = {name: value for i, (name, value) in enumerate(cat.fields.items()) if i % 25 == 0 or i in non_ascii}
    small = Catalogue(sample, cat.protocols, cat.version)
    yield list(cat.fields.items()), index, list(sample.items()), FieldText.build(small)


CHOSEN = [
    ("ngap", False), ("NGAP", False), ("cause", False), ("Cause Value", False), ("zzzzqq", False), ("e", False),
    ("ss", False), ("\u00df", False), ("\u00b5", False), ("\u00b5s", False), ("\u00b0", False), ("\u2019", False),
    ("k", False), ("\u212a", False), ("\u017f", False), (".", False), ("a.b", False), ("(", False), ("*", False),
    (r"ngap\..*id", True), (r"^sip\.", True), ("cause$", True), (r"\bue\b", True), ("^$", True), ("$", True),
    (r"^\w+\.\w+$", True), (r"(?=\d)\d{3}", True), (r"(a|b)\1", True), (r"id(?!entity)", True),
    (r"(?<=\.)len", True), ("[^a-z]", True), (r"\s", True), (r"\W$", True), ("(?s)x.y", True), ("nas.5gs", True),
    (r"[\u00b5\u00b0]", True), ("gtp[uv]", True), (r"^.{0,3}$", True), ("(?i)IMSI", True), (r"\Aeth", True),
    # minutes on the joined text (tried at every position of every line), 0.04 s per field: found by
    # hypothesis; the joined scan gives way to the per-field one after JOINED_SCAN_S
    (".+.+?aaa", True),
]
CHOSEN_CASES = [(p, r, False) for p, r in CHOSEN] + [
    ("NGAP", False, True), ("ngap", False, True), ("\u00b5", False, True), ("Cause", False, True),
    (r"^sip\.", True, True), (r"\bUE\b", True, True),
]


# The chosen patterns the fast path leaves to the per-field search (they can match across a line break of
# the joined text); for them the search diagd runs (search_fields) is compared instead.
PER_FIELD_ONLY = {("[^a-z]", True, False), (r"\s", True, False), (r"\W$", True, False), ("(?s)x.y", True, False),
                  (r"\Aeth", True, False)}


@pytest.mark.parametrize(("pattern", "is_regex", "case_sensitive"), CHOSEN_CASES)
async def test_the_fast_path_finds_the_same_fields_as_the_per_field_search_on_the_whole_real_catalogue(
        real: tuple[list[Row], FieldText, list[Row], FieldText], pattern: str, is_regex: bool,
        case_sensitive: bool) -> None:
    rows, index, _, _ = real
    user = compile_user_regex(pattern, literal=not is_regex, case_sensitive=case_sensitive)
    want = reference(rows, user)
    found = fast(index, user)
    assert (found is None) == ((pattern, is_regex, case_sensitive) in PER_FIELD_ONLY)
    if found is None:
        cat = Catalogue(dict(rows), {}, "test")
        found = await search_fields(cat, user, Matcher(user, BUDGET_S, unit="field"))
    assert found == want


@pytest.mark.filterwarnings("ignore::FutureWarning")  # the stdlib parser warns about "[[" (nested sets)
def test_the_fast_path_serves_literals_and_line_local_regexes_and_leaves_the_rest_to_the_per_field_search() -> None:
    def path(pattern: str, is_regex: bool = True, case_sensitive: bool = False) -> bool:
        return fast_scan(compile_user_regex(pattern, literal=not is_regex, case_sensitive=case_sensitive)) is not None

    assert path("cause", is_regex=False) and path("\u00df", is_regex=False) and path("a\\s", is_regex=False)
    assert path("ngap", is_regex=False, case_sensitive=True)
    assert path(r"ngap\..*id") and path(r"^sip\.$") and path(r"\bue\b") and path(r"[\w.]+(?=x)")
    for crossing in (r"\s", "[^x]", r"\W", r"\D", "(?s).", "(?s:a.)", r"\Aa", r"a\Z", r"a\n", "(?-m:^a)",
                     "x(?!\\s)", "[[:alpha:]]", "a{e<=1}", r"[\x00-\x7f]"):
        assert not path(crossing), crossing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=patterns, is_regex=st.booleans(), case_sensitive=st.booleans())
@pytest.mark.filterwarnings("ignore::FutureWarning")  # the stdlib parser warns about "[[" (nested sets)
def test_generated_patterns_find_the_same_fields_both_ways_on_a_sample_of_the_real_catalogue(
        real: tuple[list[Row], FieldText, list[Row], FieldText], pattern: str, is_regex: bool,
        case_sensitive: bool) -> None:
    _, _, rows, index = real
    user = compiled(pattern, literal=not is_regex, case_sensitive=case_sensitive)
    found = fast(index, user)
    if found is not None:
        assert found == reference(rows, user)


@settings(max_examples=500, deadline=None)
@given(pattern=patterns, is_regex=st.booleans(), case_sensitive=st.booleans(),
       texts=st.lists(st.tuples(st.sampled_from(FOLDING_TEXTS), st.sampled_from(FOLDING_TEXTS)),
                      min_size=1, max_size=8))
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_generated_patterns_find_the_same_fields_both_ways_on_made_up_catalogues(
        pattern: str, is_regex: bool, case_sensitive: bool, texts: list[tuple[str, str]]) -> None:
    fields = {f"{name}#{i}": (desc, "FT_NONE", "p") for i, (name, desc) in enumerate(texts)}
    index = FieldText.build(Catalogue(fields, {}, "test"))
    user = compiled(pattern, literal=not is_regex, case_sensitive=case_sensitive)
    found = fast(index, user)
    if found is not None:
        assert found == reference(list(fields.items()), user)


async def test_a_spent_budget_on_the_fast_path_is_the_same_timeout_naming_a_field(
        real: tuple[list[Row], FieldText, list[Row], FieldText]) -> None:
    _, _, rows, _ = real
    cat = Catalogue(dict(rows), {}, "test")
    user = compile_user_regex(r"(a+)+$", literal=False)
    assert fast_scan(user) is not None
    with pytest.raises(DiagdError) as info:
        await search_fields(cat, user, Matcher(user, 0.0, unit="field", total=len(rows)))
    assert info.value.code is ErrorCode.TIMEOUT and info.value.details["stopped_at"] == {"field": 1}
    assert info.value.details["setting"] == "[daemon] regex_budget_s"


async def test_a_protocol_filter_and_the_empty_query_give_what_the_per_field_search_gives(
        real: tuple[list[Row], FieldText, list[Row], FieldText]) -> None:
    _, _, rows, _ = real
    cat = Catalogue(dict(rows), {}, "test")
    for query, protocols in (("", set()), ("", {"ngap", "sip"}), ("id", {"ngap"}), (r"^\w+$", {"frame"})):
        user = compile_user_regex(query, literal=False)
        got = await search_fields(cat, user, Matcher(user, BUDGET_S, unit="field"), protocols=protocols)
        assert got == scan_per_field(rows, Matcher(user, BUDGET_S, unit="field"), protocols)
