"""The procedure rule table (actors/pcap/ngap/rules.py) against TS 24.501 / TS 38.413, written out again here.

Each way a procedure ends is typed below from the specifications: the procedure, the outcome, the clause
that defines it and the message(s) that end it, named as the specs (and Wireshark) name them. The numbers
behind those names come from Wireshark (`tshark -G values`: NAS message types, NGAP procedure codes, the
NGAP-PDU choice), never from diagd; `tshark -G decodes` says which NGAP procedures have a successful or an
unsuccessful outcome at all. Outcome words: `success`; `reject` when the network refuses what the UE asked
(a REJECT message from the network); `failure` when the UE refuses a network command or the procedure
breaks down (a UE's FAILURE / COMMAND REJECT, 5GMM STATUS, an NGAP unsuccessfulOutcome, a release);
`incomplete` when no terminal message came.
"""

from __future__ import annotations

import itertools
import re
import shutil

import pytest

from diagd.actors.pcap.ngap import rules
from diagd.actors.pcap.ngap.rules import RULES, TABLE, Rule, ending
from tests.support import wireshark_names

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")

MM, SM = "nas_5gs.mm.message_type", "nas_5gs.sm.message_type"
REG, AUTH, SMC, SR, DEREG = "Registration", "Authentication", "Security Mode", "Service Request", "Deregistration"
EST, MOD, REL = "PDU Session Establishment", "PDU Session Modification", "PDU Session Release"
HO_PREP, HO_ALLOC, PATH, UE_REL = ("Handover Preparation", "Handover Resource Allocation", "Path Switch",
                                   "UE Context Release")
ICS, RES_SETUP, RES_MODIFY, RES_RELEASE = ("Initial Context Setup", "PDU Session Resource Setup",
                                           "PDU Session Resource Modify", "PDU Session Resource Release")
REACT, RESET, PAGING = "PDU Session Re-activation", "NG Reset", "Paging"
# Every procedure diagd models (docs/5g.md), plus the wildcard of the "no terminal message" rows.
PROCEDURES = (REG, AUTH, SMC, SR, DEREG, EST, MOD, REL, HO_PREP, HO_ALLOC, PATH, UE_REL, ICS, RES_SETUP, RES_MODIFY,
              RES_RELEASE, REACT, RESET, PAGING)


class Nas:
    """A NAS message by its Wireshark name; `returned`: handed back by the AMF unforwarded (TS 24.501 5.4.5.2.5)."""

    def __init__(self, field: str, name: str, returned: bool = False) -> None:
        self.field, self.name, self.returned = field, name, returned

    def key(self) -> str:
        layer = {MM: "5GMM", SM: "5GSM"}[self.field]
        return f"{layer} 0x{wireshark_names.code(self.field, self.name):02x}" + (" returned" if self.returned else "")

    def words(self) -> str:  # the message as the specs print it: REGISTRATION ACCEPT
        return re.sub(r" \(UE (originating|terminated)\)$", "", self.name).upper()


class Ngap:
    """An NGAP message: its elementary procedure (Wireshark's id- name) and its NGAP-PDU choice, named by TS 38.413."""

    def __init__(self, procedure: str, outcome: str, message: str) -> None:
        self.procedure, self.outcome, self.message = procedure, outcome, message

    def key(self) -> str:
        return (f"NGAP {wireshark_names.code('ngap.procedureCode', self.procedure)}/"
                f"{wireshark_names.code('ngap.NGAP_PDU', self.outcome)}")

    def words(self) -> str:
        return self.message


