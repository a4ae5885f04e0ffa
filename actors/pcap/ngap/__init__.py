"""5G N2 summaries from NGAP protocol trees: UE contexts, their failures, and PDU sessions.

What is counted (docs/5g.md, "What the NGAP summaries count", says the same for users):

- An NG association is one SCTP association between a gNB and an AMF: its two endpoints
  (ip:port) plus Wireshark's SCTP association index (sctp.association_index, which tells a
  restarted association on the same ports from the old one).
- A UE context is one UE-associated logical NG connection: (association, AMF-UE-NGAP-ID,
  RAN-UE-NGAP-ID). The ids are only unique inside one association, so contexts of different
  gNBs that reuse the same small numbers stay apart, and a context ends with
  UEContextReleaseComplete, an NGReset that covers it, a new InitialUEMessage reusing its
  RAN id, or a PDU pairing one of its ids with another (later PDUs with those ids are a new
  context, labelled #2, #3 ...). Contexts are never merged; they are *linked* only on evidence
  (same SUCI, a 5G-TMSI assigned in one and presented in another, a path switch naming the
  source AMF-UE-NGAP-ID, or a handover carrying the same source-to-target container), and each
  link names its evidence.
- A failure is a reject or failure NAS message, a 5GMM/5GSM status, an NGAP unsuccessfulOutcome,
  ErrorIndication or NAS non-delivery, a PDU session that failed to set up, a release with an
  abnormal cause, or a class-1 request never answered although the association carried later
  traffic. Releases with a normal cause (NGAP nas normal-release/deregister, radioNetwork
  user-inactivity/successful-handover/..., 5GSM #36 regular deactivation) and deregistrations
  are not failures.
- A PDU session entry is one establishment: (UE context, PDU session id, n-th establishment
  request). Its outcome is that of the one procedure model (model.py) every view reads: it is
  established when its Establishment Accept rode in an N2 resource setup request
  (PDUSessionResourceSetup or InitialContextSetup) whose response set the session up. Every
  outcome names the rule (rules.py, with its TS 24.501 / TS 38.413 clause) that decided it.

Each NGAP PDU is read from its own subtree, so a frame bundling several PDUs (SCTP carries many
DATA chunks per frame) yields one record per PDU with its own UE ids. Names come from
Wireshark's labels; codes from the raw values, never from a home-made decoder.

In the pcap package's layers (the layers contract in pyproject.toml's [tool.importlinter]) it sits
above shark/, beside masking/ (independent of it): it may import shark/ (today its tree.py) and
messages.py, never warm/, engine/, answers/ nor the rest of the back end's surface, which import it.
"""

from diagd.actors.pcap.ngap.core_links import CORE_FIELDS, CORE_FILTER
from diagd.actors.pcap.ngap.model import Model
from diagd.actors.pcap.ngap.model import build as build_model
from diagd.actors.pcap.ngap.pdus import NgapPdu, pdus_in_frame
from diagd.actors.pcap.ngap.procedures_view import procedures
from diagd.actors.pcap.ngap.sessions import pdu_sessions, ue_sessions

__all__ = ["CORE_FIELDS", "CORE_FILTER", "Model", "NgapPdu", "build_model",
           "pdu_sessions", "pdus_in_frame", "procedures", "ue_sessions"]
