"""Erasures through the API and the memory's lock, on real Kafka, Postgres and Chroma: one
that waits too long for a flush is audited, answered 202 and finished by the processors'
resumption, and concurrent forgets of one memory, or erasures of one fact, share one
erasure."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest
from fastapi.testclient import TestClient

from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.jobs import resume_erasures_once
from memoryd.settings import ApiSettings
from store.write.locks import memory_lock_key
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment, seed_core

pytestmark = pytest.mark.integration

TOKEN = "token-for-org-a"
A = {"Authorization": f"Bearer {TOKEN}"}
# Far longer than the bounded wait: an erasure still waiting then never gave up.
HUNG_S = 20.0


@contextmanager
def api(deployment: Deployment, lock_wait_s: float) -> Iterator[tuple[wiring.Core, TestClient]]:
    settings = ApiSettings(
        tokens={hash_token(TOKEN): "org-a"}, erasure_threads=4, erasure_lock_wait_s=lock_wait_s
    )
    with (
        wiring.core(deployment.settings.model_copy(update={"api": settings})) as c,
        wiring.api_app(c) as app,
        TestClient(app) as client,
    ):
        seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
        yield c, client


@contextmanager
def flushing(deployment: Deployment) -> Iterator[None]:
    """What a flush holds through its model call: ada's memory lock, on a session of its own."""
    lock = memory_lock_key(key_of("ada"))
    with psycopg.connect(deployment.dsn, autocommit=True) as flush:
        flush.execute("SELECT pg_advisory_lock(%s)", (lock,))
        try:
            yield
        finally:
            flush.execute("SELECT pg_advisory_unlock(%s)", (lock,))


def audited(deployment: Deployment) -> list[tuple[object, ...]]:
    return deployment.query("SELECT erasure_id, status FROM erasure_audit ORDER BY id")


def pending(deployment: Deployment) -> list[tuple[object, ...]]:
    return [
        (str(e), *rest)
        for e, *rest in deployment.query(
            "SELECT erasure_id, organization_id, user_id, fact_id FROM erasure_pending"
        )
    ]


def test_a_forget_of_a_memory_being_consolidated_is_accepted_and_finished_by_a_processor(
    deployment: Deployment,
) -> None:
    with api(deployment, lock_wait_s=0.5) as (c, client):
        (fact,) = c.memory.facts(key_of("ada"))
        with flushing(deployment):
            started = time.monotonic()
            accepted = client.delete("/v1/users/ada?idempotency_key=gdpr-1", headers=A)
            assert time.monotonic() - started < HUNG_S
            assert accepted.status_code == 202, accepted.text
            body = accepted.json()
            erasure_id = body["erasure_id"]
            assert body == {
                "user_id": "ada",
                "erasure_id": erasure_id,
                "scope": "memory",
                "subject": body["subject"],
                "status": "started",
                "tombstone": None,
                "removed": {},
                "digest": None,
            }
            # Audited open, as the locked path audits it: its memory's flushes wait for it.
            assert [(str(i), s) for i, s in audited(deployment)] == [(erasure_id, "started")]
            assert pending(deployment) == [(erasure_id, "org-a", "ada", None)]
            # Asked again while it is open, with its key or none: the same erasure, open.
            for query in ("?idempotency_key=gdpr-1", ""):
                again = client.delete(f"/v1/users/ada{query}", headers=A)
                assert (again.status_code, again.json()) == (202, body), again.text
            assert len(audited(deployment)) == 1
            # Nothing of it done meanwhile; the resumption takes a young erasure only if its
            # memory is free, and does not wait for the flush.
            started = time.monotonic()
            assert resume_erasures_once(c) == 0
            assert time.monotonic() - started < HUNG_S
            assert [f.content for f in c.memory.facts(key_of("ada"))] == [fact.content]
        # The flush done, the processors' next resumption finishes it, young as it is.
        assert resume_erasures_once(c) == 1
        assert [s for _, s in audited(deployment)] == ["completed"]
        assert pending(deployment) == []
        assert c.memory.facts(key_of("ada")) == []
        assert list(c.index.embeddings([fact.fact_id])) == []
        done = client.delete("/v1/users/ada?idempotency_key=gdpr-1", headers=A)
        assert done.status_code == 200, done.text
        receipt = done.json()
        assert (receipt["erasure_id"], receipt["status"]) == (erasure_id, "completed")
        assert receipt["removed"]["postgres"]["memory_facts"] == 1
        assert receipt["tombstone"] is not None
        assert receipt["digest"].startswith("sha256:")


