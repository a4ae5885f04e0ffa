"""5G N2 summaries from NGAP protocol trees: UE contexts, their failures, and PDU sessions.

What is counted (the README's "NGAP summaries" section says the same for users):

- An NG association is one SCTP association between a gNB and an AMF: its two endpoints
  (ip:port) plus Wireshark's SCTP association index (sctp.association_index, which tells a
  restarted association on the same ports from the old one).
- A UE context is one UE-associated logical NG connection: (association, AMF-UE-NGAP-ID,
  RAN-UE-NGAP-ID). The ids are only unique inside one association, so contexts of different
  gNBs that reuse the same small numbers stay apart, and a context ends with
  UEContextReleaseComplete, an NGReset that covers it, or a new InitialUEMessage reusing its
  RAN id. Contexts are never merged; they are *linked* only on evidence (same SUCI, a 5G-TMSI
  assigned in one and presented in another, a path switch naming the source AMF-UE-NGAP-ID, or a
  handover carrying the same source-to-target container), and each link names its evidence.
- A failure is a reject or failure NAS message, a 5GMM/5GSM status, an NGAP unsuccessfulOutcome,
  ErrorIndication or NAS non-delivery, a PDU session that failed to set up, a release with an
  abnormal cause, or a class-1 request never answered although the association carried later
  traffic. Releases with a normal cause (NGAP nas normal-release/deregister, radioNetwork
  user-inactivity/successful-handover/..., 5GSM #36 regular deactivation) and deregistrations
  are not failures.
- A PDU session entry is one establishment: (UE context, PDU session id, n-th establishment
  request). It is established when its Establishment Accept rode in an N2 resource setup request
  (PDUSessionResourceSetup or InitialContextSetup) whose response set the session up.

Each NGAP PDU is read from its own subtree, so a frame bundling several PDUs (SCTP carries many
DATA chunks per frame) yields one record per PDU with its own UE ids. Names come from
Wireshark's labels; codes from the raw values, never from a home-made decoder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from diagd.actors.pcap.tree import Node, label_name, labelled, parse_f, protocol_nodes

PDU_TYPES = {"0": "initiatingMessage", "1": "successfulOutcome", "2": "unsuccessfulOutcome"}
NGAP_CAUSE_GROUPS = ("ngap.radioNetwork", "ngap.transport", "ngap.nas", "ngap.protocol", "ngap.misc")
NGAP_SCTP_PORT = 38412  # the AMF listens on it (TS 38.412)
UNKNOWN_ASSOC_INDEX = 65535  # what sctp.assoc_index says when Wireshark could not number the association

# NGAP ProtocolIE ids (TS 38.413 / Wireshark's ngap.id) whose contents decide which UE a PDU is about.
IE_AMF_UE_NGAP_ID = 10
IE_RAN_UE_NGAP_ID = 85
IE_UE_NGAP_IDS = 114  # UEContextReleaseCommand: the pair, or the AMF id alone
IE_SOURCE_AMF_UE_NGAP_ID = 100  # PathSwitchRequest: the *source* context's AMF id, not this one's
IE_NEW_AMF_UE_NGAP_ID = 40  # UEContextModificationRequest: the AMF id this context uses from now on
IE_RESET_TYPE = 88  # NGReset: the whole interface, or a list of contexts
IE_CONNECTION_LIST = 111  # NGResetAcknowledge: the contexts reset
IE_FIVEG_S_TMSI = 26
IE_SOURCE_TO_TARGET_CONTAINER = 101
IE_RAN_NODE_NAME = 82
IE_GLOBAL_RAN_NODE_ID = 27
OTHER_CONTEXT_IES = {IE_SOURCE_AMF_UE_NGAP_ID, IE_NEW_AMF_UE_NGAP_ID, IE_RESET_TYPE, IE_CONNECTION_LIST}

# PDU session resource lists: the role of their items.
SESSION_LIST_ROLES = {
    74: "setup-request", 71: "setup-request",  # PDUSessionResourceSetupListSUReq / ...CxtReq
    75: "setup-ok", 72: "setup-ok",  # ...SetupListSURes / ...CxtRes
    58: "setup-failed", 55: "setup-failed", 132: "setup-failed",  # FailedToSetupListSURes / CxtRes / CxtFail
    54: "modify-failed", 131: "modify-failed",  # FailedToModifyListModRes / ModCfm
    229: "resume-failed", 230: "resume-failed",
    79: "release-command",  # PDUSessionResourceToReleaseListRelCmd
}

# Class 1 procedures (TS 38.413 table 8.1-1): the initiating message is answered by a successful or
# unsuccessful outcome. An answer that never comes is a failure.
CLASS1_PROCEDURES = {0, 10, 12, 13, 14, 20, 21, 25, 26, 27, 28, 29, 32, 35, 40, 41, 43, 51, 58, 59, 60,
                     66, 67, 68, 69, 70, 71, 72, 73}
PROC_ERROR_INDICATION = 9
PROC_NAS_NON_DELIVERY = 19
PROC_NG_RESET = 20
PROC_NG_SETUP = 21
PROC_HANDOVER_PREPARATION = 12
PROC_HANDOVER_RESOURCE_ALLOCATION = 13
PROC_INITIAL_CONTEXT_SETUP = 14
PROC_INITIAL_UE_MESSAGE = 15
PROC_PATH_SWITCH = 25
PROC_PDU_SESSION_RELEASE = 28
PROC_PDU_SESSION_SETUP = 29
PROC_UE_CONTEXT_RELEASE = 41
PROC_UE_CONTEXT_RELEASE_REQUEST = 42
RELEASE_PROCEDURES = {PROC_UE_CONTEXT_RELEASE, PROC_UE_CONTEXT_RELEASE_REQUEST, PROC_PDU_SESSION_RELEASE}
GNB_SENDS = {PROC_INITIAL_UE_MESSAGE, PROC_NG_SETUP, 46, PROC_UE_CONTEXT_RELEASE_REQUEST}  # 46 UplinkNASTransport

# NGAP causes that end things normally (names as Wireshark prints them). Anything else in a
# release is abnormal; "unspecified" is not normal: it hides the reason.
NORMAL_NGAP_CAUSES = {
    "radioNetwork": {"successful-handover", "release-due-to-ngran-generated-reason",
                     "release-due-to-5gc-generated-reason", "user-inactivity", "ng-intra-system-handover-triggered",
                     "ng-inter-system-handover-triggered", "xn-handover-triggered", "ue-context-transfer",
                     "ims-voice-eps-fallback-or-rat-fallback-triggered", "redirection",
                     "release-due-to-cn-detected-mobility"},
    "nas": {"normal-release", "deregister"},
    "misc": {"om-intervention"},  # an operator's deliberate action, not a fault
}

# NAS messages that are failures in themselves (TS 24.501 message types).
NAS_FAILURE_MESSAGES = {
    "0x44",  # Registration reject
    "0x4d",  # Service reject
    "0x58",  # Authentication reject
    "0x59",  # Authentication failure
    "0x5f",  # Security mode reject
    "0x64",  # 5GMM status
    "0xc3",  # PDU session establishment reject
    "0xca",  # PDU session modification reject
    "0xcd",  # PDU session modification command reject
    "0xd2",  # PDU session release reject
    "0xd6",  # 5GSM status
}
NAS_RELEASES = {"0xd1", "0xd3"}  # PDU session release request / command: abnormal only by cause
NORMAL_5GSM_RELEASE_CAUSES = {36, 39}  # regular deactivation, reactivation requested
NAS_REGISTRATION_REQUEST, NAS_REGISTRATION_ACCEPT, NAS_REGISTRATION_REJECT = "0x41", "0x42", "0x44"
NAS_ESTABLISHMENT_REQUEST, NAS_ESTABLISHMENT_ACCEPT, NAS_ESTABLISHMENT_REJECT = "0xc1", "0xc2", "0xc3"
NAS_TMSI_ASSIGNERS = {"0x42", "0x54"}  # Registration accept, Configuration update command
NAS_DEREGISTRATIONS = {"0x45", "0x46", "0x47", "0x48"}
NAS_DL_TRANSPORT = "0x68"  # with a 5GMM cause it carries back a 5GSM message the AMF could not forward

_MESSAGE_TYPES = {"nas_5gs.mm.message_type": "5GMM", "nas_5gs.sm.message_type": "5GSM"}
_NAS_KEEP = {"nas_5gs.pdu_session_id", "nas_5gs.cmn.dnn", "nas_5gs.sm.pdu_addr_inf_ipv4", "nas_5gs.mm.sst",
             "nas_5gs.5g_tmsi", "e212.mcc", "e212.mnc", "nas_5gs.mm.type_id"}
_INTEGER_FIELDS = {"ngap.AMF_UE_NGAP_ID", "ngap.RAN_UE_NGAP_ID", "ngap.pDUSessionID", "ngap.qosFlowIdentifier",
                   "nas_5gs.pdu_session_id", "nas_5gs.5g_tmsi"}
_ITEM_KEEP = {"ngap.TransportLayerAddressIPv4", "ngap.gTP_TEID", "ngap.qosFlowIdentifier", "ngap.sST", "ngap.sD"}


# ---------------------------------------------------------------------------------------------
# One NGAP PDU


@dataclass
class NasMessage:
    frame: int
    layer: str  # 5GMM | 5GSM
    code: str  # raw message type, e.g. 0x44
    message: str
    cause: int | None = None
    cause_text: str | None = None
    values: dict[str, list[str]] = field(default_factory=dict)

    def first(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None

    @property
    def psi(self) -> int | None:
        value = self.first("nas_5gs.pdu_session_id")
        return int(value) if value is not None else None

    def suci(self) -> str | None:
        """The whole SUCI as one comparable string (all its parts, not the MSIN alone)."""
        parts = sorted((k, v[0]) for k, v in self.values.items() if k.startswith("nas_5gs.mm.suci."))
        if not parts:
            return None
        plmn = (self.first("e212.mcc"), self.first("e212.mnc"))
        return repr((plmn, parts))


@dataclass
class SessionItem:
    """One item of a PDU session resource list (setup request/response, failed list, release)."""

    role: str
    psi: int
    cause: dict[str, Any] | None = None
    values: dict[str, list[str]] = field(default_factory=dict)

    def first(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None


@dataclass
class NgapPdu:
    frame: int
    time: float
    procedure_code: int | None = None
    procedure: str | None = None
    pdu_type: str | None = None  # initiatingMessage | successfulOutcome | unsuccessfulOutcome
    ran_ue_id: str | None = None
    amf_ue_id: str | None = None
    source_amf_ue_id: str | None = None
    new_amf_ue_id: str | None = None
    reset_all: bool = False
    reset_pairs: list[tuple[str | None, str | None]] = field(default_factory=list)
    src: str | None = None  # ip:port of the sender
    dst: str | None = None
    assoc_index: int | None = None
    nas: list[NasMessage] = field(default_factory=list)
    nas_undecoded: int = 0  # security-protected NAS whose plain message did not decode
    causes: list[dict[str, Any]] = field(default_factory=list)
    items: list[SessionItem] = field(default_factory=list)
    tmsi: list[int] = field(default_factory=list)  # 5G-S-TMSI presented in NGAP (FiveG-S-TMSI IE)
    s2t_container: str | None = None
    ran_node: dict[str, str] = field(default_factory=dict)
    unreadable: str | None = None  # why the PDU could be read only in part

    @property
    def initiating(self) -> bool:
        return self.pdu_type == "initiatingMessage"


def pdus_in_frame(frame: int, tree: list[Node]) -> list[NgapPdu]:
    epoch = 0.0
    for name, value, _ in labelled(tree[:1]):
        if name == "frame.time_epoch" and value is not None:
            epoch = float(value)
            break
    src, dst, assoc_index = _transport(tree)
    pdus = []
    for node in protocol_nodes(tree, {"ngap"}):
        pdu = NgapPdu(frame=frame, time=epoch, src=src, dst=dst, assoc_index=assoc_index)
        try:
            _read_pdu(pdu, node)
        except ValueError as exc:  # a value this reader does not expect: say so, do not fail the whole answer
            pdu.unreadable = f"frame {frame}: {exc}"
        pdus.append(pdu)
    return pdus


def _transport(tree: list[Node]) -> tuple[str | None, str | None, int | None]:
    """(sender ip:port, receiver ip:port, SCTP association index) from the frame's top layers."""
    addresses: dict[str, str] = {}
    for node in tree:
        proto = node.get("f")
        if node.get("t") != "proto" or proto not in ("ip", "ipv6", "sctp"):
            continue
        values = {name: value for name, value, _ in labelled(node.get("n") or []) if value is not None}
        if proto in ("ip", "ipv6"):  # the network layer right under SCTP (the last one before it)
            addresses = {"src": values.get(f"{proto}.src", "?"), "dst": values.get(f"{proto}.dst", "?")}
            if proto == "ipv6":
                addresses = {k: f"[{v}]" for k, v in addresses.items()}
            continue
        index = values.get("sctp.assoc_index")
        assoc = int(index) if index is not None and int(index) != UNKNOWN_ASSOC_INDEX else None
        return (f"{addresses.get('src', '?')}:{values.get('sctp.srcport', '?')}",
                f"{addresses.get('dst', '?')}:{values.get('sctp.dstport', '?')}", assoc)
    return None, None, None


