"""The index outbox's writes: marking fact versions indexed, and catching up on overtaken ones.

An indexer writes the versions it read to the vector index, then marks them. Chroma keeps
whichever upsert came last, so an indexer that read a version before a newer one was written
can write its older text over the newer one another indexer already wrote (and may yet
mark). Its mark then matches nothing; `rewrite_overtaken` writes such facts' current rows
again while no one can write or mark them, so the index ends up holding what Postgres says.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from psycopg_pool import ConnectionPool

from domain.model import Fact
from domain.ports import Pricing
from domain.upsert import written_as
from store import fact_rows
from store.postgres import transaction
from store.write.run_rows import insert_ledger


def mark_indexed(
    pool: ConnectionPool, facts: Sequence[Fact], at: datetime, ledger_for: Pricing
) -> list[Fact]:
    # The content too: an erasure redacts the facts quoting the erased one in place, keeping
    # their version and time (the fold of the runs gives both), and the text an indexer read
    # before that must not be vouched for.
    # In id order, as a run's upsert locks them (`fact_rows.write_changes`): two
    # transactions over the same rows in different orders can deadlock, and an aborted
    # run pays for its model call again.
    params = [(at, f.fact_id, f.version, f.updated_at, f.content) for f in sorted(facts, key=_id)]
    if not params:
        return []
    with transaction(pool) as conn, conn.cursor() as cur:
        cur.executemany(
            "UPDATE memory_facts SET indexed_at = %s WHERE fact_id = %s AND version = %s"
            " AND updated_at = %s AND content = %s AND indexed_at IS NULL RETURNING fact_id",
            params,
            returning=True,
        )
        marked_ids = fact_rows.returned_ids(cur)
        marked = [f for f in facts if f.fact_id in marked_ids]
        insert_ledger(conn, ledger_for(marked))
    return marked


def rewrite_overtaken(
    pool: ConnectionPool, written: Sequence[Fact], write: Callable[[Sequence[Fact]], object]
) -> list[Fact]:
    if not written:
        return []
    ids = sorted({f.fact_id for f in written})
    with transaction(pool, "rewriting overtaken facts") as conn:
        # Waited for, not skipped: a row held by another indexer's mark is the very race
        # being caught up on. In id order, as every writer of many fact rows takes them.
        fact_rows.lock_in_id_order(conn, ids)
        rows = conn.execute(
            f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} f"
            " WHERE f.fact_id = ANY(%s) ORDER BY f.fact_id",
            (ids,),
        ).fetchall()
        ours = {f.fact_id: written_as(f) for f in written}
        overtaken = [
            f
            for f in map(fact_rows.from_row, rows)
            if f.indexed_at is None or written_as(f) != ours[f.fact_id]
        ]
        if not overtaken:
            return []
        write(overtaken)
        # Written again, unchanged: the trigger stamps the rows with this transaction, so a
        # memory's cached entries read them (and their vectors) again at its next version.
        conn.execute(
            "UPDATE memory_facts SET indexed_at = indexed_at WHERE fact_id = ANY(%s)",
            ([f.fact_id for f in overtaken],),
        )
    return overtaken


def _id(fact: Fact) -> uuid.UUID:
    return fact.fact_id
