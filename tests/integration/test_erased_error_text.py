"""An erasure takes the erased text out of the free-text error columns on real Postgres: a
failed run's error (which can quote the model's answer), a failed maintenance run's, and a
cluster job's last error. The rows stay, with their costs and counts. The receipt does not
count the cluster jobs' rows: they are every tenant's."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey, SubjectHasher
from domain.model import RunStatus
from store.errors import StoreError
from store.write.cluster_jobs import ClusterJobs
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, make_event, make_fact, make_run, seed
from tests.support.erasure import open_fact_erasure, open_memory_erasure, rows

pytestmark = pytest.mark.integration

ADA = key_of("ada")
QUOKKA = "Ada keeps a pet quokka named Bramble"
ANSWER = f'output does not match the schema: input_value="{QUOKKA} since 2019"'


def _fail_job(pool: ConnectionPool, job: str, error: str) -> None:
    def fail() -> None:
        raise StoreError(error)

    with pytest.raises(StoreError):
        ClusterJobs(pool, lambda: BASE_TIME).run_if_due(job, timedelta(hours=1), fail)


def _failed_maintenance(pool: ConnectionPool, error: str) -> None:
    row = MaintenanceRunRow(uuid.uuid4(), "dedupe", BASE_TIME, "failed", 3, {"merge": 2}, {}, error)
    MaintenanceQueries(pool).record_run(row)


def _errors(dsn: str) -> list[tuple[str, object]]:
    return [
        *rows(dsn, "SELECT 'run', error FROM consolidation_runs WHERE status = 'failed'"),
        *rows(dsn, "SELECT 'maintenance', error FROM maintenance_runs ORDER BY seq"),
        *rows(dsn, "SELECT 'job', last_error FROM scheduled_jobs ORDER BY job"),
    ]


def _quoting(errors: Sequence[tuple[str, object]], text: str) -> list[str]:
    return [where for where, error in errors if text in str(error)]


def test_a_fact_erasure_redacts_the_errors_quoting_the_fact(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    quokka = make_fact("ada", QUOKKA)
    seed(memory, "ada", [quokka, make_fact("ada", "Ada plays the cello")])
    failed = replace(
        make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
        error=ANSWER,
        cost_micro_usd=120,
    )
    memory.record_run(failed)
    _failed_maintenance(migrated_pool, f"dedupe failed: row ({quokka.fact_id}, {QUOKKA})")
    _fail_job(migrated_pool, "maintenance-dedupe", f"check violation: ({QUOKKA})")
    _fail_job(migrated_pool, "maintenance-index", "Chroma is down")
    assert _quoting(_errors(fresh_database), QUOKKA) == ["run", "maintenance", "job"]

    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_fact_erasure(log, ADA, quokka.fact_id)
    removed = log.erase_fact(erasure_id, ADA, quokka.fact_id, {})

    errors = _errors(fresh_database)
    assert _quoting(errors, QUOKKA) == []
    assert _quoting(errors, str(quokka.fact_id)) == []
    assert ("run", 'output does not match the schema: input_value="[erased] since 2019"') in errors
    assert ("job", "StoreError: Chroma is down") in errors  # quoting nothing of it
    # The cluster jobs' errors are every tenant's: the receipt does not say whether they
    # quoted the text, which would tell the caller what another tenant's rows hold.
    assert "maintenance_runs" not in removed["redacted"]
    assert "scheduled_jobs" not in removed["redacted"]
    # The rows stay, with what they cost and counted.
    assert rows(
        fresh_database, "SELECT cost_micro_usd FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [(120,)]
    assert rows(fresh_database, "SELECT users, changes FROM maintenance_runs") == [
        (3, {"merge": 2})
    ]


def test_a_short_fact_erased_leaves_the_cluster_jobs_errors_alone(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    # Another tenant's error saying "ok" or "python" quotes nobody: cut out, it loses words
    # ("br[erased]er"), and the receipt would tell whether some cluster error says them.
    memory = PostgresMemoryStore(migrated_pool)
    ok, python = make_fact("ada", "ok"), make_fact("ada", "Python")
    seed(memory, "ada", [ok, python])
    _failed_maintenance(migrated_pool, "dedupe failed: broker ok")
    _fail_job(migrated_pool, "maintenance-dedupe", "broker ok, python3 gone")
    before = _errors(fresh_database)

    log = PostgresErasureLog(migrated_pool)
    receipts = [
        log.erase_fact(open_fact_erasure(log, ADA, fact.fact_id), ADA, fact.fact_id, {})
        for fact in (ok, python)
    ]

    assert _errors(fresh_database) == before
    assert ("maintenance", "dedupe failed: broker ok") in before
    for receipt in receipts:
        assert "user_memory" in receipt["redacted"]
        assert not {"maintenance_runs", "scheduled_jobs"} & set(receipt["redacted"])


def test_forgetting_a_memory_redacts_the_cluster_jobs_errors_quoting_it(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    quokka = make_fact("ada", QUOKKA)
    seed(memory, "ada", [quokka])
    seed(memory, "bob", [make_fact("bob", "Bob keeps bees")])
    said = "I started learning Portuguese"
    event = make_event("ada", said, minutes=0)
    short = make_event("ada", "token", minutes=1)  # too short to be taken for a quote
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(event, None), (short, None)])
    _failed_maintenance(migrated_pool, "index failed: the token expired")
    _failed_maintenance(migrated_pool, f"lifecycle failed: ({quokka.fact_id})")
    _failed_maintenance(migrated_pool, f"dedupe failed: ({said}) and (Bob keeps bees)")
    _failed_maintenance(migrated_pool, f"dedupe failed: ({said}) and (Bob keeps bees)")
    _fail_job(migrated_pool, "maintenance-dedupe", f'value too long: "{QUOKKA}"')

    receipt = erase(migrated_pool, ADA)

    errors = _errors(fresh_database)
    for quote in (QUOKKA, said, str(quokka.fact_id)):
        assert _quoting(errors, quote) == [], quote
    assert _quoting(errors, "Bob keeps bees") == ["maintenance", "maintenance"]
    assert ("maintenance", "dedupe failed: ([erased]) and (Bob keeps bees)") in errors
    assert ("job", 'StoreError: value too long: "[erased]"') in errors
    assert ("maintenance", "index failed: the token expired") in errors
    # Redacted, yet not counted: the rows are every tenant's (see the next test).
    assert rows(fresh_database, "SELECT removed FROM erasure_audit") == [(receipt,)]
    assert "redacted" not in receipt
    assert rows(fresh_database, "SELECT count(*) FROM maintenance_runs") == [(4,)]


def test_a_forget_s_receipt_does_not_tell_what_the_cluster_jobs_errors_say(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    # A tenant writes its own events' text: had the receipt counted the cluster errors the
    # forget redacted, it would tell whether another tenant's error says a text of its choice.
    secret = "Grace's card number ends in 4242"
    _failed_maintenance(migrated_pool, f"dedupe failed: ({secret})")
    _fail_job(migrated_pool, "maintenance-dedupe", f"check violation: ({secret})")
    probe, control = key_of("mallory", org="org-b"), key_of("eve", org="org-b")
    events = [
        make_event("mallory", secret, org="org-b"),
        make_event("eve", "Eve takes her tea with lemon", org="org-b"),
    ]
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(e, None) for e in events])

    guessed, missed = erase(migrated_pool, probe), erase(migrated_pool, control)

    errors = _errors(fresh_database)
    assert ("maintenance", "dedupe failed: ([erased])") in errors
    assert ("job", "StoreError: check violation: ([erased])") in errors
    assert guessed == missed  # the same rows of its own removed, whatever the others' say
    assert guessed["postgres"]["context_events"] == 1


def erase(pool: ConnectionPool, key: MemoryKey) -> dict[str, Any]:
    log = PostgresErasureLog(pool)
    subject = f"subject-of-{key.user_id}"
    erasure_id = open_memory_erasure(log, key, subject)
    return log.erase_memory(erasure_id, key, subject, {})