def _children(node: Node) -> list[Node]:
    children: list[Node] = node.get("n") or []
    return children


def _name_value(node: Node) -> tuple[str | None, str | None]:
    f = node.get("f")
    if not f:
        return None, None
    return parse_f(str(f))


def _top_level_ies(pdu_node: Node) -> Iterator[tuple[int | None, Node]]:
    """(ProtocolIE id, IE node) for each IE of the PDU's own protocolIEs list.

    Nested containers (e.g. PDUSessionResourceSetupRequestTransfer) have protocolIEs of their
    own; only the first list in tree order is the PDU's. A tree without that structure (hand-made
    or a future dissector) is read as one IE of unknown id.
    """
    stack = [pdu_node]
    while stack:
        node = stack.pop(0)
        name, _ = _name_value(node)
        if name == "ngap.protocolIEs":
            for item in _children(node):
                ie_id = None
                for sub in _descendants([item]):
                    sub_name, sub_value = _name_value(sub)
                    if sub_name == "ngap.id" and sub_value is not None:
                        ie_id = int(sub_value)
                        break
                yield ie_id, item
            return
        stack[0:0] = _children(node)
    yield None, pdu_node


def _descendants(nodes: list[Node]) -> Iterator[Node]:
    for node in nodes:
        yield node
        yield from _descendants(_children(node))


