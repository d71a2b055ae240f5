"""A run's fact writes in Postgres: the history rows follow the rows the table actually took,
and a fact id held by another memory fails the whole run, leaving nothing written."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from domain.model import FactChange, FactChangeKind, FactStatus
from store.errors import StoreError
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, make_fact, seed, seed_update

pytestmark = pytest.mark.integration

ADA = key_of("ada")
LATER = BASE_TIME + timedelta(hours=1)


@pytest.fixture
def pool(migrated_pool: ConnectionPool) -> ConnectionPool:
    return migrated_pool


def history(pool: ConnectionPool, run_id: uuid.UUID) -> list[tuple[uuid.UUID, str]]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT fact_id, operation FROM fact_history WHERE run_id = %s ORDER BY id",
            (run_id,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_a_refused_pinned_fact_gets_no_history_row_and_the_rest_of_the_run_does(
    pool: ConnectionPool,
) -> None:
    memory = PostgresMemoryStore(pool)
    seed(memory, "ada", [make_fact("ada", "Ada's daughter is Mia", pinned=True)])
    (pinned,) = memory.facts(ADA)
    tea = make_fact("ada", "Ada likes tea", at=LATER)
    update = seed_update(memory, "ada", [tea], at=LATER)
    contradicted = replace(pinned, status=FactStatus.CONTRADICTED, updated_at=LATER)
    update = replace(
        update,
        fact_changes=(
            *update.fact_changes,
            FactChange(FactChangeKind.CONTRADICT, contradicted, pinned),
        ),
    )
    memory.apply(update)
    assert history(pool, update.run.run_id) == [(tea.fact_id, FactChangeKind.ADD.value)]
    assert memory.facts_by_id([pinned.fact_id]) == [pinned]
    assert memory.load_state(ADA).version == 2


def test_a_fact_id_held_by_another_memory_fails_the_run_and_writes_nothing(
    pool: ConnectionPool,
) -> None:
    memory = PostgresMemoryStore(pool)
    seed(memory, "bob", [make_fact("bob", "Bob lives in Oslo")])
    (theirs,) = memory.facts(key_of("bob"))
    # An id derived before ids carried the organization could repeat another memory's.
    clash = replace(make_fact("ada", "Ada lives in Oslo"), fact_id=theirs.fact_id)
    update = seed_update(memory, "ada", [clash, make_fact("ada", "Ada likes tea")])
    with pytest.raises(StoreError, match="belong to another memory"):
        memory.apply(update)
    assert memory.load_state(ADA).version == 0
    assert memory.facts(ADA) == []
    assert history(pool, update.run.run_id) == []
    assert memory.already_consolidated(ADA, update.run.input_event_ids) == frozenset()
    assert memory.facts_by_id([theirs.fact_id]) == [theirs]
