"""One NGAP PDU read from its own protocol subtree: its procedure, UE ids, causes, PDU session items
and the NAS messages it carries."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from diagd.actors.pcap.ngap.codes import (
    IE_CONNECTION_LIST,
    IE_FIVEG_S_TMSI,
    IE_GLOBAL_RAN_NODE_ID,
    IE_NAS_PDU,
    IE_NEW_AMF_UE_NGAP_ID,
    IE_RAN_NODE_NAME,
    IE_RESET_TYPE,
    IE_SOURCE_AMF_UE_NGAP_ID,
    IE_SOURCE_TO_TARGET_CONTAINER,
    IE_UE_PAGING_IDENTITY,
    INTEGER_FIELDS,
    ITEM_KEEP,
    MESSAGE_TYPES,
    NAS_DL_TRANSPORT,
    NAS_KEEP,
    NGAP_CAUSE_GROUPS,
    PDU_TYPES,
    PROC_NAS_NON_DELIVERY,
    SESSION_LIST_ROLES,
    UNKNOWN_ASSOC_INDEX,
)
from diagd.actors.pcap.shark.tree import Node, label_name, labelled, parse_f, protocol_nodes

# The frames the NGAP model reads (answers.ngap_pdus; index/ngap_pdus.py): NGAP carried by SCTP.
FRAMES_FILTER = "ngap && sctp"


class STmsi(NamedTuple):
    """A 5G-S-TMSI (TS 23.003 2.10.1): AMF Set ID (10 bits), AMF Pointer (6 bits) and 5G-TMSI."""

    amf_set_id: int
    amf_pointer: int
    tmsi: int

    def words(self) -> str:
        return f"AMF Set ID {self.amf_set_id}, AMF Pointer {self.amf_pointer}, 5G-TMSI {self.tmsi}"

    def describe(self) -> dict[str, int]:
        return {"amf_set_id": self.amf_set_id, "amf_pointer": self.amf_pointer, "5g_tmsi": self.tmsi}


@dataclass
class NasMessage:
    frame: int
    layer: str  # 5GMM | 5GSM
    code: str  # raw message type, e.g. 0x44
    message: str
    cause: int | None = None
    cause_text: str | None = None
    values: dict[str, list[str]] = field(default_factory=dict)
    outer: str | None = None  # "5GMM 0x5e": the message whose container carries this one (None: top level)
    # A 5GSM message the AMF handed back unforwarded, inside a DL NAS TRANSPORT with a 5GMM cause
    # (TS 24.501 5.4.5.2.5): the UE's own earlier message, not a new one.
    returned: bool = False

    def first(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None

    @property
    def psi(self) -> int | None:
        value = self.first("nas_5gs.pdu_session_id")
        return int(value) if value is not None else None

    def s_tmsis(self) -> list[STmsi]:
        """The 5G-S-TMSIs its 5GS mobile identities give: a 5G-S-TMSI, or the one a 5G-GUTI holds."""
        parts = [self.values.get(n, []) for n in ("nas_5gs.amf_set_id", "nas_5gs.amf_pointer", "nas_5gs.5g_tmsi")]
        return [STmsi(int(a), int(p), int(t)) for a, p, t in zip(*parts, strict=False)]

    def suci(self) -> str | None:
        """The whole SUCI as one comparable string (all its parts, not the MSIN alone)."""
        parts = sorted((k, v[0]) for k, v in self.values.items() if k.startswith("nas_5gs.mm.suci."))
        if not parts:
            return None
        plmn = (self.first("e212.mcc"), self.first("e212.mnc"))
        return repr((plmn, parts))


# Where a session item's GTP tunnels sit (TS 38.413 9.3.4.1 PDU Session Resource Setup Request Transfer,
# 9.3.4.2 ... Response Transfer): the IE of the transfer by its id, or the response transfer's member.
UL_TUNNEL, ADDITIONAL_UL_TUNNEL = "UL-NGU-UP-TNLInformation", "AdditionalUL-NGU-UP-TNLInformation"
DL_TUNNEL, ADDITIONAL_DL_TUNNEL = "dLQosFlowPerTNLInformation", "additionalDLQosFlowPerTNLInformation"
TUNNEL_IES = {139: UL_TUNNEL, 126: ADDITIONAL_UL_TUNNEL}
TUNNEL_MEMBERS = {DL_TUNNEL, ADDITIONAL_DL_TUNNEL}


@dataclass
class Tunnel:
    """One GTP-U tunnel end (UP Transport Layer Information, TS 38.413 9.3.2.2): its transport layer address,
    a BIT STRING of 32 bits (IPv4), 128 (IPv6) or 160 (IPv4 then IPv6: a dual-stack end, TS 38.414 5.1),
    whose parts Wireshark shows under it, and its GTP-TEID."""

    where: str  # the transfer's IE or member holding it (UL_TUNNEL, ADDITIONAL_UL_TUNNEL, DL_TUNNEL, ...)
    ipv4: str | None = None
    ipv6: str | None = None
    teid: str | None = None

    def describe(self) -> dict[str, str | None]:
        """`address` (the IPv4, or the IPv6 of an IPv6-only end), the IPv6 half of a dual-stack one, `teid`."""
        return {"address": self.ipv4 or self.ipv6, **({"ipv6": self.ipv6} if self.ipv4 and self.ipv6 else {}),
                "teid": self.teid}


@dataclass
class SessionItem:
    """One item of a PDU session resource list (setup request/response, failed list, release)."""

    role: str
    psi: int
    cause: dict[str, Any] | None = None
    values: dict[str, list[str]] = field(default_factory=dict)
    tunnels: list[Tunnel] = field(default_factory=list)

    def first(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None

    def tunnel(self, where: str) -> dict[str, str | None]:
        """The first tunnel held where said, as the summaries show it (address and TEID None: there is none)."""
        found = next((t for t in self.tunnels if t.where == where), None)
        return found.describe() if found is not None else {"address": None, "teid": None}

    def tunnels_at(self, where: str) -> list[dict[str, str | None]]:
        return [t.describe() for t in self.tunnels if t.where == where]


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
    s_tmsi: list[STmsi] = field(default_factory=list)  # ... whole (AMF Set ID, AMF Pointer, 5G-TMSI)
    paging_identity: STmsi | None = None  # Paging: the paged UE's 5G-S-TMSI (UEPagingIdentity IE)
    nas_pdu: str | None = None  # the NAS-PDU IE's octets (hex): what a NAS NON DELIVERY INDICATION returns
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
    if pdu.procedure_code != PROC_NAS_NON_DELIVERY:
        # A NAS NON DELIVERY INDICATION's NAS-PDU is the downlink one the NG-RAN node could not deliver, returned
        # (TS 38.413 8.6.4, 9.2.5.5): none of its NAS is a message of this PDU (nas_pdu says which it was).
        pdu.nas, pdu.nas_undecoded = nas_messages(pdu.frame, protocol_nodes([node], {"nas-5gs"}))
    pdu.causes.extend({"frame": pdu.frame, "kind": m.layer, "code": m.cause, "cause": m.cause_text,
                       "message": m.message} for m in pdu.nas if m.cause is not None)


def _cause(frame: int, name: str, value: str, label: str, procedure: str | None) -> dict[str, Any]:
    return {"frame": frame, "kind": "NGAP", "group": name.removeprefix("ngap."), "code": int(value),
            "cause": label_name(label), "procedure": procedure}


def _read_ie(pdu: NgapPdu, ie_id: int | None, ie: Node) -> None:
    role = SESSION_LIST_ROLES.get(ie_id) if ie_id is not None else None
    item: SessionItem | None = None
    first_item = len(pdu.items)
    pairs: list[list[str | None]] = []
    s_tmsi: dict[str, int] = {}  # the parts of a 5G-S-TMSI read so far (AMF Set ID, AMF Pointer)
    for name, value, label in labelled([ie]):
        if name == "ngap.nG_Interface" and ie_id == IE_RESET_TYPE:
            pdu.reset_all = True
        if value is None:
            continue
        if name in INTEGER_FIELDS:
            value = str(as_int(value))  # checked here, inside the reader's guard, so later int() cannot fail
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
        elif item is not None and name in ITEM_KEEP:
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
        elif name in S_TMSI_BITS and ie_id in (IE_FIVEG_S_TMSI, IE_UE_PAGING_IDENTITY):
            s_tmsi[name] = bit_string(value, S_TMSI_BITS[name])
        elif name == "ngap.fiveG_TMSI" and ie_id in (IE_FIVEG_S_TMSI, IE_UE_PAGING_IDENTITY):
            tmsi = as_int(value)
            whole = STmsi(s_tmsi["ngap.aMFSetID"], s_tmsi["ngap.aMFPointer"], tmsi) if len(s_tmsi) == 2 else None
            if ie_id == IE_FIVEG_S_TMSI:
                pdu.tmsi.append(tmsi)
                pdu.s_tmsi.extend([whole] if whole is not None else [])
            else:
                pdu.paging_identity = whole
        elif name == "ngap.NAS_PDU" and ie_id == IE_NAS_PDU and pdu.nas_pdu is None:
            pdu.nas_pdu = value.replace(":", "").lower()
        elif name == "ngap.SourceToTarget_TransparentContainer" and ie_id == IE_SOURCE_TO_TARGET_CONTAINER:
            pdu.s2t_container = value
        elif name == "ngap.RANNodeName" and ie_id == IE_RAN_NODE_NAME:
            pdu.ran_node["ran_node_name"] = value
        elif name in ("ngap.gNB_ID", "ngap.ngENB_ID", "ngap.n3IWF_ID") and ie_id == IE_GLOBAL_RAN_NODE_ID:
            pdu.ran_node["ran_node_id"] = f"{name.removeprefix('ngap.')} {value}"
    pdu.reset_pairs.extend((p[0], p[1]) for p in pairs)
    if role is not None:
        _read_tunnels(ie, pdu.items[first_item:])


def _read_tunnels(ie: Node, items: list[SessionItem]) -> None:
    """Each GTP tunnel of this list IE's session items, by the tree's structure: a transportLayerAddress
    (with Wireshark's IPv4 / IPv6 parts under it) and the gTP-TEID after it are one tunnel, held by the
    nearest IE (a ProtocolIE-Field: its `id` child) or TUNNEL_MEMBERS member above them. Items come in the
    order of their pDUSessionID fields, as _read_ie made them."""
    queue = iter(items)
    item: SessionItem | None = None

    def holder(node: Node) -> str | None:
        for child in _children(node):
            name, value = _name_value(child)
            if name == "ngap.id" and value is not None:
                return TUNNEL_IES.get(int(value), f"IE {value}")
        name, _ = _name_value(node)
        member = name.removeprefix("ngap.") if name and not name.startswith("frame[") else \
            str(node.get("l", "")).partition(":")[0]
        return member if member in TUNNEL_MEMBERS else None

    def visit(nodes: list[Node], where: str) -> None:
        nonlocal item
        for node in nodes:
            name, value = _name_value(node)
            if name == "ngap.pDUSessionID":
                item = next(queue, None)
            elif item is not None and value is not None:
                if name == "ngap.transportLayerAddress":
                    item.tunnels.append(Tunnel(where))
                elif item.tunnels and name == "ngap.TransportLayerAddressIPv4":
                    item.tunnels[-1].ipv4 = value
                elif item.tunnels and name == "ngap.TransportLayerAddressIPv6":
                    item.tunnels[-1].ipv6 = value
                elif item.tunnels and name == "ngap.gTP_TEID" and item.tunnels[-1].teid is None:
                    item.tunnels[-1].teid = value
            visit(_children(node), holder(node) or where)

    visit([ie], "")


# TS 38.413 9.3.3.20: the BIT STRINGs of a 5G-S-TMSI, by size.
S_TMSI_BITS = {"ngap.aMFSetID": 10, "ngap.aMFPointer": 6}


def bit_string(value: str, size: int) -> int:
    """A BIT STRING of `size` bits as tshark prints it (its octets, the bits left-aligned: 00:40 is set ID 1)."""
    octets = value.replace(":", "")
    return int(octets, 16) >> (len(octets) * 4 - size)


def as_int(value: str) -> int:
    """Integers as tshark prints them: decimal (leading zeros allowed), 0x-hex, or colon-separated bytes."""
    if ":" in value:
        return int(value.replace(":", ""), 16)
    return int(value, 16) if value.lower().startswith("0x") else int(value, 10)


PLMN_FIELDS = ("e212.mcc", "e212.mnc")
_ENCODED_DIGITS = re.compile(r"\((\d{2,3})\)$")


def plmn_digits(name: str, value: str, label: str) -> str:
    """An MCC as its three digits, an MNC as the two or three digits it was encoded with.

    tshark gives both as integers (PLMN 001/01 is 1/1); its label keeps the MNC's encoded width
    ("Mobile Network Code (MNC): Unknown (01)"), which is the only place a 2- from a 3-digit MNC shows.
    """
    if name == "e212.mcc":
        return value.zfill(3)
    found = _ENCODED_DIGITS.search(label)
    return found.group(1) if found and int(found.group(1)) == int(value) else value.zfill(2)


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
            if name in MESSAGE_TYPES and value is not None:
                return MESSAGE_TYPES[name], value, label_name(str(child.get("l", "")))
        return None

    def gather(node: Node, message: NasMessage) -> None:
        for child in _children(node):
            if message_type(child) is not None:
                visit(child, f"{message.layer} {message.code}")
                continue
            name, value = _name_value(child)
            if name is not None and value is not None:
                if name in ("nas_5gs.mm.5gmm_cause", "nas_5gs.sm.5gsm_cause") and message.cause is None:
                    message.cause = int(value)
                    message.cause_text = label_name(str(child.get("l", "")))
                elif name in PLMN_FIELDS:
                    message.values.setdefault(name, []).append(plmn_digits(name, value, str(child.get("l", ""))))
                elif name in NAS_KEEP or name.startswith("nas_5gs.mm.suci."):
                    message.values.setdefault(name, []).append(str(as_int(value)) if name in INTEGER_FIELDS
                                                               else value)
            gather(child, message)

    def visit(node: Node, outer: str | None = None) -> None:
        found = message_type(node)
        if found is None:
            for child in _children(node):
                visit(child, outer)
            return
        layer, code, text = found
        message = NasMessage(frame=frame, layer=layer, code=code, message=text, outer=outer)
        out.append(message)
        inner = len(out)
        gather(node, message)
        if message.layer == "5GMM" and message.code == NAS_DL_TRANSPORT and message.cause is not None:
            for carried in out[inner:]:  # its cause follows its payload container: known only now
                carried.returned = carried.layer == "5GSM"

    for nas in nas_nodes:
        before = len(out)
        visit(nas)
        protected = any(name == "nas_5gs.security_header_type" and value not in (None, "0")
                        for name, value, _ in labelled([nas]))
        if len(out) == before and protected:
            undecoded += 1
    return out, undecoded