def _read_pdu(pdu: NgapPdu, node: Node) -> None:
    for name, value, label in labelled([node]):
        if value is None:
            continue
        if name == "ngap.NGAP_PDU" and pdu.pdu_type is None:  # the CHOICE index of the PDU
            pdu.pdu_type = PDU_TYPES.get(value, value)
        elif name == "ngap.procedureCode" and pdu.procedure_code is None:
            pdu.procedure_code = int(value)
            pdu.procedure = label_name(label).removeprefix("id-")
    for ie_id, ie in _top_level_ies(node):
        _read_ie(pdu, ie_id, ie)
    pdu.nas, pdu.nas_undecoded = nas_messages(pdu.frame, protocol_nodes([node], {"nas-5gs"}))
    pdu.causes.extend({"frame": pdu.frame, "kind": m.layer, "code": m.cause, "cause": m.cause_text,
                       "message": m.message} for m in pdu.nas if m.cause is not None)


def _cause(frame: int, name: str, value: str, label: str, procedure: str | None) -> dict[str, Any]:
    return {"frame": frame, "kind": "NGAP", "group": name.removeprefix("ngap."), "code": int(value),
            "cause": label_name(label), "procedure": procedure}


def _read_ie(pdu: NgapPdu, ie_id: int | None, ie: Node) -> None:
    role = SESSION_LIST_ROLES.get(ie_id) if ie_id is not None else None
    item: SessionItem | None = None
    pairs: list[list[str | None]] = []
    for name, value, label in labelled([ie]):
        if name == "ngap.nG_Interface" and ie_id == IE_RESET_TYPE:
            pdu.reset_all = True
        if value is None:
            continue
        if name in _INTEGER_FIELDS:
            value = str(_int(value))  # checked here, inside the reader's guard, so later int() cannot fail
        if name in NGAP_CAUSE_GROUPS:
            cause = _cause(pdu.frame, name, value, label, pdu.procedure)
            if item is not None:
                cause["pdu_session_id"] = item.psi
                item.cause = item.cause or cause
            pdu.causes.append(cause)
        elif name == "ngap.pDUSessionID" and role is not None:
            # Items list their session id first, then the transfer (tunnel, QFIs, cause).
            item = SessionItem(role=role, psi=int(value))
            pdu.items.append(item)
        elif item is not None and name in _ITEM_KEEP:
            item.values.setdefault(name, []).append(value)
        elif name in ("ngap.AMF_UE_NGAP_ID", "ngap.RAN_UE_NGAP_ID"):
            is_amf = name == "ngap.AMF_UE_NGAP_ID"
            if ie_id == IE_SOURCE_AMF_UE_NGAP_ID and is_amf:
                pdu.source_amf_ue_id = pdu.source_amf_ue_id or value
            elif ie_id == IE_NEW_AMF_UE_NGAP_ID and is_amf:
                pdu.new_amf_ue_id = pdu.new_amf_ue_id or value
            elif ie_id in (IE_RESET_TYPE, IE_CONNECTION_LIST):
                # Items of a reset list: each has an AMF id, a RAN id or both, AMF first.
                if is_amf or not pairs or pairs[-1][1] is not None:
                    pairs.append([None, None])
                pairs[-1][0 if is_amf else 1] = value
            elif is_amf and pdu.amf_ue_id is None:
                pdu.amf_ue_id = value
            elif not is_amf and pdu.ran_ue_id is None:
                pdu.ran_ue_id = value
        elif name == "ngap.fiveG_TMSI" and ie_id == IE_FIVEG_S_TMSI:
            pdu.tmsi.append(_int(value))
        elif name == "ngap.SourceToTarget_TransparentContainer" and ie_id == IE_SOURCE_TO_TARGET_CONTAINER:
            pdu.s2t_container = value
        elif name == "ngap.RANNodeName" and ie_id == IE_RAN_NODE_NAME:
            pdu.ran_node["ran_node_name"] = value
        elif name in ("ngap.gNB_ID", "ngap.ngENB_ID", "ngap.n3IWF_ID") and ie_id == IE_GLOBAL_RAN_NODE_ID:
            pdu.ran_node["ran_node_id"] = f"{name.removeprefix('ngap.')} {value}"
    pdu.reset_pairs.extend((p[0], p[1]) for p in pairs)


def _int(value: str) -> int:
    """Integers as tshark prints them: decimal (leading zeros allowed), 0x-hex, or colon-separated bytes."""
    if ":" in value:
        return int(value.replace(":", ""), 16)
    return int(value, 16) if value.lower().startswith("0x") else int(value, 10)


