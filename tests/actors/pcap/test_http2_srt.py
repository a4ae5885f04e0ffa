"""The SBI path templates pcap_stats groups HTTP/2 response times by."""

from __future__ import annotations

import pytest

from diagd.actors.pcap.answers.http2_srt import template


@pytest.mark.parametrize(("path", "expected"), [
    ("/nsmf-pdusession/v1/sm-contexts", "/nsmf-pdusession/v1/sm-contexts"),
    ("/nsmf-pdusession/v1/sm-contexts/13/modify", "/nsmf-pdusession/v1/sm-contexts/{id}/modify"),
    ("/nnrf-nfm/v1/nf-instances/193ea13c-9bbe-41f1-ab34-2de553165cab", "/nnrf-nfm/v1/nf-instances/{id}"),
    ("/nudm-sdm/v2/imsi-999700000000001/sm-data?dnn=internet", "/nudm-sdm/v2/{id}/sm-data"),
    ("/nudm-ueau/v1/suci-0-999-70-0000-0-0-0000000001/security-information/generate-auth-data",
     "/nudm-ueau/v1/{id}/security-information/generate-auth-data"),
    # resource names with digits stay: 5g-aka-confirmation, n1-n2-messages, v2
    ("/nausf-auth/v1/ue-authentications/1/5g-aka-confirmation",
     "/nausf-auth/v1/ue-authentications/{id}/5g-aka-confirmation"),
    ("/namf-comm/v1/ue-contexts/imsi-1/n1-n2-messages", "/namf-comm/v1/ue-contexts/{id}/n1-n2-messages"),
])
def test_ids_in_sbi_paths_become_id(path: str, expected: str) -> None:
    assert template(path) == expected
