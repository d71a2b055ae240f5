"""The HTTP API on real Kafka, Postgres and Chroma, through FastAPI's TestClient."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.settings import ApiSettings
from producers.contract import EventType
from tests.support.builders import key_of, make_event, make_fact
from tests.support.chroma import DisposableChroma
from tests.support.deployment import Deployment, on_chroma_server, seed_core
from tests.support.erasure import erased_as_chroma_stops

pytestmark = pytest.mark.integration

TOKEN_A, TOKEN_B = "token-for-org-a", "token-for-org-b"
A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}


@contextmanager
def api(deployment: Deployment, **api: Any) -> Iterator[tuple[TestClient, wiring.Core]]:
    tokens = {hash_token(TOKEN_A): "org-a", hash_token(TOKEN_B): "org-b"}
    settings = deployment.settings.model_copy(update={"api": ApiSettings(tokens=tokens, **api)})
    with wiring.core(settings) as c, wiring.api_app(c) as app, TestClient(app) as client:
        yield client, c


def test_tokens_are_required_and_scoped_to_their_organization(deployment: Deployment) -> None:
    with api(deployment) as (client, c):
        (fact,) = [make_fact("ada", "Ada takes her coffee black")]
        seed_core(c, "ada", [fact], org="org-a")
        fid = fact.fact_id
        body = {"user_id": "ada", "query": "coffee"}
        calls = [
            ("POST", "/v1/context", body),
            ("GET", "/v1/users/ada/memory", None),
            ("POST", f"/v1/users/ada/facts/{fid}/correction", {"content": "I drink tea"}),
            ("DELETE", f"/v1/users/ada/facts/{fid}", None),
            ("DELETE", "/v1/users/ada", None),
        ]
        for method, path, json in calls:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
                response = client.request(method, path, json=json, headers=headers)
                assert response.status_code == 401, (method, path, headers)
        # For org B's token, "ada" is org B's ada: a memory it has not got.
        theirs = client.post("/v1/context", json=body, headers=B).json()
        assert (theirs["organization_id"], theirs["facts"]) == ("org-b", [])
        assert "coffee" not in theirs["prompt_block"]
        for method, path, json in calls[1:4]:
            assert client.request(method, path, json=json, headers=B).status_code == 404
        event = make_event("ada", "I moved to Porto", org="org-a")
        payload = {"events": [event.model_dump(mode="json")]}
        assert client.post("/v1/events", json=payload, headers=B).status_code == 403
        # Org B writing to its own "ada" is fine: it reaches org B's memory, never org A's.
        as_b = make_event("ada", "I moved to Porto", org="org-b").model_dump(mode="json")
        assert client.post("/v1/events", json={"events": [as_b]}, headers=B).status_code == 202
        assert client.get("/v1/users/nobody/memory", headers=A).status_code == 404
        assert client.delete(f"/v1/users/ada/facts/{uuid.uuid4()}", headers=A).status_code == 404
        assert client.get("/healthz").status_code == 200
        mine = client.get("/v1/users/ada/memory", headers=A).json()
        assert [f["content"] for f in mine["facts"]] == ["Ada takes her coffee black"]

        # Consumed, org B's event becomes org B's ada's fact; org A's ada is as it was.
        deployment.run_both()
        theirs = client.get("/v1/users/ada/memory", headers=B).json()
        assert theirs["organization_id"] == "org-b"
        assert any("Porto" in f["content"] for f in theirs["facts"])
        assert client.get("/v1/users/ada/memory", headers=A).json() == mine
        # Org B forgetting its ada forgets org B's, never org A's.
        assert client.delete("/v1/users/ada", headers=B).status_code == 200
        assert client.get("/v1/users/ada/memory", headers=B).status_code == 404
        assert client.get("/v1/users/ada/memory", headers=A).json() == mine


def test_context_and_memory_for_the_right_token(deployment: Deployment) -> None:
    with api(deployment) as (client, c):
        seed_core(
            c,
            "ada",
            [
                make_fact("ada", "Ada is allergic to peanuts", pinned=True),
                make_fact("ada", "The Acme review is on Friday", connection_id="gmail"),
            ],
            working_memory="Ada designs billing screens.",
        )
        response = client.post(
            "/v1/context",
            json={
                "user_id": "ada",
                "query": "When is the Acme review?",
                "active_connection_ids": ["gmail"],
                "budget": "lean",
                "turn_id": "turn-1",
            },
            headers=A,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["working_memory"] == "Ada designs billing screens."
        assert "# Your Context" in body["prompt_block"]
        groups = {f["fact"]["content"]: f["group"] for f in body["facts"]}
        assert groups["Ada is allergic to peanuts"] == "always known"
        assert groups["The Acme review is on Friday"] == "relevant for this turn"
        memory = client.get("/v1/users/ada/memory", headers=A).json()
        assert memory["organization_id"] == "org-a"
        assert memory["memory_version"] == 1
        assert {f["provenance"]["connection_id"] for f in memory["facts"]} == {None, "gmail"}
        assert {f["status"] for f in memory["facts"]} == {"active"}
        bad = client.post("/v1/context", json={"user_id": "a b", "query": "x"}, headers=A)
        assert bad.status_code == 422
        metrics = generate_latest(c.registry).decode()
        assert 'route="/v1/users/{user_id}/memory"' in metrics
        assert "/v1/users/ada/memory" not in metrics
        turns = 'memoryd_http_request_seconds_count{method="POST",route="/v1/context",status='
        assert f'{turns}"2xx"}} 1.0' in metrics
        assert f'{turns}"4xx"}} 1.0' in metrics


def test_a_memorys_facts_come_a_page_at_a_time(deployment: Deployment) -> None:
    with api(deployment) as (client, c):
        facts = [make_fact("ada", f"Ada read book {i}") for i in range(5)]
        seed_core(c, "ada", facts)
        listed, cursor, pages = [], None, 0
        while True:
            params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
            page = client.get("/v1/users/ada/memory", params=params, headers=A)
            assert page.status_code == 200, page.text
            body = page.json()
            assert body["memory_version"] == 1  # W, S and learned info come with every page
            listed += [f["fact_id"] for f in body["facts"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        whole = client.get("/v1/users/ada/memory", headers=A).json()
        assert whole["next_cursor"] is None
        assert listed == [f["fact_id"] for f in whole["facts"]]
        assert sorted(listed) == sorted(str(f.fact_id) for f in facts)
        assert pages == 3
        for bad in ({"cursor": "bm90IGEgY3Vyc29y"}, {"limit": 0}, {"limit": 5_001}):
            response = client.get("/v1/users/ada/memory", params=bad, headers=A)
            assert response.status_code == 422, bad


def test_the_turn_lane_and_the_framework_answer_a_turn_alike(deployment: Deployment) -> None:
    """`application/json` takes the lane (`memoryd.api.turn_lane`); FastAPI answers the same
    request sent as another JSON type itself."""
    with api(deployment) as (client, c):
        seed_core(
            c,
            "cy",
            [
                make_fact("cy", "Cy is allergic to peanuts", pinned=True),
                make_fact("cy", "The Acme review is on Friday", connection_id="gmail"),
                make_fact("cy", "Cy reviews designs with Bo on Fridays"),
            ],
            working_memory="Cy designs billing screens.",
        )
        body = json.dumps(
            {
                "user_id": "cy",
                "query": "When is the Acme review?",
                "active_connection_ids": ["gmail"],
                "turn_id": "turn-7",
            }
        )
        answers, scores = [], []
        for content_type in ("application/json", "application/vnd.memoryd+json"):
            headers = {**A, "Content-Type": content_type}
            response = client.post("/v1/context", content=body, headers=headers)
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "application/json"
            answer, score = _comparable(response.json())
            answers.append(answer)
            scores.append(score)
        assert answers[0] == answers[1]
        assert scores[0] == pytest.approx(scores[1], rel=1e-6)
        groups = {f["fact"]["content"]: f["group"] for f in answers[0]["facts"]}
        assert groups["Cy is allergic to peanuts"] == "always known"
        assert groups["The Acme review is on Friday"] == "relevant for this turn"


def _comparable(answer: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """The answer without what differs between two asks of one turn: the time it took, the
    recall counters the first ask raised; and apart, the scores, which a few milliseconds
    more of recency decay move in their last digits."""
    del answer["latency_ms"]
    scores = []
    for retrieved in answer["facts"]:
        del retrieved["fact"]["recall_count"], retrieved["fact"]["last_recalled_at"]
        scores.append(retrieved.pop("score"))
    return answer, scores


def test_a_deleted_fact_is_gone_and_a_corrected_one_leaves_retrieval(
    deployment: Deployment,
) -> None:
    with api(deployment) as (client, _c):
        events = [
            make_event("ada", "I live in Lisbon", minutes=0),
            make_event("ada", "My dog is called Pixel", minutes=1),
            make_event("ada", "I play the cello", minutes=2),
        ]
        published = client.post(
            "/v1/events", json={"events": [e.model_dump(mode="json") for e in events]}, headers=A
        )
        assert published.status_code == 202, published.text
        deployment.run_both()
        facts = client.get("/v1/users/ada/memory", headers=A).json()["facts"]
        by_text = {f["content"]: f["fact_id"] for f in facts}
        dog = next(fid for text, fid in by_text.items() if "Pixel" in text)
        city = next(fid for text, fid in by_text.items() if "Lisbon" in text)

        deleted = client.delete(f"/v1/users/ada/facts/{dog}?idempotency_key=k1", headers=A)
        assert deleted.status_code == 200, deleted.text
        receipt = deleted.json()
        assert receipt["scope"] == "fact"
        assert receipt["removed"]["postgres"]["memory_facts"] == 1
        assert receipt["removed"]["chroma"]["vectors"] == 1
        assert receipt["removed"]["redacted"]["context_events"] == 1  # its observation
        # Asked again, with the same key or none: the erasure that removed it, its receipt.
        again = client.delete(f"/v1/users/ada/facts/{dog}?idempotency_key=k1", headers=A)
        assert again.json() == receipt
        assert client.delete(f"/v1/users/ada/facts/{dog}", headers=A).json() == receipt
        corrected = client.post(
            f"/v1/users/ada/facts/{city}/correction",
            json={"content": "I live in Porto now"},
            headers=A,
        )
        assert corrected.status_code == 202
        assert len(corrected.json()["event_ids"]) == 2
        # Sent again without a key (its answer lost, say): the same correction, not a second.
        resent = client.post(
            f"/v1/users/ada/facts/{city}/correction",
            json={"content": "I live in Porto now"},
            headers=A,
        )
        assert resent.json() == corrected.json()
        deployment.run_both()

        memory = client.get("/v1/users/ada/memory", headers=A).json()
        status = {f["fact_id"]: f["status"] for f in memory["facts"]}
        assert dog not in status  # deleted, not archived
        assert status[city] == "contradicted"
        assert any("Porto" in f["content"] and f["status"] == "active" for f in memory["facts"])
        for query in ("What is the dog called? Pixel", "Where does Ada live? Lisbon"):
            context = client.post(
                "/v1/context", json={"user_id": "ada", "query": query, "budget": "deep"}, headers=A
            ).json()
            ids = {f["fact"]["fact_id"] for f in context["facts"]}
            assert dog not in ids
            assert city not in ids
            assert "Pixel" not in context["prompt_block"]
    logged = deployment.query(
        "SELECT event_type FROM context_events"
        " WHERE event_type IN ('fact_retraction', 'correction')"
    )
    assert sorted(r[0] for r in logged) == [
        EventType.CORRECTION.value,
        EventType.FACT_RETRACTION.value,
    ]
    pixel = deployment.query(
        "SELECT count(*) FROM context_events WHERE strpos(content, %s) > 0", ("Pixel",)
    )
    assert pixel == [(0,)]


def indexed_dog(deployment: Deployment, c: wiring.Core) -> uuid.UUID:
    deployment.publish([make_event("ada", "My dog is called Pixel")])
    deployment.run_both()
    wiring.indexer(c).drain_pending()
    (dog,) = [f.fact_id for f in c.memory.facts(key_of("ada"))]
    return dog


def assert_refused_for_chroma(response: Any, deployment: Deployment, operation: str) -> None:
    """A 503 for Chroma's failing `operation`, the erasure left open with Postgres erased."""
    assert response.status_code == 503
    detail = response.json()["detail"]
    assert detail.startswith(f"vector index unavailable: chroma {operation} failed: "), detail
    assert deployment.query("SELECT status FROM erasure_audit") == [("postgres_erased",)]


