"""The one procedure model of a capture: its contexts and every procedure instance with its outcome.

Built once per capture (and display filter) by the pcap actor and shared by every view:
ngap_ue_sessions (contexts and procedures), ngap_pdu_session_summary and pcap_sequence_diagram read
their verdicts from the same Instance objects, so no two views can disagree about an instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagd.actors.pcap.ngap.associations import Analysis, Context, analyse
from diagd.actors.pcap.ngap.paging import track_paging
from diagd.actors.pcap.ngap.pdus import NgapPdu
from diagd.actors.pcap.ngap.procedures import ESTABLISHMENT, REACTIVATION, Instance, track_all, track_association


@dataclass
class Model:
    pdus: list[NgapPdu]
    analysis: Analysis
    by_context: list[tuple[Context, list[Instance]]] = field(default_factory=list)
    # Beside by_context, per context: (procedure, rule id) of answers whose request is outside the capture.
    orphans: list[list[tuple[str, str]]] = field(default_factory=list)
    # Non-UE-associated procedure instances (NG Reset, Paging), in capture order.
    non_ue: list[Instance] = field(default_factory=list)

    @property
    def instances(self) -> list[Instance]:
        """Every instance: each UE context's, then the non-UE-associated ones."""
        return [*(i for _, found in self.by_context for i in found), *self.non_ue]

    def establishment(self, ctx: Context, psi: int, request_frame: int) -> Instance | None:
        """The PDU session establishment instance a request opened."""
        for owner, found in self.by_context:
            if owner is ctx:
                return next((i for i in found if i.procedure.name == ESTABLISHMENT and i.psi == psi
                             and i.first.frame == request_frame), None)
        return None

    def reactivations(self, ctx: Context, psi: int) -> list[Instance]:
        """The user-plane re-activations of one PDU session of a context, in capture order."""
        return [i for owner, found in self.by_context if owner is ctx for i in found
                if i.procedure.name == REACTIVATION and i.psi == psi]


def build(pdus: list[NgapPdu]) -> Model:
    analysis = analyse(pdus)
    tracked = [(ctx, *track_all(ctx, analysis)) for ctx in analysis.contexts]
    non_ue = [i for assoc in analysis.associations
              for i in track_association(assoc, [p for p in assoc.pdus if analysis.owner.get(id(p)) is None])]
    non_ue += track_paging(analysis)
    return Model(pdus, analysis, [(ctx, found) for ctx, found, _ in tracked],
                 [orphans for _, _, orphans in tracked], sorted(non_ue, key=lambda i: i.first.frame))
