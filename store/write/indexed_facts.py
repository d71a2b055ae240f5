"""The facts Postgres has marked indexed, for checking the vector index against them.

`memoryd index-verify` walks them in id order and repairs the ones the index lost or holds
otherwise (`consumers.index_check`). A repair writes the index while the rows are locked, so
no run can write a new version of them meanwhile and the index cannot end up holding an
older version than Postgres says it holds (a row being written is skipped and left to the
indexer or the next check); it books nothing (an operator's repair after an
incident is not a user's cost, and each version was booked when it was first indexed).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from psycopg_pool import ConnectionPool

from domain.model import Fact
from store import fact_rows
from store.postgres import statement, transaction


class PostgresIndexedFacts:
    """`domain.ports.IndexedFacts` over `memory_facts`."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def indexed_after(self, after: uuid.UUID | None, limit: int) -> list[Fact]:
        # Keyset order on the primary key: each page is an index range, however far the walk.
        with statement(self._pool, "reading indexed facts") as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} f"
                " WHERE f.indexed_at IS NOT NULL AND (%(after)s::uuid IS NULL"
                " OR f.fact_id > %(after)s) ORDER BY f.fact_id LIMIT %(limit)s",
                {"after": after, "limit": limit},
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        if not fact_ids:
            return []
        with transaction(self._pool, "repairing indexed facts") as conn:
            # A version written since is pending, not selected. A row another transaction
            # holds locked is skipped, not waited for: it is being written (a flush's new
            # version is pending once committed, the indexer's to write; an erased one goes).
            # Waiting while holding the rows already locked could deadlock with a flush that
            # locks the same facts in its own order; if that write rolls back, the next
            # check finds the fact again.
            locked = conn.execute(
                "SELECT fact_id FROM memory_facts WHERE fact_id = ANY(%s)"
                " AND indexed_at IS NOT NULL ORDER BY fact_id FOR UPDATE SKIP LOCKED",
                (list(fact_ids),),
            ).fetchall()
            ids = [r[0] for r in locked]
            if not ids:
                return []
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} f"
                " WHERE f.fact_id = ANY(%s) ORDER BY f.fact_id",
                (ids,),
            ).fetchall()
            facts = [fact_rows.from_row(r) for r in rows]
            write(facts)
            # Written again, unchanged: the trigger stamps the rows with this transaction,
            # so a cached entry's next version reads them and fetches their vectors again.
            conn.execute(
                "UPDATE memory_facts SET indexed_at = indexed_at WHERE fact_id = ANY(%s)",
                (ids,),
            )
        return facts

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        if not fact_ids:
            return []
        with statement(self._pool, "reading fact ids") as conn:
            return fact_rows.missing(conn, fact_ids)
