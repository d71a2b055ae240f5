"""The request strategy of the API property test, drawn where no library thread moves the
global `random`: there hypothesis's check that a strategy leaves it alone holds (warnings are
errors), which the property test on live services has to waive."""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings

from memoryd.api.openapi import openapi_json
from tests.support.openapi_requests import ApiRequest, requests

DOC = json.loads(openapi_json())
OPERATIONS: set[tuple[str, str]] = {(m.upper(), p) for p, ops in DOC["paths"].items() for m in ops}


def _template_of(path: str) -> str | None:
    for _, template in OPERATIONS:
        # A broken path parameter may be empty.
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]*", re.escape(template))
        if re.fullmatch(pattern, path):
            return template
    return None


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(request=requests(DOC))
def test_a_request_names_an_operation_of_the_document(request: ApiRequest) -> None:
    template = _template_of(request.path)
    assert template is not None, request.path
    assert (request.method, template) in OPERATIONS
