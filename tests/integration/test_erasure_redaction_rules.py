"""What an erasure redacts, on real Postgres (migration 0021): the erased text as whole words
only, not inside a longer word."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import SubjectHasher
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


def _fail_job(pool: ConnectionPool, job: str, error: str) -> None:
    def fail() -> None:
        raise StoreError(error)

    with pytest.raises(StoreError):
        ClusterJobs(pool, lambda: BASE_TIME).run_if_due(job, timedelta(hours=1), fail)


def _failed_maintenance(pool: ConnectionPool, error: str) -> None:
    row = MaintenanceRunRow(uuid.uuid4(), "dedupe", BASE_TIME, "failed", 3, {"merge": 2}, {}, error)
    MaintenanceQueries(pool).record_run(row)


def _erase(pool: ConnectionPool, fact_id: uuid.UUID) -> dict[str, Any]:
    log = PostgresErasureLog(pool)
    return log.erase_fact(open_fact_erasure(log, ADA, fact_id), ADA, fact_id, {})


def _errors(dsn: str) -> list[str]:
    return [
        e
        for (e,) in rows(
            dsn,
            "SELECT error FROM maintenance_runs UNION ALL SELECT last_error FROM scheduled_jobs"
            " UNION ALL SELECT error FROM consolidation_runs WHERE error IS NOT NULL",
        )
    ]


def test_a_fact_s_text_is_redacted_as_whole_words_only(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", "database")
    longer = make_fact("ada", "Ada tunes databases")
    seed(
        memory,
        "ada",
        [erased, longer],
        working_memory="Ada designs databases; her database is down.\nAn old Database.",
    )
    events = [make_event("ada", "I love databases", minutes=0), make_event("ada", "my database")]
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(e, None) for e in events])
    # The model's answer as the run logged it: JSON, where a word may follow an escape.
    answer = '{"updated_working_memory": "Ada:\\ndatabase, databases"}'
    memory.record_run(
        replace(
            make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
            raw_response=answer,
            error="output is not JSON: database_url",
        )
    )
    _fail_job(migrated_pool, "maintenance-dedupe", "connection to databases lost")
    _fail_job(migrated_pool, "maintenance-index", "the database is gone")

    receipt = _erase(migrated_pool, erased.fact_id)

    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [
        ("Ada designs databases; her [erased] is down.\nAn old [erased].",)
    ]
    # A fact saying a longer word keeps its text, and is not rewritten (nor indexed again).
    assert [f.content for f in memory.facts_by_id([longer.fact_id])] == ["Ada tunes databases"]
    assert receipt["redacted"]["memory_facts"] == 0
    assert rows(fresh_database, "SELECT content FROM context_events ORDER BY content") == [
        ("I love databases",),
        ("[erased]",),
    ]
    assert rows(
        fresh_database, "SELECT raw_response, error FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [
        (
            '{"updated_working_memory": "Ada:\\n[erased], databases"}',
            "output is not JSON: database_url",
        )
    ]
    assert sorted(_errors(fresh_database)) == [
        "StoreError: connection to databases lost",
        "StoreError: the [erased] is gone",
        "output is not JSON: database_url",
    ]


@pytest.mark.parametrize(
    ("text", "wording", "redacted"),
    [
        # Not word characters at its ends: the text is found next to anything.
        ("#bramble!", "Ada wrote x#Bramble!! twice", "Ada wrote x[erased]! twice"),
        # Quotes count as non-word characters, whichever side.
        ("Bramble's", "Bramble's bowl, Brambles' bowls", "[erased] bowl, Brambles' bowls"),
    ],
)
def test_a_text_ending_in_another_character_is_found_next_to_anything(
    migrated_pool: ConnectionPool, fresh_database: str, text: str, wording: str, redacted: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", text)
    seed(memory, "ada", [erased], working_memory=wording)
    _erase(migrated_pool, erased.fact_id)
    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [(redacted,)]


def test_a_forget_redacts_the_cluster_jobs_errors_as_whole_words(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    seed(memory, "ada", [make_fact("ada", "Portuguese")])
    _failed_maintenance(migrated_pool, "dedupe failed: (Portuguese)")
    _failed_maintenance(migrated_pool, "dedupe failed: Portuguese-speaking users")
    _fail_job(migrated_pool, "maintenance-dedupe", "no locale PortugueseBR")

    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_memory_erasure(log, ADA, "subject-of-ada")
    log.erase_memory(erasure_id, ADA, "subject-of-ada", {})

    assert sorted(_errors(fresh_database)) == [
        "StoreError: no locale PortugueseBR",
        "dedupe failed: ([erased])",
        "dedupe failed: [erased]-speaking users",
    ]
