"""`diagd tools`: the first sentence of each description, as the table shows it."""

from __future__ import annotations

import pytest

from diagd.daemon.cli.toolscli import first_sentence


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Stop an actor. It releases its resource.", "Stop an actor"),
        ("Fields starting with prefix (e.g. 'ngap.'), optionally with keyword.",
         "Fields starting with prefix (e.g. 'ngap.'), optionally with keyword"),
        ("Cut to layers (e.g. ['nas-5gs']); verbosity=full adds hex. More.",
         "Cut to layers (e.g. ['nas-5gs']); verbosity=full adds hex"),
        ("Set DTR/RTS, i.e. the lines. Then more.", "Set DTR/RTS, i.e. the lines"),
        ("bt, log, kmem etc. run as typed. Cached.", "bt, log, kmem etc. run as typed"),
        ("Works with SDK 2.3 and ngap.procedureCode in file.pcap. Second.",
         "Works with SDK 2.3 and ngap.procedureCode in file.pcap"),
        ("Version 1.32. Next sentence.", "Version 1.32"),
        ("Is it open? Then close it.", "Is it open"),
        ("Contexts. view=procedures: each procedure.", "Contexts"),  # a sentence may start lower-case
        ("No period at all", "No period at all"),
        ("First line. \nSecond line.", "First line"),
        ("A first line\nwith more", "A first line"),
        ("x" * 150, "x" * 99 + "…"),
    ],
)
def test_first_sentence_ends_at_a_sentence_end_not_at_an_abbreviation_or_a_dotted_word(text: str,
                                                                                      expected: str) -> None:
    assert first_sentence(text) == expected
