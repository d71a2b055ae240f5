"""A chat turn's recall counts go to their own narrow table: the fact's row is not rewritten,
and an erasure takes the counts with the facts."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from domain.erasure import ErasureScope
from domain.ids import MemoryKey
from domain.reads import Recall, Scope
from store.read.fact_queries import PostgresReadModel
from store.write.erasure_log import PostgresErasureLog
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, make_fact, seed

pytestmark = pytest.mark.integration

ADA = key_of("ada")


@pytest.fixture
def pool(migrated_pool: ConnectionPool) -> ConnectionPool:
    return migrated_pool


def row_version(pool: ConnectionPool, fact_id: uuid.UUID) -> tuple[str, str]:
    """The physical version of a fact's row: any UPDATE of it gives another."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT xmin::text, ctid::text FROM memory_facts WHERE fact_id = %s", (fact_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


def recall_rows(pool: ConnectionPool) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) FROM fact_recalls").fetchone()
    return int(row[0]) if row else 0


def test_recalls_leave_the_fact_row_as_it_is_and_add_up_in_every_read(
    pool: ConnectionPool,
) -> None:
    memory, reads = PostgresMemoryStore(pool), PostgresReadModel(pool)
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(memory, "ada", [berlin])
    before = row_version(pool, berlin.fact_id)
    later = BASE_TIME + timedelta(minutes=5)
    reads.record_recalls([Recall((berlin.fact_id,), BASE_TIME)])
    reads.record_recalls([Recall((berlin.fact_id,), later), Recall((berlin.fact_id,), BASE_TIME)])
    assert row_version(pool, berlin.fact_id) == before
    (stored,) = memory.facts_by_id([berlin.fact_id])
    assert (stored.recall_count, stored.last_recalled_at) == (3, later)
    (in_scope,) = reads.facts_in_scope(Scope(ADA), [berlin.fact_id])
    assert (in_scope.recall_count, in_scope.last_recalled_at) == (3, later)


def test_an_erasure_takes_the_recall_counts_with_the_facts(pool: ConnectionPool) -> None:
    memory, reads = PostgresMemoryStore(pool), PostgresReadModel(pool)
    ada_fact = make_fact("ada", "Ada lives in Berlin")
    bob_fact = make_fact("bob", "Bob lives in Oslo")
    seed(memory, "ada", [ada_fact])
    seed(memory, "bob", [bob_fact])
    reads.record_recalls([Recall((ada_fact.fact_id, bob_fact.fact_id), BASE_TIME)])
    assert recall_rows(pool) == 2
    erase(pool, ADA)
    assert recall_rows(pool) == 1
    (bob_stored,) = memory.facts_by_id([bob_fact.fact_id])
    assert bob_stored.recall_count == 1
    # Counted after the erasure: the fact is gone, the count is skipped.
    reads.record_recalls([Recall((ada_fact.fact_id,), BASE_TIME)])
    assert recall_rows(pool) == 1


def erase(pool: ConnectionPool, key: MemoryKey) -> None:
    log = PostgresErasureLog(pool)
    erasure_id = uuid.uuid4()
    log.start(
        erasure_id,
        subject="subject-of-ada",
        scope=ErasureScope.MEMORY,
        key=key,
        fact_id=None,
        actor="test",
        reason="erasure of the memory",
    )
    log.erase_memory(erasure_id, key, "subject-of-ada", {})
