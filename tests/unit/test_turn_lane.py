"""The turn lane answers the turns FastAPI would accept and hands every other request on."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from memoryd.api.auth import TokenTable, hash_token
from memoryd.api.metrics import HttpMetrics, RequestLatencyMiddleware
from memoryd.api.models import ContextRequest, ContextResponse
from memoryd.api.turn_lane import PATH, TurnLane
from store.errors import DatabaseUnavailable

TOKEN = "token-of-org-a"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
TURN = {"user_id": "ada", "query": "When is the Acme review?", "budget": "lean"}


def answer(request: ContextRequest, org: str) -> ContextResponse:
    return ContextResponse(
        organization_id=org,
        user_id=request.user_id,
        memory_version=3,
        prompt_block=f"# Your Context\n{request.query}",
        working_memory="Ada designs billing screens.",
        scaffold={"projects": {"acme": "review on Friday"}},
        learned_info=["prefers mornings"],
        connection_info={},
        facts=[],
        degraded=False,
        degraded_reason=None,
        latency_ms=1.5,
        log_id=None,
    )


class Harness:
    """The lane over an application that records what reached it."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.served: list[tuple[str, ContextRequest]] = []
        self.passed_on: list[tuple[str, str, bytes]] = []
        self._fail = fail
        self.registry = CollectorRegistry()
        lane = TurnLane(
            self._app,
            serve=self._serve,
            tokens=TokenTable({hash_token(TOKEN): "org-a"}),
            route=Route(PATH, self._endpoint, methods=["POST"]),
            database_down=lambda e: JSONResponse({"detail": f"down: {e}"}, status_code=503),
        )
        metered = RequestLatencyMiddleware(lane, HttpMetrics(self.registry))
        self.client = TestClient(metered)

    async def _serve(self, org: str, request: ContextRequest) -> ContextResponse:
        self.served.append((org, request))
        if self._fail is not None:
            raise self._fail
        return answer(request, org)

    async def _endpoint(self, *_: Any) -> None:
        raise AssertionError("the route object is a label, never called")

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.passed_on.append((scope["method"], scope["path"], body))
        await JSONResponse({"from": "application"}, status_code=418)(scope, receive, send)

    def count(self, route: str, status: str) -> float:
        value = self.registry.get_sample_value(
            "memoryd_http_request_seconds_count",
            {"method": "POST", "route": route, "status": status},
        )
        return value or 0.0


def test_a_turn_the_framework_would_accept_is_answered_by_the_lane() -> None:
    h = Harness()
    response = h.client.post(PATH, content=json.dumps(TURN), headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == answer(ContextRequest(**TURN), "org-a").model_dump(mode="json")
    assert h.served == [("org-a", ContextRequest(**TURN))]
    assert h.passed_on == []
    # Labelled with its route, as the router would have: the latency middleware counted it.
    assert h.count(PATH, "2xx") == 1


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}", f"bearer {TOKEN}", f"BEARER   {TOKEN}  "],
    ids=["as-sent", "lower-case-scheme", "padded"],
)
def test_the_token_is_read_as_http_bearer_reads_it(authorization: str) -> None:
    h = Harness()
    headers = {**AUTH, "Authorization": authorization}
    assert h.client.post(PATH, content=json.dumps(TURN), headers=headers).status_code == 200
    assert [org for org, _ in h.served] == ["org-a"]


REFUSED_OR_NOT_OURS = [
    pytest.param({"Content-Type": "application/json"}, json.dumps(TURN), id="no-token"),
    pytest.param({**AUTH, "Authorization": "Bearer wrong"}, json.dumps(TURN), id="unknown-token"),
    pytest.param({**AUTH, "Authorization": f"Basic {TOKEN}"}, json.dumps(TURN), id="basic"),
    pytest.param({**AUTH, "Authorization": "Bearer"}, json.dumps(TURN), id="no-credentials"),
    pytest.param(AUTH, '{"user_id": "ada", "query":', id="broken-json"),
    pytest.param(AUTH, json.dumps({**TURN, "user_id": "a b"}), id="invalid-user-id"),
    pytest.param(AUTH, json.dumps({**TURN, "extra": 1}), id="unknown-field"),
    pytest.param(AUTH, "", id="empty-body"),
    pytest.param(AUTH, b"\xff\xfe{", id="not-utf8"),
    pytest.param({**AUTH, "Content-Type": "text/plain"}, json.dumps(TURN), id="text-plain"),
    # FastAPI reads these as JSON too; the lane leaves them to it.
    pytest.param({**AUTH, "Content-Type": "application/vnd.a+json"}, json.dumps(TURN), id="+json"),
    pytest.param({"Authorization": f"Bearer {TOKEN}"}, json.dumps(TURN), id="no-content-type"),
]


@pytest.mark.parametrize(("headers", "body"), REFUSED_OR_NOT_OURS)
def test_any_other_request_reaches_the_application_with_its_body(
    headers: dict[str, str], body: str | bytes
) -> None:
    h = Harness()
    response = h.client.post(PATH, content=body, headers=headers)
    assert (response.status_code, response.json()) == (418, {"from": "application"})
    sent = body.encode() if isinstance(body, str) else body
    assert h.passed_on == [("POST", PATH, sent)]
    assert h.served == []


def test_other_routes_and_methods_reach_the_application() -> None:
    h = Harness()
    assert h.client.get(PATH, headers=AUTH).status_code == 418
    assert h.client.post("/v1/events", content=json.dumps(TURN), headers=AUTH).status_code == 418
    assert [(m, p) for m, p, _ in h.passed_on] == [("GET", PATH), ("POST", "/v1/events")]
    assert h.served == []


def test_a_database_outage_gets_the_applications_answer_for_it() -> None:
    h = Harness(fail=DatabaseUnavailable("server closed the connection"))
    response = h.client.post(PATH, content=json.dumps(TURN), headers=AUTH)
    assert response.status_code == 503
    assert response.json() == {"detail": "down: server closed the connection"}
    assert h.passed_on == []
    assert h.count(PATH, "5xx") == 1