# rule id: (procedure, outcome, clause, the messages that end it this way, words its text says when no message does)
SPEC: dict[str, tuple[str, str, str, tuple[Nas | Ngap, ...], str]] = {
    # TS 24.501 5.5.1.2: initial registration, accepted (5.5.1.2.4) or not (5.5.1.2.5); an AUTHENTICATION REJECT
    # (5.4.1.3.5) aborts it too. The accept must reach the UE: inside an InitialContextSetupRequest it is lost with
    # the InitialContextSetupFailure (TS 38.413 8.3.1.3); one that assigns a new 5G-GUTI is acknowledged by the UE's
    # REGISTRATION COMPLETE (5.5.1.2.4), and without one the procedure is not complete.
    "registration-accept": (REG, "success", "TS 24.501 5.5.1.2.4", (Nas(MM, "Registration accept"),),
                            "no new 5G-GUTI"),
    "registration-complete": (REG, "success", "TS 24.501 5.5.1.2.4", (Nas(MM, "Registration complete"),), ""),
    "registration-accept-undelivered": (REG, "failure", "TS 38.413 8.3.1.3 / TS 24.501 5.5.1.2.4", (),
                                        "InitialContextSetupFailure"),
    # TS 38.413 8.6.4: a NAS NON DELIVERY INDICATION returns the downlink NAS-PDU the NG-RAN node could not deliver:
    # the accept a DownlinkNASTransport carried never reached the UE (the registration 5.5.1.2.4, the service request
    # 5.6.1.4 and the establishment 6.4.1.3 are not accepted by the UE).
    "registration-accept-non-delivery": (REG, "failure", "TS 38.413 8.6.4 / TS 24.501 5.5.1.2.4", (),
                                         "NAS NON DELIVERY INDICATION"),
    "service-accept-non-delivery": (SR, "failure", "TS 38.413 8.6.4 / TS 24.501 5.6.1.4", (),
                                    "NAS NON DELIVERY INDICATION"),
    "pdu-accept-non-delivery": (EST, "failure", "TS 38.413 8.6.4 / TS 24.501 6.4.1.3", (),
                                "NAS NON DELIVERY INDICATION"),
    "registration-complete-missing": (REG, "incomplete", "TS 24.501 5.5.1.2.4", (), "no REGISTRATION COMPLETE"),
    "registration-reject": (REG, "reject", "TS 24.501 5.5.1.2.5", (Nas(MM, "Registration reject"),), ""),
    "registration-auth-reject": (REG, "reject", "TS 24.501 5.4.1.3.5", (Nas(MM, "Authentication reject"),), ""),
    # 5.4.1.3: 5G AKA. Response by the UE (5.4.1.3.3), not accepted by the network (5.4.1.3.5) or by the UE (5.4.1.3.6).
    "authentication-response": (AUTH, "success", "TS 24.501 5.4.1.3.3", (Nas(MM, "Authentication response"),), ""),
    "authentication-reject": (AUTH, "reject", "TS 24.501 5.4.1.3.5", (Nas(MM, "Authentication reject"),), ""),
    "authentication-failure": (AUTH, "failure", "TS 24.501 5.4.1.3.6", (Nas(MM, "Authentication failure"),), ""),
    # 5.4.2: security mode command accepted (5.4.2.3) or not accepted (5.4.2.5) by the UE.
    "security-mode-complete": (SMC, "success", "TS 24.501 5.4.2.3", (Nas(MM, "Security mode complete"),), ""),
    "security-mode-reject": (SMC, "failure", "TS 24.501 5.4.2.5", (Nas(MM, "Security mode reject"),), ""),
    # 5.6.1: service request accepted (5.6.1.4) or not accepted (5.6.1.5) by the network.
    "service-accept": (SR, "success", "TS 24.501 5.6.1.4", (Nas(MM, "Service accept"),), "delivered"),
    "service-accept-undelivered": (SR, "failure", "TS 38.413 8.3.1.3 / TS 24.501 5.6.1.4", (),
                                   "InitialContextSetupFailure"),
    "service-reject": (SR, "reject", "TS 24.501 5.6.1.5", (Nas(MM, "Service reject"),), ""),
    # 5.5.2: UE-initiated de-registration completion (5.5.2.2.2), network-initiated completion by the UE (5.5.2.3.2);
    # a switch-off de-registration gets no accept (5.5.2.2.1).
    "deregistration-accept": (DEREG, "success", "TS 24.501 5.5.2.2.2 / 5.5.2.3.2",
                              (Nas(MM, "Deregistration accept (UE originating)"),
                               Nas(MM, "Deregistration accept (UE terminated)")), ""),
    "deregistration-switch-off": (DEREG, "success", "TS 24.501 5.5.2.2.1", (), "switch-off"),
    # The establishment: 24.501 6.4.1 (accepted 6.4.1.3, not accepted 6.4.1.4); the accept rides in an N2 request
    # whose response sets the session up (TS 38.413 8.2.1.2 PDU Session Resource Setup, 8.3.1.2 Initial Context
    # Setup), or lists it as failed (8.2.1.2, InitialContextSetupFailure 8.3.1.3); a UE context release before
    # that (38.413 8.3.2 / 8.3.3); the AMF hands the request back unforwarded (24.501 5.4.5.2.5); 5GMM STATUS
    # (24.501 8.2.29).
    "pdu-setup-response": (EST, "success", "TS 38.413 8.2.1.2", (), "PDUSessionResourceSetupResponse"),
    "pdu-initial-context-setup": (EST, "success", "TS 38.413 8.3.1.2", (), "InitialContextSetupResponse"),
    "pdu-reject": (EST, "reject", "TS 24.501 6.4.1.4", (Nas(SM, "PDU session establishment reject"),), ""),
    "pdu-returned": (EST, "reject", "TS 24.501 5.4.5.2.5", (Nas(MM, "DL NAS transport", returned=True),), ""),
    "pdu-5gmm-status": (EST, "failure", "TS 24.501 8.2.29", (Nas(MM, "5GMM status"),), ""),
    "pdu-setup-failed": (EST, "failure", "TS 38.413 8.2.1.2 / 8.3.1.3", (), "failed to set up"),
    "pdu-context-released": (EST, "failure", "TS 38.413 8.3.2 / 8.3.3", (), "UE context release"),
    "pdu-accept-undelivered": (EST, "failure", "TS 38.413 8.3.1.3", (), "InitialContextSetupFailure"),
    "pdu-accept-without-n2": (EST, "incomplete", "TS 24.501 6.4.1.3", (), "no N2 PDU session resource setup"),
    # 6.3.2 network-requested modification accepted (6.3.2.3) / not accepted (6.3.2.4) by the UE; 6.4.2 the UE's
    # request not accepted by the network (6.4.2.4).
    "modification-complete": (MOD, "success", "TS 24.501 6.3.2.3", (Nas(SM, "PDU session modification complete"),), ""),
    "modification-reject": (MOD, "reject", "TS 24.501 6.4.2.4", (Nas(SM, "PDU session modification reject"),), ""),
    "modification-command-reject": (MOD, "failure", "TS 24.501 6.3.2.4",
                                    (Nas(SM, "PDU session modification command reject"),), ""),
    # 6.3.3 network-requested release accepted by the UE (6.3.3.3); 6.4.3 UE-requested, not accepted (6.4.3.4).
    "release-complete": (REL, "success", "TS 24.501 6.3.3.3", (Nas(SM, "PDU session release complete"),), ""),
    "release-reject": (REL, "reject", "TS 24.501 6.4.3.4", (Nas(SM, "PDU session release reject"),), ""),
    # TS 38.413 8.4.1 / 8.4.2 / 8.4.4: successful operation (.2) and unsuccessful operation (.3) of each.
    "handover-command": (HO_PREP, "success", "TS 38.413 8.4.1.2",
                         (Ngap("id-HandoverPreparation", "successfulOutcome", "HANDOVER COMMAND"),), ""),
    "handover-preparation-failure": (HO_PREP, "failure", "TS 38.413 8.4.1.3",
                                     (Ngap("id-HandoverPreparation", "unsuccessfulOutcome",
                                           "HANDOVER PREPARATION FAILURE"),), ""),
    "handover-request-ack": (HO_ALLOC, "success", "TS 38.413 8.4.2.2",
                             (Ngap("id-HandoverResourceAllocation", "successfulOutcome",
                                   "HANDOVER REQUEST ACKNOWLEDGE"),), ""),
    "handover-failure": (HO_ALLOC, "failure", "TS 38.413 8.4.2.3",
                         (Ngap("id-HandoverResourceAllocation", "unsuccessfulOutcome", "HANDOVER FAILURE"),), ""),
    "path-switch-ack": (PATH, "success", "TS 38.413 8.4.4.2",
                        (Ngap("id-PathSwitchRequest", "successfulOutcome", "PATH SWITCH REQUEST ACKNOWLEDGE"),), ""),
    "path-switch-failure": (PATH, "failure", "TS 38.413 8.4.4.3",
                            (Ngap("id-PathSwitchRequest", "unsuccessfulOutcome", "PATH SWITCH REQUEST FAILURE"),), ""),
    # 8.3.3 UE Context Release (AMF initiated), successful operation: UE CONTEXT RELEASE COMPLETE.
    "ue-context-release-complete": (UE_REL, "success", "TS 38.413 8.3.3.2",
                                    (Ngap("id-UEContextRelease", "successfulOutcome", "UE CONTEXT RELEASE COMPLETE"),),
                                    ""),
    # 10.6 / 8.7.5: a peer that does not know the UE NGAP ids of a message answers with ERROR INDICATION (class 2).
    "ue-context-release-error-indication": (UE_REL, "failure", "TS 38.413 8.7.5 / 10.6",
                                            (Ngap("id-ErrorIndication", "initiatingMessage", "ERROR INDICATION"),),
                                            "same UE NGAP ids"),
    # 8.7.5 / 10: any other class-1 request of the UE context the peer could not process: its ERROR INDICATION.
    "n2-error-indication": ("*", "failure", "TS 38.413 8.7.5 / 10", (), "ERROR INDICATION from the peer"),
    # 8.3.1 Initial Context Setup: successful (8.3.1.2) and unsuccessful (8.3.1.3) operation.
    "initial-context-setup-response": (ICS, "success", "TS 38.413 8.3.1.2",
                                       (Ngap("id-InitialContextSetup", "successfulOutcome",
                                             "INITIAL CONTEXT SETUP RESPONSE"),), ""),
    "initial-context-setup-failure": (ICS, "failure", "TS 38.413 8.3.1.3",
                                      (Ngap("id-InitialContextSetup", "unsuccessfulOutcome",
                                            "INITIAL CONTEXT SETUP FAILURE"),), ""),
    # 8.2.1 / 8.2.3 / 8.2.2: PDU Session Resource Setup / Modify / Release have a successful outcome only.
    "pdu-resource-setup-response": (RES_SETUP, "success", "TS 38.413 8.2.1.2",
                                    (Ngap("id-PDUSessionResourceSetup", "successfulOutcome",
                                          "PDU SESSION RESOURCE SETUP RESPONSE"),), ""),
    "pdu-resource-modify-response": (RES_MODIFY, "success", "TS 38.413 8.2.3.2",
                                     (Ngap("id-PDUSessionResourceModify", "successfulOutcome",
                                           "PDU SESSION RESOURCE MODIFY RESPONSE"),), ""),
    "pdu-resource-release-response": (RES_RELEASE, "success", "TS 38.413 8.2.2.2",
                                      (Ngap("id-PDUSessionResourceRelease", "successfulOutcome",
                                            "PDU SESSION RESOURCE RELEASE RESPONSE"),), ""),
    # A session established before gets its user plane back (24.501 5.6.1.4): the N2 setup answers (8.2.1.2 /
    # 8.3.1.2) set it up, or list it failed / fail the InitialContextSetup carrying it (8.3.1.3).
    "reactivation-setup": (REACT, "success", "TS 38.413 8.2.1.2 / 8.3.1.2", (), "set the session's user-plane"),
    "reactivation-failed": (REACT, "failure", "TS 38.413 8.2.1.2 / 8.3.1.3", (), "failed to set up"),
    # 8.7.4 NG Reset (either side): NG RESET ACKNOWLEDGE.
    "ng-reset-acknowledge": (RESET, "success", "TS 38.413 8.7.4.2",
                             (Ngap("id-NGReset", "successfulOutcome", "NG RESET ACKNOWLEDGE"),), ""),
    # 8.5.1 Paging: class 2, no response message; the paged UE answers with a SERVICE REQUEST or a REGISTRATION
    # REQUEST (TS 24.501 5.6.2.2.1) presenting the paged 5G-S-TMSI, or nobody does.
    "paging-answered": (PAGING, "success", "TS 38.413 8.5.1 / TS 24.501 5.6.2.2.1", (), "presented its 5G-S-TMSI"),
    "paging-no-response": (PAGING, "incomplete", "TS 38.413 8.5.1", (), "no UE presented the paged 5G-S-TMSI"),
    # No terminal message: any procedure.
    "restarted": ("*", "incomplete", "TS 24.501 / TS 38.413", (), "the same request again"),
    "unanswered": ("*", "incomplete", "TS 24.501 / TS 38.413", (), "no terminal message"),
}


