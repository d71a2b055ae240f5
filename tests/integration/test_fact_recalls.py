"""A chat turn's recall counts go to their own narrow table: the fact's row is not rewritten,
and an erasure takes the counts with the facts."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from domain.reads import Scope
from store.read.fact_queries import PostgresReadModel
from store.write.erasure_log import PostgresErasureLog
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, log_row, make_fact, seed
from tests.support.erasure import SUBJECTS, open_memory_erasure

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
    memory, reads = PostgresMemoryStore(pool), PostgresReadModel(pool, SUBJECTS)
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(memory, "ada", [berlin])
    before = row_version(pool, berlin.fact_id)
    later = BASE_TIME + timedelta(minutes=5)
    generation = generation_of(reads, ADA)
    reads.write_context_logs([log_row(ADA, generation=generation, recalled=[berlin])])
    reads.write_context_logs(
        [
            log_row(ADA, generation=generation, recalled=[berlin], at=later),
            log_row(ADA, generation=generation, recalled=[berlin]),
        ]
    )
    assert row_version(pool, berlin.fact_id) == before
    (stored,) = memory.facts_by_id([berlin.fact_id])
    assert (stored.recall_count, stored.last_recalled_at) == (3, later)
    (in_scope,) = reads.facts_in_scope(Scope(ADA), [berlin.fact_id])
    assert (in_scope.recall_count, in_scope.last_recalled_at) == (3, later)


def test_an_erasure_takes_the_recall_counts_with_the_facts(pool: ConnectionPool) -> None:
    memory, reads = PostgresMemoryStore(pool), PostgresReadModel(pool, SUBJECTS)
    ada_fact = make_fact("ada", "Ada lives in Berlin")
    bob_fact = make_fact("bob", "Bob lives in Oslo")
    seed(memory, "ada", [ada_fact])
    seed(memory, "bob", [bob_fact])
    bob = key_of("bob")
    reads.write_context_logs(
        [
            log_row(ADA, generation=generation_of(reads, ADA), recalled=[ada_fact]),
            log_row(bob, generation=generation_of(reads, bob), recalled=[bob_fact]),
        ]
    )
    assert recall_rows(pool) == 2
    erase(pool, ADA)
    assert recall_rows(pool) == 1
    (bob_stored,) = memory.facts_by_id([bob_fact.fact_id])
    assert bob_stored.recall_count == 1
    # A turn that read the memory before the erasure, written after it: nothing counted.
    reads.write_context_logs([log_row(ADA, generation=None, recalled=[ada_fact])])
    assert recall_rows(pool) == 1


def generation_of(reads: PostgresReadModel, key: MemoryKey) -> uuid.UUID:
    injection = reads.injection(key)
    assert injection is not None
    return injection.generation


def erase(pool: ConnectionPool, key: MemoryKey) -> None:
    log = PostgresErasureLog(pool)
    erasure_id = open_memory_erasure(log, key, "subject-of-ada")
    log.erase_memory(erasure_id, key, "subject-of-ada", {})