def nas_messages(frame: int, nas_nodes: list[Node]) -> tuple[list[NasMessage], int]:
    """Every plain NAS message under these nas-5gs nodes, outer before inner, each with its own fields.

    A message node is one with a message-type field among its direct children; its fields are its
    descendants minus nested messages (a DL NAS transport's own PDU session id is not its
    5GSM payload's). Also counts security-protected NAS that did not decode into a plain message.
    """
    out: list[NasMessage] = []
    undecoded = 0

    def message_type(node: Node) -> tuple[str, str, str] | None:
        for child in _children(node):
            name, value = _name_value(child)
            if name in _MESSAGE_TYPES and value is not None:
                return _MESSAGE_TYPES[name], value, label_name(str(child.get("l", "")))
        return None

    def gather(node: Node, message: NasMessage) -> None:
        for child in _children(node):
            if message_type(child) is not None:
                visit(child)
                continue
            name, value = _name_value(child)
            if name is not None and value is not None:
                if name in ("nas_5gs.mm.5gmm_cause", "nas_5gs.sm.5gsm_cause") and message.cause is None:
                    message.cause = int(value)
                    message.cause_text = label_name(str(child.get("l", "")))
                elif name in _NAS_KEEP or name.startswith("nas_5gs.mm.suci."):
                    message.values.setdefault(name, []).append(str(_int(value)) if name in _INTEGER_FIELDS
                                                               else value)
            gather(child, message)

    def visit(node: Node) -> None:
        found = message_type(node)
        if found is None:
            for child in _children(node):
                visit(child)
            return
        layer, code, text = found
        message = NasMessage(frame=frame, layer=layer, code=code, message=text)
        out.append(message)
        gather(node, message)

    for nas in nas_nodes:
        before = len(out)
        visit(nas)
        protected = any(name == "nas_5gs.security_header_type" and value not in (None, "0")
                        for name, value, _ in labelled([nas]))
        if len(out) == before and protected:
            undecoded += 1
    return out, undecoded


# ---------------------------------------------------------------------------------------------
# What is a failure


def _normal_ngap_cause(cause: dict[str, Any]) -> bool:
    return cause["cause"] in NORMAL_NGAP_CAUSES.get(cause["group"], set())


