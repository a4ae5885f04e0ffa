"""The terminal conditions of 5G procedures: one row per way a procedure ends, each with its clause.

Every procedure outcome diagd reports names one of these rows (`rule`), so an engineer can check
the verdict against the specification: TS 24.501 (5GMM clause 5, 5GSM clause 6) and TS 38.413
(NGAP clause 8). The tests read this table too: each row has a test on a real capture, or on a
capture built from real frames where the shared corpus has no case.

Message keys are those of procedures.message_keys: "5GMM 0x42" (NAS message type), "NGAP 41/1"
(procedure code / 0 initiating, 1 successful, 2 unsuccessful outcome). Rows whose condition is
not one message (switch-off, the N2 setup response, a context release, an N2 carrier that failed, a NAS
non-delivery, an ERROR INDICATION ending a class-1 request, a paged UE showing up, no answer) have no key
and are applied by procedures.py (paging.py) by their id. Rows whose message ends the procedure
only under a condition (an accept is delivered when its N2 carrier succeeded; an ERROR INDICATION answers
a release only from the peer) have the key and procedures.py checks the condition.
"""

from __future__ import annotations

from dataclasses import dataclass

OUTCOMES = ("success", "reject", "failure", "incomplete")


@dataclass(frozen=True)
class Rule:
    id: str
    procedure: str
    outcome: str
    clause: str
    says: str
    keys: tuple[str, ...] = ()  # the messages that end the procedure this way

    @property
    def text(self) -> str:
        return f"{self.clause}: {self.says}"


def _r(id_: str, procedure: str, outcome: str, clause: str, says: str, *keys: str) -> Rule:
    assert outcome in OUTCOMES, outcome
    return Rule(id_, procedure, outcome, clause, says, keys)


REG, AUTH, SMC, SR, DEREG = "Registration", "Authentication", "Security Mode", "Service Request", "Deregistration"
EST, MOD, REL = "PDU Session Establishment", "PDU Session Modification", "PDU Session Release"
ICS, REACT = "Initial Context Setup", "PDU Session Re-activation"

