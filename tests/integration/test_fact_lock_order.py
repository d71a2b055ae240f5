"""The order in which a run's upsert, the indexer's mark and a fact erasure lock fact rows, on
real Postgres.

Each takes many rows of one memory; taken in two orders, two transactions over the same rows
deadlock and Postgres aborts one (an aborted run pays for its model call again). All must
lock in fact id order. Checked without a race: a row is held from outside, the writer is
let block on it, and the row before it in id order must already be the writer's.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from domain.erasure import ErasureScope
from domain.model import Fact, FactChange, FactChangeKind
from store.write.erasure_log import PostgresErasureLog
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, make_fact, seed, seed_update
from tests.support.deployment import wait_until

pytestmark = pytest.mark.integration

_BLOCKED = (
    "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


def _two_facts(store: PostgresMemoryStore) -> tuple[Fact, Fact]:
    seed(store, "ada", [make_fact("ada", "Ada lives in Berlin"), make_fact("ada", "Ada likes tea")])
    first, last = sorted(store.pending_index(), key=lambda f: f.fact_id)
    return first, last


def _locks_first_row_before_waiting(
    dsn: str, first: Fact, last: Fact, write: Callable[[], object]
) -> bool:
    """Whether `write`, blocked on `last`, already holds `first`."""
    with psycopg.connect(dsn) as holder, psycopg.connect(dsn, autocommit=True) as probe:
        holder.execute("SELECT 1 FROM memory_facts WHERE fact_id = %s FOR UPDATE", (last.fact_id,))
        writer = threading.Thread(target=write)
        writer.start()
        try:
            wait_until(
                lambda: probe.execute(_BLOCKED).fetchall() == [(1,)], 30, "the writer to block"
            )
            try:
                probe.execute(
                    "SELECT 1 FROM memory_facts WHERE fact_id = %s FOR NO KEY UPDATE NOWAIT",
                    (first.fact_id,),
                )
            except psycopg.errors.LockNotAvailable:
                return True
            return False
        finally:
            holder.rollback()
            writer.join(30)


def test_the_indexer_marks_rows_in_id_order(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    store = PostgresMemoryStore(migrated_pool)
    first, last = _two_facts(store)
    marked: list[list[Fact]] = []

    def mark() -> None:
        marked.append(store.mark_indexed([last, first], BASE_TIME, lambda _marked: []))

    assert _locks_first_row_before_waiting(fresh_database, first, last, mark)
    assert [len(m) for m in marked] == [2]


def test_a_run_upserts_rows_in_id_order(migrated_pool: ConnectionPool, fresh_database: str) -> None:
    store = PostgresMemoryStore(migrated_pool)
    first, last = _two_facts(store)
    update = seed_update(store, "ada", [])
    changes = tuple(
        FactChange(FactChangeKind.UPDATE, replace(f, salience=0.9), f) for f in (last, first)
    )
    update = replace(update, fact_changes=changes)

    assert _locks_first_row_before_waiting(fresh_database, first, last, lambda: store.apply(update))
    assert {f.salience for f in store.facts_by_id([first.fact_id, last.fact_id])} == {0.9}


def test_a_fact_erasure_locks_the_rows_it_writes_in_id_order(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    store = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", "Ada lives in Berlin")
    # A fact quoting it (the erasure redacts it) whose id comes first.
    quoting = next(
        f
        for f in (make_fact("ada", f"{n}: {erased.content}") for n in range(100))
        if f.fact_id < erased.fact_id
    )
    seed(store, "ada", [erased, quoting])
    log, erasure_id = PostgresErasureLog(migrated_pool), uuid.uuid4()
    log.start(
        erasure_id,
        subject="subject-of-ada",
        scope=ErasureScope.FACT,
        key=key_of("ada"),
        fact_id=erased.fact_id,
        actor="test",
        reason="the user asked",
    )

    def erase() -> None:
        log.erase_fact(erasure_id, key_of("ada"), erased.fact_id, {})

    assert _locks_first_row_before_waiting(fresh_database, quoting, erased, erase)
    assert store.facts_by_id([erased.fact_id]) == []
    assert [f.content for f in store.facts_by_id([quoting.fact_id])] == [
        quoting.content.replace(erased.content, "[erased]")
    ]