def pdu_failures(pdu: NgapPdu) -> list[dict[str, Any]]:
    """The failures one PDU reports, each with its reason (`why`)."""
    out: list[dict[str, Any]] = []
    ngap_causes = [c for c in pdu.causes if c["kind"] == "NGAP"]
    top_causes = [c for c in ngap_causes if "pdu_session_id" not in c]
    if pdu.pdu_type == "unsuccessfulOutcome":
        out.extend({**c, "why": f"{pdu.procedure} failed (unsuccessfulOutcome)"} for c in top_causes[:1])
        if not top_causes:
            out.append({"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                        "procedure": pdu.procedure, "why": f"{pdu.procedure} failed (unsuccessfulOutcome)"})
    elif pdu.procedure_code in (PROC_ERROR_INDICATION, PROC_NAS_NON_DELIVERY):
        out.extend({**c, "why": pdu.procedure} for c in top_causes[:1])
        if not top_causes:
            out.append({"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                        "procedure": pdu.procedure, "why": pdu.procedure})
    elif pdu.procedure_code in RELEASE_PROCEDURES and pdu.initiating:
        out.extend({**c, "why": f"abnormal release cause in {pdu.procedure}"} for c in ngap_causes
                   if not _normal_ngap_cause(c))
    for item in pdu.items:
        if item.role.endswith("-failed"):
            cause = item.cause or {"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                                   "procedure": pdu.procedure, "pdu_session_id": item.psi}
            out.append({**cause, "why": f"PDU session {item.psi}: {item.role.replace('-', ' ')} in {pdu.procedure}"})
    for message in pdu.nas:
        base = {"frame": pdu.frame, "kind": message.layer, "code": message.cause, "cause": message.cause_text,
                "message": message.message}
        if message.code in NAS_FAILURE_MESSAGES:
            out.append({**base, "why": message.message})
        elif message.code == NAS_DL_TRANSPORT and message.cause is not None:
            out.append({**base, "why": "the AMF returned an unforwarded 5GSM message (DL NAS transport with a "
                                       "5GMM cause)"})
        elif message.code in NAS_RELEASES and message.cause is not None \
                and message.cause not in NORMAL_5GSM_RELEASE_CAUSES:
            out.append({**base, "why": f"abnormal cause in {message.message}"})
    return out


# ---------------------------------------------------------------------------------------------
# Associations and UE contexts


@dataclass
class Association:
    key: tuple[str, str, int | None]  # sorted endpoints, SCTP association index
    label: str
    first_frame: int
    pdus: list[NgapPdu] = field(default_factory=list)
    amf: str | None = None
    gnb: str | None = None
    ran_node: dict[str, str] = field(default_factory=dict)
    procedures: list[dict[str, Any]] = field(default_factory=list)  # non-UE-associated
    failures: list[dict[str, Any]] = field(default_factory=list)
    by_ran: dict[int, Context] = field(default_factory=dict)  # live contexts
    by_amf: dict[int, Context] = field(default_factory=dict)
    pending: dict[int, list[NgapPdu]] = field(default_factory=dict)  # non-UE class-1 requests

    def describe(self) -> dict[str, Any]:
        return {"association": self.label, "endpoints": list(self.key[:2]), "sctp_assoc_index": self.key[2],
                "gnb": self.gnb, "amf": self.amf, **self.ran_node, "first_frame": self.first_frame,
                "ngap_pdus": len(self.pdus)}


@dataclass
class Context:
    number: int
    assoc: Association
    ran: int | None = None
    amf: int | None = None
    amf_ids: list[int] = field(default_factory=list)
    pdus: list[NgapPdu] = field(default_factory=list)
    closed: str | None = None
    pending: dict[int, list[NgapPdu]] = field(default_factory=dict)
    label: str = ""

    def bind(self, ran: int | None, amf: int | None) -> None:
        if ran is not None and self.ran is None:
            self.ran = ran
            self.assoc.by_ran[ran] = self
        if amf is not None and amf not in self.amf_ids:
            self.amf_ids.append(amf)
            self.amf = self.amf if self.amf is not None else amf
            self.assoc.by_amf[amf] = self

    def close(self, why: str) -> None:
        if self.closed is None:
            self.closed = why
        if self.ran is not None and self.assoc.by_ran.get(self.ran) is self:
            del self.assoc.by_ran[self.ran]
        for amf in self.amf_ids:
            if self.assoc.by_amf.get(amf) is self:
                del self.assoc.by_amf[amf]


@dataclass
class Analysis:
    associations: list[Association]
    contexts: list[Context]
    owner: dict[int, Context | None]  # id(pdu) -> its UE context (None: not UE-associated)
    pdus: list[NgapPdu]
    links: list[dict[str, Any]]
    groups: dict[int, int]  # context number -> group number (linked contexts only)
    warnings: list[str]


def _opt_int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def analyse(pdus: list[NgapPdu]) -> Analysis:
    associations: dict[tuple[str, str, int | None], Association] = {}
    contexts: list[Context] = []
    owner: dict[int, Context | None] = {}

    def association(pdu: NgapPdu) -> Association:
        ends = sorted((pdu.src or "?", pdu.dst or "?"))
        key = (ends[0], ends[1], pdu.assoc_index)
        if key not in associations:
            associations[key] = Association(key, f"A{len(associations) + 1}", pdu.frame)
        return associations[key]

    def new_context(assoc: Association) -> Context:
        ctx = Context(len(contexts) + 1, assoc)
        contexts.append(ctx)
        return ctx

    for pdu in pdus:
        assoc = association(pdu)
        assoc.pdus.append(pdu)
        _learn_sides(assoc, pdu)
        ran, amf = _opt_int(pdu.ran_ue_id), _opt_int(pdu.amf_ue_id)
        ctx = _context_for(assoc, pdu, ran, amf, new_context)
        owner[id(pdu)] = ctx
        step_owner: Context | Association = ctx if ctx is not None else assoc
        _pair_outcome(step_owner.pending, pdu)
        if ctx is None:
            assoc.procedures.append(_step(pdu))
            assoc.failures.extend(pdu_failures(pdu))
            if pdu.procedure_code == PROC_NG_RESET and pdu.initiating:
                _reset(assoc, pdu)
            continue
        ctx.pdus.append(pdu)
        if pdu.new_amf_ue_id is not None:
            ctx.bind(None, int(pdu.new_amf_ue_id))
        if pdu.procedure_code == PROC_UE_CONTEXT_RELEASE and pdu.pdu_type == "successfulOutcome":
            ctx.close(f"UEContextReleaseComplete in frame {pdu.frame}")
    links, groups = _link(contexts)
    warnings = []
    if any(a.key[2] is None for a in associations.values()):
        warnings.append("some NGAP frames have no SCTP association index: their contexts are keyed by the two "
                        "endpoints only (a restarted association on the same ports is not told apart)")
    unreadable = [p.unreadable for p in pdus if p.unreadable]
    if unreadable:
        warnings.append(f"{len(unreadable)} NGAP PDUs were read only in part: {unreadable[:5]}")
    undecoded = sum(p.nas_undecoded for p in pdus)
    if undecoded:
        warnings.append(f"{undecoded} security-protected NAS PDUs did not decode into a plain message (ciphered "
                        "with a real algorithm, or null_decipher=false): their registrations, rejects and "
                        "PDU sessions are invisible")
    headless = [c for c in contexts if not any(p.procedure_code == PROC_INITIAL_UE_MESSAGE for p in c.pdus)]
    if headless:
        warnings.append(f"{len(headless)} UE contexts have no InitialUEMessage in the capture (it started "
                        "after them, or the display filter left it out)")
    for ctx in contexts:
        ctx.label = f"{ctx.assoc.label}/amf-{_show(ctx.amf)}/ran-{_show(ctx.ran)}"
    seen: dict[str, int] = {}
    for ctx in contexts:  # ids reused within one association: same pair, later context
        seen[ctx.label] = seen.get(ctx.label, 0) + 1
        if seen[ctx.label] > 1:
            ctx.label += f"#{seen[ctx.label]}"
    return Analysis(list(associations.values()), contexts, owner, pdus, links, groups, warnings)


def _show(value: int | None) -> str:
    return "?" if value is None else str(value)


def _learn_sides(assoc: Association, pdu: NgapPdu) -> None:
    if pdu.ran_node:
        assoc.ran_node.update(pdu.ran_node)
    if assoc.amf is not None or pdu.src is None or pdu.dst is None:
        return
    if pdu.src.endswith(f":{NGAP_SCTP_PORT}") != pdu.dst.endswith(f":{NGAP_SCTP_PORT}"):
        assoc.amf, assoc.gnb = (pdu.src, pdu.dst) if pdu.src.endswith(f":{NGAP_SCTP_PORT}") else (pdu.dst, pdu.src)
    elif pdu.procedure_code in GNB_SENDS and pdu.initiating:
        assoc.gnb, assoc.amf = pdu.src, pdu.dst


def _context_for(assoc: Association, pdu: NgapPdu, ran: int | None, amf: int | None,
                 new_context: Any) -> Context | None:
    """The UE context a PDU belongs to, by the ids it carries, inside its own association."""
    if ran is None and amf is None:
        return None
    if pdu.procedure_code == PROC_INITIAL_UE_MESSAGE and pdu.initiating:
        stale = assoc.by_ran.get(ran) if ran is not None else None
        if stale is not None:
            stale.close(f"RAN-UE-NGAP-ID reused by InitialUEMessage in frame {pdu.frame}")
        ctx: Context = new_context(assoc)
        ctx.bind(ran, amf)
        return ctx
    by_ran = assoc.by_ran.get(ran) if ran is not None else None
    by_amf = assoc.by_amf.get(amf) if amf is not None else None
    chosen: Context | None = None
    if by_ran is not None and (amf is None or by_ran.amf is None or amf in by_ran.amf_ids):
        chosen = by_ran
    elif by_amf is not None and (ran is None or by_amf.ran is None):
        chosen = by_amf  # e.g. HandoverRequestAcknowledge: the target's RAN id for a context the AMF opened
    for stale in (by_ran, by_amf):  # the pair names another live context: its ids were reused
        if stale is not None and stale is not chosen:
            stale.close(f"ids reused by a different UE in frame {pdu.frame}")
    if chosen is None:
        chosen = new_context(assoc)
    chosen.bind(ran, amf)
    return chosen


def _pair_outcome(pending: dict[int, list[NgapPdu]], pdu: NgapPdu) -> None:
    code = pdu.procedure_code
    if code is None or code not in CLASS1_PROCEDURES:
        return
    if pdu.initiating:
        pending.setdefault(code, []).append(pdu)
    elif pending.get(code):
        pending[code].pop(0)


def _reset(assoc: Association, pdu: NgapPdu) -> None:
    if pdu.reset_all:
        for ctx in {id(c): c for c in [*assoc.by_ran.values(), *assoc.by_amf.values()]}.values():
            ctx.close(f"NGReset (whole interface) in frame {pdu.frame}")
        return
    for amf, ran in pdu.reset_pairs:
        for listed in (assoc.by_amf.get(int(amf)) if amf else None, assoc.by_ran.get(int(ran)) if ran else None):
            if listed is not None:
                listed.close(f"NGReset in frame {pdu.frame}")


def _step(pdu: NgapPdu) -> dict[str, Any]:
    return {"frame": pdu.frame, "procedure": pdu.procedure, "code": pdu.procedure_code, "type": pdu.pdu_type}


class _Groups:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        while self.parent.setdefault(x, x) != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(b)] = self.find(a)


def _link(contexts: list[Context]) -> tuple[list[dict[str, Any]], dict[int, int]]:
    """Links between contexts of the same UE, each with its evidence; never a merge."""
    links: list[dict[str, Any]] = []
    groups = _Groups()
    first_suci: dict[str, tuple[Context, int]] = {}
    tmsi_seen: dict[int, tuple[Context, int, str]] = {}
    containers: dict[str, tuple[Context, int]] = {}

    def link(a: Context, b: Context, evidence: str, frames: list[int]) -> None:
        if a is b or groups.find(a.number) == groups.find(b.number):
            return
        groups.union(a.number, b.number)
        links.append({"from": a, "to": b, "evidence": evidence, "frames": frames})

    for ctx in contexts:
        for pdu in ctx.pdus:
            for message in pdu.nas:
                suci = message.suci()
                if suci is not None:
                    if suci in first_suci:
                        other, frame = first_suci[suci]
                        link(other, ctx, "same SUCI", [frame, pdu.frame])
                    else:
                        first_suci[suci] = (ctx, pdu.frame)
                tmsi = message.first("nas_5gs.5g_tmsi")
                if tmsi is not None:
                    how = "assigned" if message.code in NAS_TMSI_ASSIGNERS else "presented"
                    _tmsi(_int(tmsi), ctx, pdu.frame, how, tmsi_seen, link)
            for value in pdu.tmsi:
                _tmsi(value, ctx, pdu.frame, "presented", tmsi_seen, link)
            if pdu.s2t_container is not None and pdu.initiating:
                if pdu.procedure_code == PROC_HANDOVER_PREPARATION:
                    containers[pdu.s2t_container] = (ctx, pdu.frame)
                elif pdu.procedure_code == PROC_HANDOVER_RESOURCE_ALLOCATION and pdu.s2t_container in containers:
                    source, frame = containers[pdu.s2t_container]
                    link(source, ctx, "handover: the same SourceToTarget-TransparentContainer in HandoverRequired "
                         "and HandoverRequest", [frame, pdu.frame])
            if pdu.procedure_code == PROC_PATH_SWITCH and pdu.initiating and pdu.source_amf_ue_id is not None:
                switched = _path_switch_source(contexts, ctx, int(pdu.source_amf_ue_id), pdu.frame)
                if switched is not None:
                    link(switched, ctx, "path switch: SourceAMF-UE-NGAP-ID names the source context", [pdu.frame])
    members: dict[int, list[int]] = {}
    for ctx in contexts:
        members.setdefault(groups.find(ctx.number), []).append(ctx.number)
    numbers: dict[int, int] = {}
    for member_list in (m for m in members.values() if len(m) > 1):
        group = len(set(numbers.values())) + 1
        numbers.update((m, group) for m in member_list)
    return links, numbers


def _tmsi(value: int, ctx: Context, frame: int, how: str, seen: dict[int, tuple[Context, int, str]],
          link: Any) -> None:
    """Link a context presenting a 5G-TMSI to the one that last assigned (or presented) it.

    Two assignments of one value are no evidence (the AMF may hand a freed TMSI to another UE).
    The 5G-TMSI alone (without AMF set/pointer) identifies the UE within one AMF set, which is
    what one capture of one core shows.
    """
    if how == "presented" and value in seen:
        other, other_frame, other_how = seen[value]
        link(other, ctx, f"5G-TMSI {other_how} in frame {other_frame}, presented in frame {frame}",
             [other_frame, frame])
    seen[value] = (ctx, frame, how)


def _path_switch_source(contexts: list[Context], target: Context, amf_id: int, frame: int) -> Context | None:
    """The latest context with that AMF-UE-NGAP-ID at the same AMF address, on another association."""
    amf_ip = (target.assoc.amf or "").rsplit(":", 1)[0]
    best = None
    for ctx in contexts:
        if ctx is target or ctx.assoc is target.assoc or amf_id not in ctx.amf_ids:
            continue
        if (ctx.assoc.amf or "").rsplit(":", 1)[0] != amf_ip or not ctx.pdus or ctx.pdus[0].frame > frame:
            continue
        best = ctx
    return best


# ---------------------------------------------------------------------------------------------
# The two summaries


def _unanswered(pending: dict[int, list[NgapPdu]], assoc: Association
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(failures, still pending at capture end) for class-1 requests that got no outcome.

    A request is a failure only when its association carried later NGAP traffic: the capture was
    still running and the peer still talking. One at the very end may just be cut off.
    """
    failures, open_ = [], []
    last = assoc.pdus[-1]
    for requests in pending.values():
        for pdu in requests:
            entry = {"frame": pdu.frame, "kind": "NGAP", "group": None, "code": None, "cause": None,
                     "procedure": pdu.procedure}
            if last.frame > pdu.frame:
                failures.append({**entry, "why": f"no response to {pdu.procedure} request (the association "
                                 f"carried NGAP until frame {last.frame}, {round(last.time - pdu.time, 6)} s later)"})
            else:
                open_.append({**entry, "why": "capture ends before any response could be seen"})
    return failures, open_


def ue_sessions(pdus: list[NgapPdu], filtered: bool = False) -> dict[str, Any]:
    analysis = analyse(pdus)
    ues = []
    for ctx in analysis.contexts:
        ues.append(_describe_context(ctx, analysis))
    failed = [{"ue": u["ue"], "association": u["association"], "amf_ue_ngap_id": u["amf_ue_ngap_id"],
               "ran_ue_ngap_id": u["ran_ue_ngap_id"],
               "reasons": [{k: f.get(k) for k in ("frame", "kind", "code", "cause", "why")} for f in u["failures"]]}
              for u in ues if u["failures"]]
    associations = []
    non_ue_failures: list[dict[str, Any]] = []
    for assoc in analysis.associations:
        failures, open_ = _unanswered(assoc.pending, assoc)
        non_ue_failures.extend({"association": assoc.label, **f} for f in [*assoc.failures, *failures])
        associations.append({**assoc.describe(), "ue_contexts": sum(1 for c in analysis.contexts if c.assoc is assoc),
                             "procedures": assoc.procedures, "pending_requests": open_})
    groups: dict[int, dict[str, Any]] = {}
    for link in analysis.links:
        group = analysis.groups[link["from"].number]
        entry = groups.setdefault(group, {"group": group, "ues": [], "evidence": []})
        entry["evidence"].append({"ue": link["to"].label, "linked_to": link["from"].label,
                                  "evidence": link["evidence"], "frames": link["frames"]})
    for ctx in analysis.contexts:
        if ctx.number in analysis.groups:
            groups[analysis.groups[ctx.number]]["ues"].append(ctx.label)
    warnings = list(analysis.warnings)
    if filtered:
        warnings.append("display_filter given: contexts, links and unanswered requests are judged on the "
                        "filtered NGAP frames only")
    result: dict[str, Any] = {
        "ue_count": len(ues), "ues": ues, "failed_ues": failed, "associations": associations,
        "linked_ue_groups": sorted(groups.values(), key=lambda g: int(g["group"])),
        "non_ue_failures": non_ue_failures, "ngap_pdus": len(pdus), "warnings": warnings,
    }
    if not ues:
        result["reason"] = ("no UE-associated NGAP PDU (only non-UE procedures such as NGSetup)" if pdus
                            else "no NGAP over SCTP in the capture" + (" that matches the display filter"
                                                                       if filtered else ""))
    return result


def _describe_context(ctx: Context, analysis: Analysis) -> dict[str, Any]:
    failures: list[dict[str, Any]] = []
    nas_messages_: list[dict[str, Any]] = []
    registration = "unknown"
    suci_msin = tmsi = None
    plmn = None
    waiting_registration: NasMessage | None = None
    for pdu in ctx.pdus:
        failures.extend(pdu_failures(pdu))
        for message in pdu.nas:
            nas_messages_.append({"frame": pdu.frame, "layer": message.layer, "code": message.code,
                                  "message": message.message})
            suci_msin = suci_msin or message.first("nas_5gs.mm.suci.msin")
            if message.code in NAS_TMSI_ASSIGNERS:
                tmsi = message.first("nas_5gs.5g_tmsi") or tmsi
            if plmn is None and message.first("nas_5gs.mm.suci.msin") and message.first("e212.mcc"):
                plmn = {"mcc": message.first("e212.mcc"), "mnc": message.first("e212.mnc")}
            if message.code == NAS_REGISTRATION_REQUEST:
                waiting_registration = message
            elif message.code in (NAS_REGISTRATION_ACCEPT, NAS_REGISTRATION_REJECT):
                registration = "accepted" if message.code == NAS_REGISTRATION_ACCEPT else "rejected"
                waiting_registration = None
            elif message.code in NAS_DEREGISTRATIONS:
                registration = "deregistered" if registration != "rejected" else registration
    unanswered, open_ = _unanswered(ctx.pending, ctx.assoc)
    failures.extend(unanswered)
    if waiting_registration is not None and ctx.assoc.pdus[-1].frame > waiting_registration.frame:
        failures.append({"frame": waiting_registration.frame, "kind": "5GMM", "code": None, "cause": None,
                         "message": waiting_registration.message,
                         "why": "registration request never accepted or rejected (the association carried later "
                                "NGAP)"})
    failures.sort(key=lambda f: int(f["frame"]))
    first, last = ctx.pdus[0].time, ctx.pdus[-1].time
    return {
        "ue": ctx.label, "association": ctx.assoc.label, "gnb": ctx.assoc.gnb, "amf": ctx.assoc.amf,
        "ran_ue_ngap_id": ctx.ran, "amf_ue_ngap_id": ctx.amf,
        **({"amf_ue_ngap_ids": ctx.amf_ids} if len(ctx.amf_ids) > 1 else {}),
        "suci_msin": suci_msin, "5g_tmsi": tmsi, "plmn": plmn,
        "first_time": round(first, 6), "last_time": round(last, 6), "duration_s": round(last - first, 6),
        "frames": list(dict.fromkeys(p.frame for p in ctx.pdus)),
        "procedures": [_step(p) for p in ctx.pdus], "nas_messages": nas_messages_,
        "failures": failures, "pending_requests": open_, "registration": registration,
        "ended": ctx.closed, "linked_group": analysis.groups.get(ctx.number),
    }


def pdu_sessions(pdus: list[NgapPdu], filtered: bool = False) -> dict[str, Any]:
    analysis = analyse(pdus)
    sessions: list[dict[str, Any]] = []
    current: dict[tuple[int, int], dict[str, Any]] = {}
    counts: dict[tuple[int, int], int] = {}
    unmatched: list[int] = []

    def new(ctx: Context, psi: int, frame: int) -> dict[str, Any]:
        key = (ctx.number, psi)
        counts[key] = counts.get(key, 0) + 1
        s: dict[str, Any] = {
            "ue": ctx.label, "association": ctx.assoc.label, "ran_ue_ngap_id": ctx.ran,
            "amf_ue_ngap_id": ctx.amf, "pdu_session_id": psi, "establishment": counts[key], "first_frame": frame,
            "establishment_request_frame": None, "dnn": None, "s_nssai": None,
            "establishment_accept_frame": None, "accept_in_n2_setup": False, "ue_ipv4": None,
            "establishment_reject_frame": None, "setup_request_frame": None, "setup_response_frame": None,
            "setup_result": None, "n3_uplink": None, "n3_downlink": None, "qfis": [], "failures": [],
            "returned_by_amf_frame": None, "release": None, "status": "unknown",
        }
        sessions.append(s)
        current[key] = s
        return s

    def session(ctx: Context, psi: int, frame: int) -> dict[str, Any]:
        return current.get((ctx.number, psi)) or new(ctx, psi, frame)

    for pdu in analysis.pdus:
        ctx = analysis.owner.get(id(pdu))
        if ctx is None:
            continue
        for message in pdu.nas:
            psi = message.psi
            if message.code == NAS_DL_TRANSPORT and message.cause is not None and psi is not None:
                s = session(ctx, psi, pdu.frame)
                s["returned_by_amf_frame"] = pdu.frame
                s["failures"].append({"frame": pdu.frame, "kind": "5GMM", "code": message.cause,
                                      "cause": message.cause_text, "message": message.message})
            if message.layer != "5GSM" or psi is None:
                continue
            if message.code == NAS_ESTABLISHMENT_REQUEST:
                s = new(ctx, psi, pdu.frame)
                s["establishment_request_frame"] = pdu.frame
                s["dnn"] = message.first("nas_5gs.cmn.dnn")
            else:
                s = session(ctx, psi, pdu.frame)
            if message.code == NAS_ESTABLISHMENT_ACCEPT:
                s["establishment_accept_frame"] = pdu.frame
                s["accept_in_n2_setup"] = pdu.initiating and pdu.procedure_code in (
                    PROC_PDU_SESSION_SETUP, PROC_INITIAL_CONTEXT_SETUP)
                s["ue_ipv4"] = message.first("nas_5gs.sm.pdu_addr_inf_ipv4")
                s["dnn"] = s["dnn"] or message.first("nas_5gs.cmn.dnn")
            elif message.code == NAS_ESTABLISHMENT_REJECT:
                s["establishment_reject_frame"] = pdu.frame
            elif message.code in NAS_RELEASES or message.code == "0xd4":
                release = s["release"] = s["release"] or {}
                release[{"0xd1": "request_frame", "0xd3": "command_frame", "0xd4": "complete_frame"}[
                    message.code]] = pdu.frame
                if message.cause is not None:
                    release.update(cause=message.cause, cause_text=message.cause_text,
                                   normal=message.cause in NORMAL_5GSM_RELEASE_CAUSES)
            if message.first("nas_5gs.mm.sst") and s["s_nssai"] is None:
                s["s_nssai"] = {"sst": message.first("nas_5gs.mm.sst")}
            if message.code in NAS_FAILURE_MESSAGES or (message.code in NAS_RELEASES and message.cause is not None
                                                        and message.cause not in NORMAL_5GSM_RELEASE_CAUSES):
                s["failures"].append({"frame": pdu.frame, "kind": "5GSM", "code": message.cause,
                                      "cause": message.cause_text, "message": message.message})
        for item in pdu.items:
            tunnel = {"address": item.first("ngap.TransportLayerAddressIPv4"), "teid": item.first("ngap.gTP_TEID")}
            if item.role == "setup-request":
                s = session(ctx, item.psi, pdu.frame)
                if s["setup_request_frame"] is not None and s["setup_result"] is not None:
                    continue  # a later user-plane (re)activation of an established session, not its establishment
                s["setup_request_frame"] = pdu.frame
                s["n3_uplink"] = tunnel
                s["qfis"] = sorted({int(q) for q in item.values.get("ngap.qosFlowIdentifier", [])})
                if item.first("ngap.sST"):
                    s["s_nssai"] = {"sst": item.first("ngap.sST"), "sd": item.first("ngap.sD")}
            elif item.role in ("setup-ok", "setup-failed"):
                found = current.get((ctx.number, item.psi))
                if found is None or found["setup_request_frame"] is None or found["setup_response_frame"] is not None:
                    unmatched.append(pdu.frame)  # answers no request seen in the capture: it opens no session
                    continue
                s = found
                s["setup_response_frame"] = pdu.frame
                s["setup_result"] = "setup" if item.role == "setup-ok" else "failed"
                if item.role == "setup-ok":
                    s["n3_downlink"] = tunnel
                else:
                    s["failures"].append({k: v for k, v in (item.cause or {"frame": pdu.frame, "kind": "NGAP",
                                                                           "code": None, "cause": None}).items()
                                          if k != "pdu_session_id"})
    context_failures = {c.number: [f for p in c.pdus for f in pdu_failures(p)] for c in analysis.contexts}
    by_label = {c.label: c for c in analysis.contexts}
    for s in sessions:
        s["status"] = _session_status(s)
        if s["status"] == "no_answer":
            # No 5GSM answer; what the UE context reported next is the likely reason (e.g. a 5GMM status).
            later = [f for f in context_failures[by_label[s["ue"]].number]
                     if int(f["frame"]) > int(s["establishment_request_frame"])]
            if later:
                f = later[0]
                s["hint"] = f"the UE context reported {f.get('message') or f.get('procedure')} " \
                            f"(cause {f['code']}: {f['cause']}) in frame {f['frame']} after this request"
    sessions.sort(key=lambda s: (int(s["first_frame"]), s["ue"], int(s["pdu_session_id"])))
    established = [s for s in sessions if s["status"] == "established"]
    rejected = [s for s in sessions if s["status"] in ("rejected", "setup_failed")]
    result: dict[str, Any] = {
        "session_count": len(sessions), "established_count": len(established), "rejected_count": len(rejected),
        "sessions": sessions, "rejected": rejected,
        "incomplete": [{"ue": s["ue"], "pdu_session_id": s["pdu_session_id"], "status": s["status"]}
                       for s in sessions if s["status"] not in ("established", "rejected", "setup_failed")],
        "warnings": list(analysis.warnings) + (
            ["display_filter given: sessions are built from the filtered NGAP frames only"] if filtered else []) + (
            [f"N2 PDU session setup responses without a request in the capture (frames {unmatched[:20]}): ignored"]
            if unmatched else []),
    }
    if not sessions:
        result["reason"] = ("no NGAP over SCTP in the capture" + (" that matches the display filter" if filtered
                                                                    else "") if not pdus else
                            "no PDU session establishment (5GSM) and no N2 PDU session resource setup in the NGAP "
                            "PDUs" + ("; NAS did not decode, see warnings" if any(p.nas_undecoded for p in pdus)
                                      else ""))
    return result


def _session_status(s: dict[str, Any]) -> str:
    if s["establishment_reject_frame"] is not None or s["returned_by_amf_frame"] is not None:
        return "rejected"
    if s["setup_result"] == "failed":
        return "setup_failed"
    if s["establishment_accept_frame"] is not None:
        if not s["accept_in_n2_setup"]:
            return "accepted_without_n2_setup"
        return "established" if s["setup_result"] == "setup" else "no_setup_response"
    if s["establishment_request_frame"] is not None:
        return "no_answer"
    return "n2_setup_without_nas" if s["setup_request_frame"] is not None else "unknown"
