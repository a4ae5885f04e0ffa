"""The procedures view of NGAP: each UE context's procedure instances, statistics and N4/SBI links, from the model."""

from __future__ import annotations

from diagd.actors.pcap.answer_types import ProceduresAnswer
from diagd.actors.pcap.ngap.model import Model
from diagd.actors.pcap.ngap.procedures import link_core, statistics


def procedures(model: Model, filtered: bool = False, core_rows: list[dict[str, str]] | None = None
               ) -> ProceduresAnswer:
    analysis, pdus = model.analysis, model.pdus
    everything = model.instances
    core = link_core(everything, core_rows or [], max((p.time for p in pdus), default=0.0))
    ues = [{"ue": ctx.label, "association": ctx.assoc.label, "gnb": ctx.assoc.gnb, "ran_ue_ngap_id": ctx.ran,
            "amf_ue_ngap_id": ctx.amf, "procedures": [i.describe() for i in found]}
           for ctx, found in model.by_context]
    # Not UE-associated (NG Reset): under the association that carried them.
    non_ue = [i.describe() for i in model.non_ue]
    failed = [i.describe() for i in everything if i.outcome in ("reject", "failure")]
    warnings = list(analysis.warnings)
    if filtered:
        warnings.append("display_filter given: procedures are built from the filtered NGAP frames only")
    result: ProceduresAnswer = {
        "ue_count": len(ues), "procedure_count": len(everything), "ues": ues, "non_ue_procedures": non_ue,
        "statistics": statistics(everything),
        "failed": failed, "incomplete": sum(1 for i in everything if i.outcome == "incomplete"),
        "associations": [a.describe() for a in analysis.associations], "ngap_pdus": len(pdus),
        "percentiles": "nearest rank over completed instances (success, reject, failure)", "warnings": warnings,
        "n4_sbi": core,
    }
    if not core["n4_sbi_messages"] and any(i.procedure.name == "PDU Session Establishment" for i in everything):
        warnings.append("no PFCP session establishment or SBI PDU session call in this capture: give a capture "
                        "merged with the N4/SBI views (mergecap) and decode_as for HTTP/2 on its port")
    if not everything:
        result["reason"] = ("no NGAP over SCTP in the capture" + (" that matches the display filter" if filtered
                                                                    else "") if not pdus else
                            "no procedure message (TS 24.501 / 38.413) in the NGAP PDUs" +
                            ("; NAS did not decode, see warnings" if any(p.nas_undecoded for p in pdus) else ""))
    return result
