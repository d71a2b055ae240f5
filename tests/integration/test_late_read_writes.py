"""What a chat turn leaves behind is written in the background, so it can arrive once an
erasure of its memory has opened: its audit row is dropped, its cost goes under the
erasure's pseudonym, and the user's ids are never written again."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey, read_entry_id_for
from domain.model import LedgerEntry
from store.read.fact_queries import PostgresReadModel
from store.read.read_ledger import ReadCost, ReadLedger
from store.write.erasure_log import PostgresErasureLog
from store.write.locks import log_lock_key
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, log_row, make_fact, seed
from tests.support.erasure import open_memory_erasure

pytestmark = pytest.mark.integration

ADA = key_of("ada")


def cost(key: MemoryKey, turn: int) -> LedgerEntry:
    log_id = uuid.uuid5(uuid.NAMESPACE_OID, f"{key.joined}/{turn}")  # a turn's audit id
    return LedgerEntry(
        read_entry_id_for(log_id, "query-embedding"),
        key.user_id,
        key.organization_id,
        None,
        "embedding",
        "all-MiniLM-L6-v2",
        1,
        2,
        BASE_TIME + timedelta(minutes=turn),
    )


def ledger(pool: ConnectionPool) -> list[tuple[str, str, int]]:
    """(user id, organization, amount) of every row, by time."""
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT user_id, organization_id, cost_micro_usd FROM credit_ledger"
            " ORDER BY occurred_at, user_id"
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_a_read_written_after_an_erasure_opened_keeps_no_ids(pool: ConnectionPool) -> None:
    memory, reads, costs = PostgresMemoryStore(pool), PostgresReadModel(pool), ReadLedger(pool)
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(memory, "ada", [berlin])
    seed(memory, "ada", [make_fact("ada", "Ada lives in Berlin", org="org-b")], org="org-b")
    injection = reads.injection(ADA)
    assert injection is not None
    read = injection.generation
    other = key_of("ada", "org-b")
    costs.write([ReadCost(cost(ADA, 1), read), ReadCost(cost(other, 1), None)])

    erasures = PostgresErasureLog(pool)
    erasure = open_memory_erasure(erasures, ADA, "subject-of-ada")
    pseudonym = f"erased:{erasure}"
    # Open, not yet erased: the memory is still there, but nothing is written with its ids.
    reads.write_context_logs([log_row(ADA, generation=read, recalled=[berlin])])
    assert reads.context_logs(ADA) == []
    (unrecalled,) = memory.facts_by_id([berlin.fact_id])
    assert unrecalled.recall_count == 0
    for _ in range(2):  # the writer retrying the batch books it once
        costs.write([ReadCost(cost(ADA, 2), read)])
    assert ledger(pool)[-1] == (pseudonym, "org-a", 2)

    erasures.erase_memory(erasure, ADA, "subject-of-ada", {})
    costs.write([ReadCost(cost(ADA, 3), read)])
    erasures.complete(erasure)
    # Completed before the cost arrived: the erasure is not known any more.
    costs.write([ReadCost(cost(ADA, 4), read), ReadCost(cost(ADA, 5), None)])

    assert ledger(pool) == [
        ("ada", "org-b", 2),
        (pseudonym, "org-a", 2),  # the erasure anonymised the row booked before it opened
        (pseudonym, "org-a", 2),
        (pseudonym, "org-a", 2),
        ("erased:unknown", "org-a", 2),
        ("ada", "org-a", 2),  # a turn on no memory, after the erasure: the user came back
    ]


def test_a_read_written_while_an_erasure_holds_the_memory_waits_and_keeps_no_ids(
    pool: ConnectionPool,
) -> None:
    # The guard alone was read in the write's own snapshot: a write whose guard ran before the
    # erasure opened could commit after erase_memory's deletes, with the user's ids.
    memory, reads, costs = PostgresMemoryStore(pool), PostgresReadModel(pool), ReadLedger(pool)
    seed(memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    injection = reads.injection(ADA)
    assert injection is not None
    read = injection.generation
    erasures = PostgresErasureLog(pool)
    with psycopg.connect(pool.conninfo) as erasing:  # what erase_memory takes first
        erasing.execute("SELECT pg_advisory_xact_lock(%s)", (log_lock_key(ADA),))
        writer = threading.Thread(
            target=lambda: (
                reads.write_context_logs([log_row(ADA, generation=read)]),
                costs.write([ReadCost(cost(ADA, 1), read)]),
            )
        )
        writer.start()
        waiting_for_an_advisory_lock(pool)
        erasure = open_memory_erasure(erasures, ADA, "subject-of-ada")
    writer.join(timeout=30)
    assert reads.context_logs(ADA) == []
    assert ledger(pool) == [(f"erased:{erasure}", "org-a", 2)]


def waiting_for_an_advisory_lock(pool: ConnectionPool, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(pool.conninfo) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
        if row is not None and row[0] > 0:
            return
        time.sleep(0.05)
    raise AssertionError("the write never waited for the memory's log lock")


@pytest.fixture
def pool(migrated_pool: ConnectionPool) -> ConnectionPool:
    return migrated_pool
