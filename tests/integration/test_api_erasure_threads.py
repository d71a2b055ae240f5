"""Erasures on their own few threads of the API, on real Kafka, Postgres and Chroma: erasures
waiting for a memory a flush holds leave the other routes and the health probes alone."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from anyio import to_thread
from fastapi.testclient import TestClient

from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.settings import ApiSettings
from store.write.locks import memory_lock_key
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment, seed_core

pytestmark = pytest.mark.integration

TOKEN_A, TOKEN_B = "token-for-org-a", "token-for-org-b"
A = {"Authorization": f"Bearer {TOKEN_A}"}
B = {"Authorization": f"Bearer {TOKEN_B}"}
# Threads of the server's shared pool (anyio's default is 40): as few as the test's erasures
# could fill, so that it needs no more than a handful of them.
SHARED_THREADS = 4
ERASURES = 6
PROMPTLY_S = 10.0


async def _shrink_the_shared_pool() -> None:
    to_thread.current_default_thread_limiter().total_tokens = SHARED_THREADS


def test_erasures_waiting_for_a_memory_leave_the_other_routes_and_the_probes_alone(
    deployment: Deployment,
) -> None:
    tokens = {hash_token(TOKEN_A): "org-a", hash_token(TOKEN_B): "org-b"}
    # The erasures wait as long as the flush holds the memory: none may give up meanwhile.
    api = ApiSettings(tokens=tokens, erasure_threads=2, erasure_lock_wait_s=300)
    settings = deployment.settings.model_copy(update={"api": api})
    with wiring.core(settings) as c, wiring.api_app(c) as app, TestClient(app) as client:
        seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
        seed_core(c, "bo", [make_fact("bo", "Bo rides a green bike", org="org-b")], org="org-b")
        assert client.portal is not None
        client.portal.call(_shrink_the_shared_pool)
        with (
            psycopg.connect(deployment.dsn, autocommit=True) as flush,
            ThreadPoolExecutor(ERASURES + 3) as callers,
        ):
            # What a flush holds through its model call: every erasure of ada's memory waits.
            lock = memory_lock_key(key_of("ada"))
            flush.execute("SELECT pg_advisory_lock(%s)", (lock,))
            try:
                forgets = [
                    callers.submit(client.delete, "/v1/users/ada", headers=A)
                    for _ in range(ERASURES)
                ]
                waiting_for_the_memory(deployment, at_least=2)
                probes = [
                    callers.submit(client.get, "/healthz"),
                    callers.submit(client.get, "/readyz"),
                    callers.submit(client.get, "/v1/users/bo/memory", headers=B),
                ]
                started = time.monotonic()
                answers = [p.result(timeout=PROMPTLY_S) for p in probes]
                assert time.monotonic() - started < PROMPTLY_S
                assert [a.status_code for a in answers] == [200, 200, 200]
                bo = answers[2].json()
                assert [f["content"] for f in bo["facts"]] == ["Bo rides a green bike"]
                assert not any(f.done() for f in forgets)
            finally:
                flush.execute("SELECT pg_advisory_unlock(%s)", (lock,))
            receipts = [f.result(timeout=60) for f in forgets]
        assert [r.status_code for r in receipts] == [200] * ERASURES
        assert client.get("/v1/users/ada/memory", headers=A).status_code == 404


def waiting_for_the_memory(deployment: Deployment, at_least: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (waiting,) = deployment.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        if waiting[0] >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} erasures ever waited for the memory")