def test_a_fact_erasure_chroma_refused_is_a_503_and_its_retry_finishes_it(
    deployment: Deployment, stoppable_chroma: DisposableChroma
) -> None:
    deployment = on_chroma_server(deployment, stoppable_chroma.url)
    with api(deployment) as (client, c):
        dog = indexed_dog(deployment, c)
        url = f"/v1/users/ada/facts/{dog}?idempotency_key=k9"
        refused = erased_as_chroma_stops(
            lambda: client.delete(url, headers=A), deployment.dsn, key_of("ada"), stoppable_chroma
        )
        assert_refused_for_chroma(refused, deployment, "delete")
        stoppable_chroma.start()
        # Its row is gone already; the same request finishes the erasure instead of a 404.
        retried = client.delete(url, headers=A)
        assert retried.status_code == 200, retried.text
        assert retried.json()["removed"]["postgres"]["memory_facts"] == 1
        assert retried.json()["removed"]["chroma"] == {"vectors": 1}
        assert c.index.embeddings([dog]) == {}
        assert client.delete(f"/v1/users/ada/facts/{dog}", headers=A).json() == retried.json()


def test_a_forget_chroma_refused_is_a_503_and_asked_again_completes(
    deployment: Deployment, stoppable_chroma: DisposableChroma
) -> None:
    deployment = on_chroma_server(deployment, stoppable_chroma.url)
    with api(deployment) as (client, c):
        indexed_dog(deployment, c)
        refused = erased_as_chroma_stops(
            lambda: client.delete("/v1/users/ada?idempotency_key=f1", headers=A),
            deployment.dsn,
            key_of("ada"),
            stoppable_chroma,
        )
        assert_refused_for_chroma(refused, deployment, "delete_memory")
        stoppable_chroma.start()
        assert c.index.count(key_of("ada")) == 1
        done = client.delete("/v1/users/ada?idempotency_key=f1", headers=A)
        assert done.status_code == 200, done.text
        assert done.json()["removed"]["chroma"] == {"vectors": 1}
        assert c.index.count(key_of("ada")) == 0


