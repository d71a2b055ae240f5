"""Looking for what an erasure must have removed: every table's text, Chroma, row counts; an
erasure of a whole memory opened without the eraser; and one whose Chroma stops midway."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from chromadb.api import ClientAPI
from psycopg import sql

from domain.erasure import ErasureScope
from domain.ids import MemoryKey, SubjectHasher
from store.write.erasure_log import PostgresErasureLog
from store.write.locks import log_lock_key
from tests.support.chroma import DisposableChroma
from tests.support.deployment import wait_until

T = TypeVar("T")

# The digest of a memory the integration tests' stores and erasures agree on.
SUBJECTS = SubjectHasher(b"integration-subject-key")

# Every column that can hold words: text, JSON, arrays of text, and the full-text vector.
_TEXTUAL = ("text", "character varying", "json", "jsonb", "ARRAY", "tsvector")


def textual_columns(dsn: str) -> list[tuple[str, str]]:
    """(table, column) of every textual column of every table, from information_schema: a
    table added later is scanned without anyone remembering to list it here."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c"
            " JOIN information_schema.tables t USING (table_schema, table_name)"
            " WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'"
            " AND c.data_type = ANY(%s) ORDER BY 1, 2",
            (list(_TEXTUAL),),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def find_in_tables(dsn: str, needles: Sequence[str]) -> dict[str, list[str]]:
    """needle -> every "table.column" holding it (case-insensitive), across all tables."""
    found: dict[str, list[str]] = {}
    columns = textual_columns(dsn)
    assert len(columns) > 20, columns  # the scan must see the schema, not an empty database
    with psycopg.connect(dsn) as conn:
        for table, column in columns:
            query = sql.SQL("SELECT count(*) FROM {} WHERE strpos(lower({}::text), %s) > 0")
            for needle in needles:
                stmt = query.format(sql.Identifier(table), sql.Identifier(column))
                row = conn.execute(stmt, (needle.lower(),)).fetchone()
                if row and row[0]:
                    found.setdefault(needle, []).append(f"{table}.{column}")
    return found


def find_in_chroma(client: ClientAPI, needles: Sequence[str]) -> dict[str, list[str]]:
    """needle -> ids of the vectors whose document or metadata holds it, in every collection."""
    found: dict[str, list[str]] = {}
    for collection in client.list_collections():
        got = client.get_collection(collection.name).get(include=["documents", "metadatas"])
        for fact_id, document, metadata in zip(
            got["ids"], got["documents"] or [], got["metadatas"] or [], strict=True
        ):
            text = f"{document} {metadata}".lower()
            for needle in needles:
                if needle.lower() in text:
                    found.setdefault(needle, []).append(fact_id)
    return found


def memory_row_counts(dsn: str, key: MemoryKey) -> dict[str, int]:
    """Rows of the memory in every table that has organization_id and user_id columns, plus
    fact_history through its facts: what an erasure of the memory must report."""
    with psycopg.connect(dsn) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.columns c"
                " JOIN information_schema.tables t USING (table_schema, table_name)"
                " WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'"
                " AND column_name IN ('organization_id', 'user_id')"
                " GROUP BY table_name HAVING count(*) = 2 ORDER BY 1"
            ).fetchall()
        ]
        counts: dict[str, int] = {}
        for table in tables:
            stmt = sql.SQL("SELECT count(*) FROM {} WHERE organization_id = %s AND user_id = %s")
            row = conn.execute(
                stmt.format(sql.Identifier(table)), (key.organization_id, key.user_id)
            ).fetchone()
            counts[table] = int(row[0]) if row else 0
        row = conn.execute(
            "SELECT count(*) FROM fact_history h JOIN memory_facts f USING (fact_id)"
            " WHERE f.organization_id = %s AND f.user_id = %s",
            (key.organization_id, key.user_id),
        ).fetchone()
        counts["fact_history"] = int(row[0]) if row else 0
    return counts


def rows(dsn: str, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, params).fetchall()


def open_memory_erasure(log: PostgresErasureLog, key: MemoryKey, subject: str) -> uuid.UUID:
    """Audit an erasure of the whole memory (its first step) and return its id."""
    return _open_erasure(log, key, subject, None)


def open_fact_erasure(
    log: PostgresErasureLog, key: MemoryKey, fact_id: uuid.UUID, subject: str = "subject-of-ada"
) -> uuid.UUID:
    """Audit an erasure of one fact (its first step) and return its id."""
    return _open_erasure(log, key, subject, fact_id)


def _open_erasure(
    log: PostgresErasureLog, key: MemoryKey, subject: str, fact_id: uuid.UUID | None
) -> uuid.UUID:
    erasure_id = uuid.uuid4()
    log.start(
        erasure_id,
        subject=subject,
        scope=ErasureScope.MEMORY if fact_id is None else ErasureScope.FACT,
        key=key,
        fact_id=fact_id,
        actor="test",
        reason="the user asked",
    )
    return erasure_id


def waiting_on_a_lock(dsn: str) -> bool:
    """Whether a session of dsn's database waits for an advisory lock."""
    found = rows(
        dsn,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return found != [(0,)]


def erased_as_chroma_stops(
    erase: Callable[[], T], dsn: str, key: MemoryKey, chroma: DisposableChroma
) -> T:
    """What `erase`, an erasure of key's memory, returns or raises when its Chroma server stops
    after the vectors were counted and before they are deleted. Chroma stays stopped.

    The erasure is held inside Postgres: its erase transaction needs the memory's log lock,
    which this holds (as a log writer's insert in flight would) until Chroma is stopped.
    """
    with psycopg.connect(dsn, autocommit=True) as blocker, ThreadPoolExecutor(1) as pool:
        blocker.execute("SELECT pg_advisory_lock(%s)", (log_lock_key(key),))
        erasing = pool.submit(erase)
        try:
            wait_until(lambda: erasing.done() or waiting_on_a_lock(dsn), 60, "the erasure to wait")
            assert not erasing.done(), "the erasure ended before its Postgres step"
            chroma.stop()
        finally:
            blocker.execute("SELECT pg_advisory_unlock(%s)", (log_lock_key(key),))
        return erasing.result(timeout=60)