def test_a_fact_erasure_of_a_memory_being_consolidated_is_accepted_or_refused_as_unknown(
    deployment: Deployment,
) -> None:
    with api(deployment, lock_wait_s=0.5) as (c, client):
        (fact,) = c.memory.facts(key_of("ada"))
        path = f"/v1/users/ada/facts/{fact.fact_id}"
        with flushing(deployment):
            # A fact the memory does not hold is refused, busy or not, nothing audited.
            unknown = client.delete(f"/v1/users/ada/facts/{uuid.uuid4()}", headers=A)
            assert unknown.status_code == 404, unknown.text
            assert audited(deployment) == []
            accepted = client.delete(path, headers=A)
            assert accepted.status_code == 202, accepted.text
            body = accepted.json()
            assert (body["scope"], body["status"], body["removed"]) == ("fact", "started", {})
            assert body["digest"] is None
            erasure_id = body["erasure_id"]
            assert [(str(i), s) for i, s in audited(deployment)] == [(erasure_id, "started")]
            assert pending(deployment) == [(erasure_id, "org-a", "ada", fact.fact_id)]
            again = client.delete(path, headers=A)  # no key: it joins the open one
            assert (again.status_code, again.json()) == (202, body), again.text
        assert resume_erasures_once(c) == 1
        assert [s for _, s in audited(deployment)] == ["completed"]
        assert c.memory.facts_by_id([fact.fact_id]) == []
        assert list(c.index.embeddings([fact.fact_id])) == []
        done = client.delete(path, headers=A)
        assert done.status_code == 200, done.text
        receipt = done.json()
        assert (receipt["erasure_id"], receipt["status"]) == (erasure_id, "completed")
        assert receipt["removed"]["postgres"]["memory_facts"] == 1
        assert receipt["removed"]["chroma"] == {"vectors": 1}


def test_forgets_accepted_at_once_of_a_busy_memory_share_one_erasure(
    deployment: Deployment,
) -> None:
    with (
        api(deployment, lock_wait_s=0.5) as (_c, client),
        ThreadPoolExecutor(2) as callers,
        flushing(deployment),
        psycopg.connect(deployment.dsn) as audit,
    ):
        # Both give up waiting for the memory and find no erasure open; their audit rows wait
        # behind this share lock, so that both have looked when the first is let go.
        audit.execute("LOCK TABLE erasure_audit IN SHARE MODE")
        forgets = [callers.submit(client.delete, "/v1/users/ada", headers=A) for _ in range(2)]
        try:
            both_waiting(deployment, past_s=1.0)
        finally:
            audit.commit()
        answers = [f.result(timeout=HUNG_S) for f in forgets]
        assert [a.status_code for a in answers] == [202, 202], [a.text for a in answers]
        first, second = (a.json() for a in answers)
        assert first == second
        assert [(str(i), s) for i, s in audited(deployment)] == [(first["erasure_id"], "started")]


def test_concurrent_forgets_of_one_memory_share_one_erasure(deployment: Deployment) -> None:
    with (
        api(deployment, lock_wait_s=HUNG_S) as (_c, client),
        ThreadPoolExecutor(2) as callers,
        psycopg.connect(deployment.dsn) as audit,
    ):
        # Audit rows wait behind this share lock, which lets every read through: whatever two
        # forgets check before auditing, both have checked it when they are let go.
        audit.execute("LOCK TABLE erasure_audit IN SHARE MODE")
        forgets = [callers.submit(client.delete, "/v1/users/ada", headers=A) for _ in range(2)]
        try:
            both_waiting(deployment)
        finally:
            audit.commit()
        answers = [f.result(timeout=60) for f in forgets]
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    first, second = (a.json() for a in answers)
    assert first == second  # the same receipt, not a second erasure finding nothing
    assert [(str(i), s) for i, s in audited(deployment)] == [(first["erasure_id"], "completed")]


def test_erasures_of_one_fact_at_once_or_again_share_the_erasure_that_removed_it(
    deployment: Deployment,
) -> None:
    with api(deployment, lock_wait_s=HUNG_S) as (c, client), ThreadPoolExecutor(2) as callers:
        (fact,) = c.memory.facts(key_of("ada"))
        bobs = make_fact("bob", "Bob grows tomatoes")
        seed_core(c, "bob", [bobs], org="org-a")
        path = f"/v1/users/ada/facts/{fact.fact_id}"
        # Both find the fact held, then wait for the memory's lock: the second to get it
        # finds the fact gone, and was answered 404.
        with flushing(deployment):
            erasures = [callers.submit(client.delete, path, headers=A) for _ in range(2)]
            both_waiting(deployment)
        answers = [e.result(timeout=60) for e in erasures]
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        first, second = (a.json() for a in answers)
        assert first == second
        assert first["removed"]["postgres"]["memory_facts"] == 1
        assert [(str(i), s) for i, s in audited(deployment)] == [(first["erasure_id"], "completed")]
        # Asked again later, with or without a key of its own: the same receipt.
        for query in ("", "?idempotency_key=again-1"):
            again = client.delete(path + query, headers=A)
            assert (again.status_code, again.json()) == (200, first), again.text
        # Not for a fact id ada never had, nor for bob's, once bob's erasure removed it.
        assert client.delete(f"/v1/users/bob/facts/{bobs.fact_id}", headers=A).status_code == 200
        for stranger in (bobs.fact_id, uuid.uuid4()):
            assert client.delete(f"/v1/users/ada/facts/{stranger}", headers=A).status_code == 404
        assert len(audited(deployment)) == 2


def both_waiting(deployment: Deployment, timeout_s: float = 30, past_s: float = 0) -> None:
    """Until two sessions of this database wait for a lock (the table's or the memory's),
    looking from `past_s` on (after the waits for the memory that give up)."""
    time.sleep(past_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ((waiting,),) = deployment.query(
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        if waiting >= 2:
            return
        time.sleep(0.05)
    raise AssertionError("the two forgets never both waited")