def every_key() -> list[str]:
    """Every message key there is: each 5GMM / 5GSM type Wireshark names, each NGAP procedure code with each
    NGAP-PDU choice, and each 5GMM / 5GSM type handed back unforwarded."""
    nas = [f"{layer} 0x{value:02x}" for field, layer in ((MM, "5GMM"), (SM, "5GSM"))
           for value in wireshark_names.names(field)]
    ngap = [f"NGAP {code}/{kind}" for code in wireshark_names.names("ngap.procedureCode")
            for kind in wireshark_names.names("ngap.NGAP_PDU")]
    return [*nas, *(f"{k} returned" for k in nas), *ngap]


def test_the_table_has_exactly_the_spec_s_rows() -> None:
    assert sorted(RULES) == sorted(SPEC)
    assert len(TABLE) == len(SPEC) and all(RULES[r.id] is r for r in TABLE)


@pytest.mark.parametrize("rule_id", sorted(SPEC))
def test_each_row_has_the_spec_s_procedure_outcome_clause_and_ending_messages(rule_id: str) -> None:
    procedure, outcome, clause, messages, words = SPEC[rule_id]
    rule = RULES[rule_id]
    assert (rule.id, rule.procedure, rule.outcome, rule.clause) == (rule_id, procedure, outcome, clause)
    assert sorted(rule.keys) == sorted(m.key() for m in messages)
    assert isinstance(rule.keys, tuple)
    # What it says names the message that ends it (or the condition, when no message does) ...
    for m in messages:
        assert m.words() in rule.says, (rule_id, m.words(), rule.says)
    assert words in rule.says, (rule_id, words, rule.says)
    # ... and its text is "clause: what it says", the form every answer's `rule` carries (docs/5g.md).
    assert rule.text == f"{clause}: {rule.says}"