def test_a_turn_id_names_a_turn_of_one_memory(deployment: Deployment) -> None:
    """Callers number turns per conversation: ada's and bob's "t-1" are two audited turns,
    and ada's "t-1" asked again is still one."""
    with api(deployment) as (client, c):
        for user in ("ada", "bob"):
            seed_core(c, user, [make_fact(user, f"{user} rides a green bike")])
        for user in ("ada", "bob", "ada"):
            turn = {"user_id": user, "query": "Which bike?", "turn_id": "t-1"}
            assert client.post("/v1/context", json=turn, headers=A).status_code == 200
    audited = deployment.query(
        "SELECT organization_id, user_id, count(*) FROM context_logs"
        " GROUP BY organization_id, user_id ORDER BY user_id"
    )
    assert audited == [("org-a", "ada", 1), ("org-a", "bob", 1)]


def test_a_turn_id_sent_again_with_another_request_is_another_turn(
    deployment: Deployment,
) -> None:
    """A turn id names a retry only of the same request: sent with another query or scope,
    it is audited, counted and charged like any other turn."""
    with api(deployment) as (client, c):
        seed_core(c, "ada", [make_fact("ada", "Ada rides a green bike")])
        bike = {"user_id": "ada", "query": "Which bike?", "turn_id": "t-1"}
        turns = [
            bike,
            bike,  # a retry
            {**bike, "query": "What colour is the bike?"},
            {**bike, "budget": "deep"},
            {**bike, "active_connection_ids": ["gmail", "slack"]},
            {**bike, "active_connection_ids": ["slack", "gmail"]},  # the same scope
        ]
        for turn in turns:
            assert client.post("/v1/context", json=turn, headers=A).status_code == 200
    audited = deployment.query(
        "SELECT query, budget, connection_ids FROM context_logs ORDER BY created_at"
    )
    assert audited == [
        ("Which bike?", "balanced", []),
        ("What colour is the bike?", "balanced", []),
        ("Which bike?", "deep", []),
        ("Which bike?", "balanced", ["gmail", "slack"]),
    ]
    charged = deployment.query(
        "SELECT count(*) FROM credit_ledger WHERE user_id = 'ada' AND operation = 'embedding'"
        " AND run_id IS NULL"
    )
    assert charged == [(4,)]
    recalls = deployment.query("SELECT recall_count FROM fact_recalls")
    assert recalls == [(4,)]


