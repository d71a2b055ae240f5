"""The index drain's reads use the partial index of the pending facts on real Postgres.

The drain and the pending gauges run every 30 s in every processor, and almost every fact is
indexed: a plan that read the whole of `memory_facts` would cost what the table costs, each
time. With a few thousand facts and the tables analyzed, the planner takes the index
(migration 0002), whether few facts are pending or, after an outage of Chroma, all of them:
then the drain reads its batch in the index's order, not the whole backlog.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from store.postgres import transaction
from store.write.index_outbox import backlog_query, pending_query
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, make_fact

pytestmark = pytest.mark.integration

INDEX = "memory_facts_pending_index"
USERS = 40
FACTS_PER_USER = 100
BATCH = 256  # the drain's


def plan(pool: ConnectionPool, query: str, params: tuple[int, ...] = ()) -> str:
    with transaction(pool) as conn:
        rows = conn.execute(f"EXPLAIN {query}", params).fetchall()
    return "\n".join(r[0] for r in rows)


@pytest.fixture(params=[1, FACTS_PER_USER], ids=["few-pending", "all-pending"])
def facts(migrated_pool: ConnectionPool, request: pytest.FixtureRequest) -> ConnectionPool:
    """Four thousand facts, the last `request.param` of each user's pending, and the tables
    analyzed."""
    pending_per_user: int = request.param
    facts = [
        make_fact(f"user-{u}", f"fact {i} of user {u}", at=BASE_TIME + timedelta(minutes=i))
        for u in range(USERS)
        for i in range(FACTS_PER_USER)
    ]
    assert PostgresMemoryStore(migrated_pool).insert_facts(facts) == len(facts)
    with transaction(migrated_pool) as conn:
        conn.execute(
            "UPDATE memory_facts SET indexed_at = updated_at WHERE updated_at < %s",
            (BASE_TIME + timedelta(minutes=FACTS_PER_USER - pending_per_user),),
        )
        pending = conn.execute("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL")
        assert pending.fetchone() == (USERS * pending_per_user,)
    with migrated_pool.connection() as conn:
        conn.autocommit = True
        conn.execute("ANALYZE")
        conn.autocommit = False
    return migrated_pool


@pytest.mark.parametrize("skip_out_of_credit", [False, True])
def test_the_drain_reads_the_oldest_pending_facts_from_the_partial_index(
    facts: ConnectionPool, skip_out_of_credit: bool
) -> None:
    text = plan(facts, pending_query(skip_out_of_credit), (BATCH,))
    assert INDEX in text, text
    assert "Seq Scan on memory_facts" not in text, text
    with transaction(facts) as conn:
        row = conn.execute("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL")
        backlog = row.fetchone()
    if backlog is not None and backlog[0] > BATCH:
        # Read in the index's order until the batch is full, not fetched whole and sorted.
        assert f"Index Scan using {INDEX}" in text, text


# Few pending only: when most facts are pending the count must read most rows, and the
# sequential scan the planner takes then is the cheaper plan.
@pytest.mark.parametrize("facts", [1], ids=["few-pending"], indirect=True)
@pytest.mark.parametrize("skip_out_of_credit", [False, True])
def test_the_pending_gauges_count_from_the_partial_index(
    facts: ConnectionPool, skip_out_of_credit: bool
) -> None:
    text = plan(facts, backlog_query(skip_out_of_credit))
    assert INDEX in text, text
    assert "Seq Scan on memory_facts" not in text, text