def test_every_ngap_ending_is_an_outcome_wireshark_knows_the_procedure_has() -> None:
    """A successful / unsuccessful outcome of a class-1 procedure only (TS 38.413 8.1): Wireshark's own
    registrations of the NGAP-PDU choices per procedure code (`tshark -G decodes`)."""
    tables = wireshark_names.decodes("ngap")
    for rule_id, (_, outcome, _, messages, _) in SPEC.items():
        for m in messages:
            if isinstance(m, Ngap):
                code = wireshark_names.code("ngap.procedureCode", m.procedure)
                table = {"successfulOutcome": "ngap.proc.sout", "unsuccessfulOutcome": "ngap.proc.uout",
                         "initiatingMessage": "ngap.proc.imsg"}[m.outcome]
                assert code in tables[table], (rule_id, m.procedure, m.outcome)
                if m.outcome == "initiatingMessage":  # a class-2 message that answers (ERROR INDICATION)
                    assert code not in tables["ngap.proc.sout"] and outcome == "failure", rule_id
                    continue
                assert (m.outcome == "successfulOutcome") == (outcome == "success"), rule_id
    # The N2 setup answers: PDU Session Resource Setup has no unsuccessful outcome (a session that failed to set up
    # is an item of its response), Initial Context Setup has one.
    setup, initial = (wireshark_names.code("ngap.procedureCode", p) for p in ("id-PDUSessionResourceSetup",
                                                                              "id-InitialContextSetup"))
    assert setup in tables["ngap.proc.sout"] and setup not in tables["ngap.proc.uout"]
    assert initial in tables["ngap.proc.uout"]


