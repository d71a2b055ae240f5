"""What a chat turn leaves behind is written in the background, so it can arrive once an
erasure of its memory has opened, or completed: its audit row is dropped, its cost goes under
the erasure's pseudonym, and the user's ids are never written again. An erasure of one fact
forgets no user: a cost arriving after one is still the user's."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey, read_entry_id_for
from domain.model import LedgerEntry
from domain.reads import ContextLogRow
from store.inmemory import InMemoryVectorIndex
from store.read.background import BatchWriter
from store.read.context_service import ContextService
from store.read.fact_queries import PostgresReadModel
from store.read.read_ledger import ReadCharge, ReadCost, ReadLedger
from store.write.erasure_log import PostgresErasureLog
from store.write.locks import log_lock_key
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, log_row, make_fact, seed
from tests.support.erasure import SUBJECTS, open_fact_erasure, open_memory_erasure
from tests.support.fakes import BagOfWordsEmbedder

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
    memory, reads, costs = stores(pool)
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(memory, "ada", [berlin])
    seed(memory, "ada", [make_fact("ada", "Ada lives in Berlin", org="org-b")], org="org-b")
    injection = reads.injection(ADA)
    assert injection is not None
    read = injection.generation
    other = key_of("ada", "org-b")
    costs.write(
        [ReadCost(cost(ADA, 1), read, BASE_TIME), ReadCost(cost(other, 1), None, BASE_TIME)]
    )

    erasures = PostgresErasureLog(pool)
    erasure = open_memory_erasure(erasures, ADA, SUBJECTS(ADA))
    pseudonym = f"erased:{erasure}"
    # Open, not yet erased: the memory is still there, but nothing is written with its ids.
    reads.write_context_logs([log_row(ADA, generation=read, recalled=[berlin])])
    assert reads.context_logs(ADA) == []
    (unrecalled,) = memory.facts_by_id([berlin.fact_id])
    assert unrecalled.recall_count == 0
    for _ in range(2):  # the writer retrying the batch books it once
        costs.write([ReadCost(cost(ADA, 2), read, BASE_TIME)])
    assert ledger(pool)[-1] == (pseudonym, "org-a", 2)

    erasures.erase_memory(erasure, ADA, SUBJECTS(ADA), {})
    costs.write([ReadCost(cost(ADA, 3), read, BASE_TIME)])
    erasures.complete(erasure)
    # Completed before the cost arrived: the erasure is not known any more.
    back = datetime.now(UTC)
    costs.write([ReadCost(cost(ADA, 4), read, BASE_TIME), ReadCost(cost(ADA, 5), None, back)])

    assert ledger(pool) == [
        ("ada", "org-b", 2),
        (pseudonym, "org-a", 2),  # the erasure anonymised the row booked before it opened
        (pseudonym, "org-a", 2),
        (pseudonym, "org-a", 2),
        ("erased:unknown", "org-a", 2),
        ("ada", "org-a", 2),  # a turn on no memory, after the erasure: the user came back
    ]


def test_a_turn_on_a_memory_of_no_generation_read_before_a_forget_keeps_no_ids_after_it(
    pool: ConnectionPool,
) -> None:
    # A new user (events not consolidated yet, or turns only) has no memory row, so no
    # generation for the forget to change; and the forget's pending row, the other guard,
    # goes when it completes. A turn read before still writes nothing with the user's ids.
    reads, costs = stores(pool)[1:]
    newcomer = key_of("u2")
    logged, booked = turn(reads, newcomer, "I moved to Lisbon last week")
    assert [r.generation for r in logged] == [None]

    erasures = PostgresErasureLog(pool)
    erasure = open_memory_erasure(erasures, newcomer, SUBJECTS(newcomer))
    erasures.erase_memory(erasure, newcomer, SUBJECTS(newcomer), {})
    erasures.complete(erasure)
    reads.write_context_logs(logged)
    costs.write(booked)
    assert reads.context_logs(newcomer) == []
    assert ledger(pool) == [("erased:unknown", "org-a", 2)]

    # A turn read once the forget completed is a returning user's, under the user's ids.
    logged, booked = turn(reads, newcomer, "I moved to Lisbon last week")
    reads.write_context_logs(logged)
    costs.write(booked)
    assert [r["query"] for r in reads.context_logs(newcomer)] == ["I moved to Lisbon last week"]
    assert ledger(pool)[-1] == ("u2", "org-a", 2)


def turn(
    reads: PostgresReadModel, key: MemoryKey, query: str
) -> tuple[list[ContextLogRow], list[ReadCost]]:
    """One turn through the read path on the real clock, with what it leaves to the
    background writers held back: (its audit row, its costs)."""
    logged: list[ContextLogRow] = []
    booked: list[ReadCost] = []

    def charges(charge: ReadCharge) -> Sequence[LedgerEntry]:
        return [
            LedgerEntry(
                read_entry_id_for(charge.log_id, "query-embedding"),
                charge.user_id,
                charge.organization_id,
                None,
                "embedding",
                "all-MiniLM-L6-v2",
                1,
                2,
                charge.at,
            )
        ]

    service = ContextService(
        reads,
        InMemoryVectorIndex(BagOfWordsEmbedder()),
        lambda: datetime.now(UTC),
        audit=BatchWriter("held-audit", logged.extend),
        charges=charges,
        ledger=BatchWriter("held-costs", booked.extend),
    )
    service.assemble(key, query)
    service.close()
    return logged, booked


def stores(pool: ConnectionPool) -> tuple[PostgresMemoryStore, PostgresReadModel, ReadLedger]:
    return PostgresMemoryStore(pool), PostgresReadModel(pool, SUBJECTS), ReadLedger(pool, SUBJECTS)


def test_a_read_written_after_a_fact_erasure_is_booked_to_the_user_still(
    pool: ConnectionPool,
) -> None:
    memory, reads, costs = stores(pool)
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(memory, "ada", [berlin, make_fact("ada", "Ada takes her coffee black")])
    injection = reads.injection(ADA)
    assert injection is not None
    read = injection.generation
    erasures = PostgresErasureLog(pool)
    erasure = open_fact_erasure(erasures, ADA, berlin.fact_id, SUBJECTS(ADA))
    # Open: the memory is the user's all the same.
    costs.write([ReadCost(cost(ADA, 1), read, BASE_TIME)])
    erasures.erase_fact(erasure, ADA, berlin.fact_id, {})  # the memory's new generation
    costs.write([ReadCost(cost(ADA, 2), read, BASE_TIME)])
    erasures.complete(erasure)
    costs.write([ReadCost(cost(ADA, 3), read, BASE_TIME)])
    assert ledger(pool) == [("ada", "org-a", 2)] * 3

    # Forgotten, and back: a cost of a turn on the memory before is not the new memory's.
    forget = open_memory_erasure(erasures, ADA, SUBJECTS(ADA))
    erasures.erase_memory(forget, ADA, SUBJECTS(ADA), {})
    erasures.complete(forget)
    seed(memory, "ada", [make_fact("ada", "Ada lives in Porto")])
    returned = reads.injection(ADA)
    assert returned is not None
    costs.write(
        [
            ReadCost(cost(ADA, 4), read, BASE_TIME),
            ReadCost(cost(ADA, 5), returned.generation, BASE_TIME),
        ]
    )
    assert ledger(pool)[3:] == [("erased:unknown", "org-a", 2), ("ada", "org-a", 2)]

    # Back, a turn reads the new memory, and one of its facts is erased before its cost
    # arrives: the forget was before the turn, so the cost is the returned user's.
    porto = make_fact("ada", "Ada lives in Porto")
    read_back = datetime.now(UTC)
    again = open_fact_erasure(erasures, ADA, porto.fact_id, SUBJECTS(ADA))
    erasures.erase_fact(again, ADA, porto.fact_id, {})
    costs.write([ReadCost(cost(ADA, 6), returned.generation, read_back)])
    assert ledger(pool)[5:] == [("ada", "org-a", 2)]


def test_a_read_written_while_an_erasure_holds_the_memory_waits_and_keeps_no_ids(
    pool: ConnectionPool,
) -> None:
    # The guard alone was read in the write's own snapshot: a write whose guard ran before the
    # erasure opened could commit after erase_memory's deletes, with the user's ids.
    memory, reads, costs = stores(pool)
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
                costs.write([ReadCost(cost(ADA, 1), read, BASE_TIME)]),
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
