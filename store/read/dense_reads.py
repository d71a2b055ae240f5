"""What the dense stage reads of a memory from Postgres: its rows (identity, version, scope)
in fact-id order, then only the rows written since, the details of the facts it does not hold,
and which pending facts are indexed by now. Every read is one statement or one pipeline on one
connection; driver errors become `StoreError` (`DatabaseUnavailable` if transient)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Vector
from store import fact_rows
from store.errors import DatabaseUnavailable, StoreError
from store.postgres import statement
from store.read.keyword_index import Terms

__all__ = ["DenseReads", "IndexedRow", "MemoryRows", "RowChanges", "VectorSource"]

_ROW = "fact_id, version, connection_id, status, context_type, indexed_at IS NOT NULL"
_MEMORY = "organization_id = %s AND user_id = %s"
_SNAPSHOT = "SELECT pg_current_snapshot()::text"
_ROWS = f"SELECT {_ROW} FROM memory_facts WHERE {_MEMORY} ORDER BY fact_id"
# The rows whose last writer the snapshot `since` did not see (committed after it was taken,
# or in flight then), with the memory's count; one row of NULLs and the count when none.
# The migration 0010 keeps `written_by`; `pg_snapshot_xmin` bounds the index scan.
_CHANGES = (
    "SELECT f.fact_id, f.version, f.connection_id, f.status, f.context_type,"
    " f.indexed_at IS NOT NULL, c.total"
    f" FROM (SELECT count(*) AS total FROM memory_facts WHERE {_MEMORY}) c"
    " LEFT JOIN memory_facts f ON f.organization_id = %s AND f.user_id = %s"
    " AND f.written_by >= pg_snapshot_xmin(%s::pg_snapshot)"
    " AND NOT pg_visible_in_snapshot(f.written_by, %s::pg_snapshot)"
    " ORDER BY f.fact_id"
)
_DETAILS = (
    f"SELECT {fact_rows.COLUMNS}, t.lexemes, t.counts FROM {fact_rows.READ_FROM} f, LATERAL (SELECT"
    " array_agg(u.lexeme) AS lexemes,"
    " array_agg(coalesce(array_length(u.positions, 1), 1)) AS counts"
    " FROM unnest(f.content_tsv) AS u) t"
    " WHERE f.organization_id = %s AND f.user_id = %s AND f.fact_id = ANY(%s)"
)


@dataclass(frozen=True)
class IndexedRow:
    """What the dense stage needs of one fact row: identity, version and scope."""

    fact_id: uuid.UUID
    version: int
    connection_id: str | None
    status: FactStatus
    context_type: str
    indexed: bool


@dataclass(frozen=True)
class MemoryRows:
    """A memory's rows in fact-id order, and a snapshot taken just before they were read: the
    next `changes` since it returns every row written after them, and perhaps a few of them
    again (harmless: a row read twice is the same row)."""

    rows: list[IndexedRow]
    snapshot: str


@dataclass(frozen=True)
class RowChanges:
    """The rows written since a snapshot, in fact-id order, and the memory's count of facts
    now; `snapshot` is what the next `changes` is since."""

    rows: list[IndexedRow]
    total: int
    snapshot: str


class VectorSource(Protocol):
    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, Vector]: ...


class DenseReads:
    """The Postgres reads of the dense stage; all use the memory's indexes or the key."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def rows(self, key: MemoryKey) -> MemoryRows:
        """The memory's facts, in fact-id order."""
        with self._transaction() as conn, conn.pipeline():
            snapshot = conn.execute(_SNAPSHOT)
            found = conn.execute(_ROWS, (key.organization_id, key.user_id))
            return MemoryRows([_row(r) for r in found.fetchall()], _snapshot(snapshot))

    def changes(self, key: MemoryKey, since: str) -> RowChanges:
        """The memory's rows written since the snapshot `since` (of `rows` or `changes`)."""
        memory = (key.organization_id, key.user_id)
        with self._transaction() as conn, conn.pipeline():
            snapshot = conn.execute(_SNAPSHOT)
            found = conn.execute(_CHANGES, (*memory, *memory, since, since))
            rows = found.fetchall()
            return RowChanges(
                [_row(r) for r in rows if r[0] is not None], int(rows[0][-1]), _snapshot(snapshot)
            )

    def details(
        self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Fact, Terms]]:
        """These facts' rows, and their lexemes and counts as the SQL BM25 reads them from
        `content_tsv`."""
        if not fact_ids:
            return {}
        with self._transaction() as conn:
            found = conn.execute(_DETAILS, (key.organization_id, key.user_id, list(fact_ids)))
            return {
                r[0]: (fact_rows.from_row(r[:-2]), Terms(tuple(r[-2] or ()), tuple(r[-1] or ())))
                for r in found
            }

    def query_lexemes(self, text: str) -> list[str]:
        """The lexemes Postgres makes of a query text (those the SQL BM25 matches on)."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT array(SELECT lexeme FROM unnest(to_tsvector('english', %s)))", (text,)
            ).fetchone()
        return list(row[0]) if row else []

    def indexed(self, versions: Mapping[uuid.UUID, int]) -> set[uuid.UUID]:
        """Which of these fact versions are in the vector index by now."""
        if not versions:
            return set()
        with self._transaction() as conn:
            found = conn.execute(
                "SELECT fact_id FROM memory_facts WHERE fact_id = ANY(%s)"
                " AND indexed_at IS NOT NULL AND version = ANY(%s)",
                (list(versions), sorted(set(versions.values()))),
            ).fetchall()
        return {r[0] for r in found}

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """Statements outside a transaction block (no BEGIN/COMMIT round trips), each with its
        own snapshot; driver errors become StoreError (DatabaseUnavailable if transient)."""
        try:
            with statement(self._pool) as conn:
                yield conn
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e)) from e
        except psycopg.Error as e:
            raise StoreError(f"dense read failed: {e}") from e


def _row(r: tuple[Any, ...]) -> IndexedRow:
    return IndexedRow(r[0], int(r[1]), r[2], FactStatus(r[3]), str(r[4]), bool(r[5]))


def _snapshot(cursor: psycopg.Cursor[Any]) -> str:
    row = cursor.fetchone()
    if row is None:
        raise StoreError("pg_current_snapshot() returned no row")
    return str(row[0])