def test_ending_finds_the_spec_s_rule_for_every_procedure_and_every_message() -> None:
    """Every (procedure, message) pair: the rule that message ends the procedure by, or none."""
    want = {(procedure, m.key()): rule_id for rule_id, (procedure, _, _, messages, _) in SPEC.items()
            for m in messages}
    assert len(want) == sum(len(s[3]) for s in SPEC.values()), "one rule per (procedure, message)"
    keys = every_key()
    assert set(k for _, k in want) <= set(keys)
    for procedure, key in itertools.product((*PROCEDURES, "*", "Registration Update", ""), keys):
        found = ending(procedure, key)
        assert (found.id if found else None) == want.get((procedure, key)), (procedure, key)
        assert found is None or found is RULES[found.id]


@pytest.mark.parametrize(("procedure", "key", "rule_id"), [
    (REG, "5GMM 0x42", "registration-accept"),  # TS 24.501 9.7: REGISTRATION ACCEPT is 0100 0010
    (REG, "5GMM 0x43", "registration-complete"), (UE_REL, "NGAP 9/0", "ue-context-release-error-indication"),
    (ICS, "NGAP 14/2", "initial-context-setup-failure"), (RESET, "NGAP 20/1", "ng-reset-acknowledge"),
    (REG, "NGAP 14/2", None), (SR, "NGAP 14/1", None), (REACT, "NGAP 29/1", None), (EST, "NGAP 9/0", None),
    (REG, "5GMM 0x58", "registration-auth-reject"), (AUTH, "5GMM 0x58", "authentication-reject"),
    (DEREG, "5GMM 0x46", "deregistration-accept"), (DEREG, "5GMM 0x48", "deregistration-accept"),
    (EST, "5GMM 0x68 returned", "pdu-returned"), (EST, "5GMM 0x64", "pdu-5gmm-status"),
    (MOD, "5GSM 0xcd", "modification-command-reject"), (UE_REL, "NGAP 41/1", "ue-context-release-complete"),
    (PATH, "NGAP 25/2", "path-switch-failure"),
    # Not endings: a start message, an accept that only hands the session to N2, a message of another
    # procedure, the DL NAS transport without its "returned" mark, the initiating message of an NGAP procedure.
    (REG, "5GMM 0x41", None), (EST, "5GSM 0xc2", None), (SR, "5GMM 0x42", None), (EST, "5GMM 0x68", None),
    (HO_PREP, "NGAP 12/0", None), (UE_REL, "NGAP 41/2", None), (EST, "5GSM 0xc3 returned", None),
])
def test_ending_on_hand_written_cases(procedure: str, key: str, rule_id: str | None) -> None:
    """A few pairs written out by their numbers (TS 24.501 table 9.7.1 / 9.7.2, TS 38.413 procedure codes)."""
    found = ending(procedure, key)
    assert (found.id if found else None) == rule_id


def test_a_row_is_built_with_one_of_the_four_outcomes_only() -> None:
    for outcome in ("success", "reject", "failure", "incomplete"):
        assert rules._r("x-" + outcome, "P", outcome, "TS 1.2", "says", "K 1", "K 2") == \
            Rule("x-" + outcome, "P", outcome, "TS 1.2", "says", ("K 1", "K 2"))
    assert rules._r("x", "P", "success", "TS 1.2", "says").keys == ()
    for outcome in ("", "Success", "rejected", "timeout", "abort"):
        with pytest.raises(AssertionError, match=outcome or "^$"):
            rules._r("x", "P", outcome, "TS 1.2", "says")
    assert rules.OUTCOMES == ("success", "reject", "failure", "incomplete")
    assert Rule("i", "P", "reject", "TS 9.9.9", "NO").text == "TS 9.9.9: NO"