TABLE: tuple[Rule, ...] = (
    # The accept counts once it reached the UE: its N2 carrier (InitialContextSetupRequest) answered by the response,
    # and, when it assigned a new 5G-GUTI, acknowledged by the UE's REGISTRATION COMPLETE (5.5.1.2.4).
    _r("registration-accept", REG, "success", "TS 24.501 5.5.1.2.4",
       "REGISTRATION ACCEPT delivered (no new 5G-GUTI: no REGISTRATION COMPLETE due)", "5GMM 0x42"),
    _r("registration-complete", REG, "success", "TS 24.501 5.5.1.2.4",
       "REGISTRATION COMPLETE acknowledged the accept", "5GMM 0x43"),
    _r("registration-accept-undelivered", REG, "failure", "TS 38.413 8.3.1.3 / TS 24.501 5.5.1.2.4",
       "InitialContextSetupFailure: the REGISTRATION ACCEPT it carried never reached the UE"),
    # A NAS NON DELIVERY INDICATION returns the NAS-PDU of a DownlinkNASTransport: the accept in it never reached the UE
    # (TS 38.413 8.6.4), whatever the capture showed of it until then.
    _r("registration-accept-non-delivery", REG, "failure", "TS 38.413 8.6.4 / TS 24.501 5.5.1.2.4",
       "NAS NON DELIVERY INDICATION: the REGISTRATION ACCEPT a DownlinkNASTransport carried never reached the UE"),
    _r("registration-complete-missing", REG, "incomplete", "TS 24.501 5.5.1.2.4",
       "REGISTRATION ACCEPT assigned a new 5G-GUTI, but no REGISTRATION COMPLETE followed"),
    _r("registration-reject", REG, "reject", "TS 24.501 5.5.1.2.5", "REGISTRATION REJECT", "5GMM 0x44"),
    _r("registration-auth-reject", REG, "reject", "TS 24.501 5.4.1.3.5",
       "AUTHENTICATION REJECT ends the registration", "5GMM 0x58"),
    _r("authentication-response", AUTH, "success", "TS 24.501 5.4.1.3.3", "AUTHENTICATION RESPONSE", "5GMM 0x57"),
    _r("authentication-reject", AUTH, "reject", "TS 24.501 5.4.1.3.5", "AUTHENTICATION REJECT", "5GMM 0x58"),
    _r("authentication-failure", AUTH, "failure", "TS 24.501 5.4.1.3.6", "AUTHENTICATION FAILURE from the UE",
       "5GMM 0x59"),
    _r("security-mode-complete", SMC, "success", "TS 24.501 5.4.2.3", "SECURITY MODE COMPLETE", "5GMM 0x5e"),
    _r("security-mode-reject", SMC, "failure", "TS 24.501 5.4.2.5", "SECURITY MODE REJECT", "5GMM 0x5f"),
    _r("service-accept", SR, "success", "TS 24.501 5.6.1.4",
       "SERVICE ACCEPT delivered (by a NAS transport, or its InitialContextSetupRequest answered by the response)",
       "5GMM 0x4e"),
    _r("service-accept-undelivered", SR, "failure", "TS 38.413 8.3.1.3 / TS 24.501 5.6.1.4",
       "InitialContextSetupFailure: the SERVICE ACCEPT it carried never reached the UE"),
    _r("service-accept-non-delivery", SR, "failure", "TS 38.413 8.6.4 / TS 24.501 5.6.1.4",
       "NAS NON DELIVERY INDICATION: the SERVICE ACCEPT a DownlinkNASTransport carried never reached the UE"),
    _r("service-reject", SR, "reject", "TS 24.501 5.6.1.5", "SERVICE REJECT", "5GMM 0x4d"),
    _r("deregistration-accept", DEREG, "success", "TS 24.501 5.5.2.2.2 / 5.5.2.3.2", "DEREGISTRATION ACCEPT",
       "5GMM 0x46", "5GMM 0x48"),
    _r("deregistration-switch-off", DEREG, "success", "TS 24.501 5.5.2.2.1", "no accept after switch-off"),
    _r("pdu-setup-response", EST, "success", "TS 38.413 8.2.1.2",
       "PDUSessionResourceSetupResponse set the session up (its accept rode in the request)"),
    _r("pdu-initial-context-setup", EST, "success", "TS 38.413 8.3.1.2",
       "InitialContextSetupResponse set the session up (its accept rode in the request)"),
    _r("pdu-reject", EST, "reject", "TS 24.501 6.4.1.4", "PDU SESSION ESTABLISHMENT REJECT", "5GSM 0xc3"),
    _r("pdu-returned", EST, "reject", "TS 24.501 5.4.5.2.5",
       "the AMF returned the request unforwarded (DL NAS TRANSPORT with a 5GMM cause)", "5GMM 0x68 returned"),
    _r("pdu-5gmm-status", EST, "failure", "TS 24.501 8.2.29",
       "5GMM STATUS answered the NAS transport of this session", "5GMM 0x64"),
    _r("pdu-setup-failed", EST, "failure", "TS 38.413 8.2.1.2 / 8.3.1.3",
       "the N2 setup response lists the session as failed to set up"),
    _r("pdu-context-released", EST, "failure", "TS 38.413 8.3.2 / 8.3.3",
       "UE context release before the N2 setup response"),
    _r("pdu-accept-undelivered", EST, "failure", "TS 38.413 8.3.1.3",
       "InitialContextSetupFailure: the accept it carried never reached the UE"),
    _r("pdu-accept-non-delivery", EST, "failure", "TS 38.413 8.6.4 / TS 24.501 6.4.1.3",
       "NAS NON DELIVERY INDICATION: the accept a DownlinkNASTransport carried never reached the UE"),
    _r("pdu-accept-without-n2", EST, "incomplete", "TS 24.501 6.4.1.3",
       "accepted, but no N2 PDU session resource setup carried the accept"),
    _r("modification-complete", MOD, "success", "TS 24.501 6.3.2.3", "PDU SESSION MODIFICATION COMPLETE",
       "5GSM 0xcc"),
    _r("modification-reject", MOD, "reject", "TS 24.501 6.4.2.4", "PDU SESSION MODIFICATION REJECT", "5GSM 0xca"),
    _r("modification-command-reject", MOD, "failure", "TS 24.501 6.3.2.4",
       "PDU SESSION MODIFICATION COMMAND REJECT", "5GSM 0xcd"),
    _r("release-complete", REL, "success", "TS 24.501 6.3.3.3", "PDU SESSION RELEASE COMPLETE", "5GSM 0xd4"),
    _r("release-reject", REL, "reject", "TS 24.501 6.4.3.4", "PDU SESSION RELEASE REJECT", "5GSM 0xd2"),
    _r("handover-command", "Handover Preparation", "success", "TS 38.413 8.4.1.2", "HANDOVER COMMAND", "NGAP 12/1"),
    _r("handover-preparation-failure", "Handover Preparation", "failure", "TS 38.413 8.4.1.3",
       "HANDOVER PREPARATION FAILURE", "NGAP 12/2"),
    _r("handover-request-ack", "Handover Resource Allocation", "success", "TS 38.413 8.4.2.2",
       "HANDOVER REQUEST ACKNOWLEDGE", "NGAP 13/1"),
    _r("handover-failure", "Handover Resource Allocation", "failure", "TS 38.413 8.4.2.3", "HANDOVER FAILURE",
       "NGAP 13/2"),
    _r("path-switch-ack", "Path Switch", "success", "TS 38.413 8.4.4.2", "PATH SWITCH REQUEST ACKNOWLEDGE",
       "NGAP 25/1"),
    _r("path-switch-failure", "Path Switch", "failure", "TS 38.413 8.4.4.3", "PATH SWITCH REQUEST FAILURE",
       "NGAP 25/2"),
    _r("ue-context-release-complete", "UE Context Release", "success", "TS 38.413 8.3.3.2",
       "UE CONTEXT RELEASE COMPLETE", "NGAP 41/1"),
    # The peer does not know the id pair (unknown local UE NGAP ID ...): it answers with ERROR INDICATION.
    _r("ue-context-release-error-indication", "UE Context Release", "failure", "TS 38.413 8.7.5 / 10.6",
       "ERROR INDICATION from the peer, with the same UE NGAP ids, answered the release", "NGAP 9/0"),
    # Any other class-1 NGAP request of a UE context the peer could not process (TS 38.413 10: an unknown id pair, an
    # IE it cannot comprehend) ends with its ERROR INDICATION: the latest request in flight from the other side.
    _r("n2-error-indication", "*", "failure", "TS 38.413 8.7.5 / 10",
       "ERROR INDICATION from the peer, with the same UE NGAP ids, ended the class-1 NGAP request in flight"),
    _r("initial-context-setup-response", ICS, "success", "TS 38.413 8.3.1.2", "INITIAL CONTEXT SETUP RESPONSE",
       "NGAP 14/1"),
    _r("initial-context-setup-failure", ICS, "failure", "TS 38.413 8.3.1.3", "INITIAL CONTEXT SETUP FAILURE",
       "NGAP 14/2"),
    # N2 PDU session resource procedures: class 1 with a successful outcome only; a session the gNB could not set up,
    # modify or release is an item of the response, judged in the PDU session's own procedure.
    _r("pdu-resource-setup-response", "PDU Session Resource Setup", "success", "TS 38.413 8.2.1.2",
       "PDU SESSION RESOURCE SETUP RESPONSE", "NGAP 29/1"),
    _r("pdu-resource-modify-response", "PDU Session Resource Modify", "success", "TS 38.413 8.2.3.2",
       "PDU SESSION RESOURCE MODIFY RESPONSE", "NGAP 26/1"),
    _r("pdu-resource-release-response", "PDU Session Resource Release", "success", "TS 38.413 8.2.2.2",
       "PDU SESSION RESOURCE RELEASE RESPONSE", "NGAP 28/1"),
    # A user-plane re-activation: N2 resources set up again for a session established before (Service Request path,
    # no 5GSM establishment in the request): TS 24.501 5.6.1.4 / TS 38.413 8.2.1 or 8.3.1.
    _r("reactivation-setup", REACT, "success", "TS 38.413 8.2.1.2 / 8.3.1.2",
       "the N2 response set the session's user-plane resources up again"),
    _r("reactivation-failed", REACT, "failure", "TS 38.413 8.2.1.2 / 8.3.1.3",
       "the N2 response lists the session as failed to set up, or the InitialContextSetup carrying it failed"),
    _r("ng-reset-acknowledge", "NG Reset", "success", "TS 38.413 8.7.4.2", "NG RESET ACKNOWLEDGE", "NGAP 20/1"),
    # Paging is class 2 (no response message) and not UE-associated: the paged UE answers over the radio with a SERVICE
    # REQUEST or REGISTRATION REQUEST (TS 24.501 5.6.2.2.1) presenting the paged 5G-S-TMSI (paging.py).
    _r("paging-answered", "Paging", "success", "TS 38.413 8.5.1 / TS 24.501 5.6.2.2.1",
       "the paged UE presented its 5G-S-TMSI after the PAGING (SERVICE REQUEST, REGISTRATION REQUEST or "
       "InitialUEMessage)"),
    _r("paging-no-response", "Paging", "incomplete", "TS 38.413 8.5.1",
       "class 2, no response message: no UE presented the paged 5G-S-TMSI after the PAGING in the capture"),
    # No terminal message: the procedure's own clause defines the answer that never came.
    _r("restarted", "*", "incomplete", "TS 24.501 / TS 38.413",
       "the same request again before any answer (the first one is abandoned)"),
    _r("unanswered", "*", "incomplete", "TS 24.501 / TS 38.413", "no terminal message in the capture"),
)
RULES = {rule.id: rule for rule in TABLE}
assert len(RULES) == len(TABLE), "rule ids must be unique"


def ending(procedure: str, key: str) -> Rule | None:
    """The rule a message ends a procedure by, if it ends it."""
    for rule in TABLE:
        if rule.procedure == procedure and key in rule.keys:
            return rule
    return None
