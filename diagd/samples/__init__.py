"""The sample captures shipped with diagd (package data beside this file): real public captures whose
licences allow redistribution, each named with its source and licence in NOTICE, the licence texts
beside it. `diagd examples` lists and copies them; README's first prompts run on them. Stdlib only:
the `diagd` command imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
NOTICE = "NOTICE"


@dataclass(frozen=True)
class Sample:
    name: str
    shows: str
    licence: str  # SPDX id; its text is LICENSE.<licence> in FOLDER
    source: str  # repository:path @commit

    @property
    def path(self) -> Path:
        return FOLDER / self.name

    @property
    def licence_file(self) -> str:
        return f"LICENSE.{self.licence}"


SAMPLES = (
    Sample("5greplay_oai.pcap",
           "5G core (OpenAirInterface): NGAP + NAS-5GS registration and PDU session, PFCP, GTP-U, HTTP/1.1 SBI",
           "Apache-2.0", "Montimage/5Greplay:pcap/oai.pcap @ac4e28d"),
    Sample("magma_gx_gy_combined_03.pcapng",
           "LTE (Magma): Diameter Gx + Gy credit control and S6a, S1AP attach, GTP-U",
           "BSD-3-Clause",
           "magma/magma:docs/readmes/assets/feg/pcaps/gx_gy_combined_03_210505_132953-1.pcapng @a368d20"),
    Sample("magma_inbound_roaming_01.pcapng",
           "LTE roaming (Magma): GTPv2-C Create/Delete Session on S8, Diameter S6a, S1AP attach and detach",
           "BSD-3-Clause",
           "magma/magma:docs/readmes/assets/feg/pcaps/inbound_roaming_01_210505_130828-1.pcapng @a368d20"),
)


def files() -> list[str]:
    """Every file that goes with the samples: the captures, NOTICE and the licence texts."""
    return [*(s.name for s in SAMPLES), NOTICE, *sorted({s.licence_file for s in SAMPLES})]