def test_bodies_too_large_or_too_deep_and_empty_keys_are_refused_not_failed(
    deployment: Deployment,
) -> None:
    deep = '{"user_id": "ada", "query": "q", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with api(deployment, max_body_bytes=4096) as (client, _):
        for token in (A, {}):  # with a token or without, nothing over the limit is parsed
            for path in ("/v1/context", "/v1/events"):
                response = client.post(path, content=b"x" * 5000, headers=token)
                assert response.status_code == 413, (path, token)
    with api(deployment) as (client, _):
        nested = client.post(
            "/v1/context", content=deep, headers={**A, "Content-Type": "application/json"}
        )
        assert nested.status_code == 400  # the framework's answer, not a 500
        empty = client.delete("/v1/users/ada", params={"idempotency_key": ""}, headers=A)
        assert empty.status_code == 422
        # The id memoryd stores for "no connection" names no connection: a 422 saying so.
        turn = {"user_id": "ada", "query": "q", "active_connection_ids": ["__none__"]}
        reserved = client.post("/v1/context", json=turn, headers=A)
        assert reserved.status_code == 422
        (problem,) = reserved.json()["detail"]
        assert problem["loc"] == ["body", "active_connection_ids", 0]
        assert "reserved by memoryd" in problem["msg"]
        event = make_event("ada", "I use Gmail", connection_id="gmail").model_dump(mode="json")
        event["source_metadata"]["connection_id"] = "__none__"
        published = client.post("/v1/events", json={"events": [event]}, headers=A)
        assert published.status_code == 422
        assert "reserved by memoryd" in published.text
