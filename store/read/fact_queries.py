"""The read side of memory in Postgres: what a chat turn, the API and the audit need.

Kept apart from `memory_store` (the consolidation's write side). Every fact query carries the
same scope: the memory (organization and user), its active connections or none, and the
wanted statuses, so a fact can only come back to the tenant that owns it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from domain.codec import fact_from_json
from domain.ids import MemoryKey, SubjectHasher
from domain.model import Fact, FactStatus
from domain.reads import ContextLogRow, FactCounters, Injection, MemoryStamp, Scope
from store import fact_rows
from store.postgres import memory_params, statement, streamed, transaction
from store.write.locks import log_lock_key

_SCOPE = (
    " organization_id = %(org)s AND user_id = %(user_id)s"
    " AND (connection_id IS NULL OR connection_id = ANY(%(connections)s))"
    " AND status = ANY(%(statuses)s)"
    " AND (cardinality(%(context_types)s::text[]) = 0 OR context_type = ANY(%(context_types)s))"
)
_MEMORY = "organization_id = %s AND user_id = %s"


def still_the_memory_read(generation: str, org: str, user: str, subject: str, read_at: str) -> str:
    """SQL true while the memory is the one a turn read: no erasure of the whole memory open,
    and its generation; for a turn on a memory that did not exist (no generation to change),
    no erasure of it (found by its `subject` digest) completed since the turn's `read_at`.
    What a turn leaves behind in the background (its audit row, its costs) is written under
    this guard: from the moment an erasure opens, nothing of the memory's is written with its
    ids, also once the erasure completed (its `erasure_pending` row gone). `read_at` is the
    read path's clock, `erased_at` Postgres's."""
    return (
        f"NOT EXISTS (SELECT 1 FROM erasure_pending p WHERE p.organization_id = {org}"
        f" AND p.user_id = {user} AND p.fact_id IS NULL) AND CASE WHEN {generation} IS NULL"
        f" THEN NOT EXISTS (SELECT 1 FROM erasure_audit a WHERE a.subject = {subject}"
        f" AND a.scope = 'memory' AND a.erased_at >= {read_at})"
        f" ELSE EXISTS (SELECT 1 FROM user_memory m WHERE m.organization_id = {org}"
        f" AND m.user_id = {user} AND m.generation = {generation}) END"
    )


def hold_off_erasures(cur: psycopg.Cursor[Any], keys: Sequence[MemoryKey]) -> None:
    """Take the memories' log locks shared, for the transaction: an erasure (which takes its
    memory's exclusively) starts after the writes under the guard below commit, and deletes
    them; or it ran first, and the guard, read after the lock, sees it. Without the lock a
    write whose guard was read before the erasure opened could commit after its deletes."""
    locks = sorted({log_lock_key(k) for k in keys})
    cur.execute("SELECT pg_advisory_xact_lock_shared(k) FROM unnest(%s::bigint[]) AS k", (locks,))


_LOGGED_WHILE_READ = still_the_memory_read(
    "%(generation)s::uuid", "%(org)s", "%(user_id)s", "%(subject)s", "%(read_at)s::timestamptz"
)
_INSERT_CONTEXT_LOG = (
    "INSERT INTO context_logs (log_id, user_id, organization_id, query, rewritten_query,"
    " memory_version, budget, connection_ids, injected, retrieved, latency_ms, degraded,"
    " degraded_reason, created_at)"
    " SELECT %(log_id)s, %(user_id)s, %(org)s, %(query)s, %(rewritten_query)s,"
    " %(memory_version)s, %(budget)s, %(connection_ids)s, %(injected)s, %(retrieved)s,"
    " %(latency_ms)s, %(degraded)s, %(degraded_reason)s, %(created_at)s"
    f" WHERE {_LOGGED_WHILE_READ} ON CONFLICT (log_id) DO NOTHING RETURNING log_id"
)

# OR of the query's lexemes: plainto_tsquery ANDs them, which a chat turn rarely satisfies.
# The cast (not to_tsquery) keeps the already-stemmed lexemes as they are.
_OR_QUERY = "replace(plainto_tsquery('english', %(text)s)::text, '&', '|')::tsquery"

# Okapi BM25 over the stored full-text vectors, with the document frequencies and the mean
# length of the facts in scope (one memory), not of the whole table: a word common in one
# user's memory says little there however rare it is elsewhere. The matching facts come from
# the GIN index; the count and mean length read the scope's rows (the user's index).
BM25_K1 = 1.2
BM25_B = 0.75
_BM25_SEARCH = (
    f"WITH q AS (SELECT {_OR_QUERY} AS q),"
    " terms AS (SELECT lexeme FROM unnest(to_tsvector('english', %(text)s))),"
    f" scoped AS (SELECT fact_id, content_tsv FROM memory_facts WHERE {_SCOPE}),"
    " stats AS (SELECT count(*) AS n, greatest(avg(length(content_tsv)), 1) AS avgdl"
    " FROM scoped),"
    " hits AS (SELECT s.fact_id, u.lexeme, coalesce(array_length(u.positions, 1), 1) AS tf,"
    " length(s.content_tsv) AS dl FROM scoped s CROSS JOIN q, unnest(s.content_tsv) AS u"
    " WHERE s.content_tsv @@ q.q AND u.lexeme IN (SELECT lexeme FROM terms)),"
    " df AS (SELECT lexeme, count(*) AS df FROM hits GROUP BY lexeme),"
    " scores AS (SELECT h.fact_id, sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5))"
    " * h.tf * (%(k1)s + 1) / (h.tf + %(k1)s * (1 - %(b)s + %(b)s * h.dl / st.avgdl)))"
    " AS score FROM hits h JOIN df USING (lexeme) CROSS JOIN stats st GROUP BY h.fact_id)"
    f" SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} JOIN scores USING (fact_id)"
    " ORDER BY scores.score DESC, fact_id LIMIT %(limit)s"
)

# W, S, learned info, every connection's learned info and the pinned facts in one statement.
_INJECTION = (
    "SELECT m.organization_id, m.working_memory, m.information_scaffold,"
    " m.persistent_learned_info, m.version, m.updated_at, m.generation,"
    " coalesce((SELECT jsonb_object_agg(c.connection_id, c.persistent_learned_info)"
    "   FROM connections c WHERE c.organization_id = m.organization_id"
    "   AND c.user_id = m.user_id), '{}'::jsonb),"
    " coalesce((SELECT jsonb_agg(to_jsonb(f) - 'content_tsv' ORDER BY f.created_at, f.fact_id)"
    f"   FROM {fact_rows.READ_FROM} f WHERE f.organization_id = m.organization_id"
    "   AND f.user_id = m.user_id AND f.pinned AND f.status = 'active'), '[]'::jsonb)"
    " FROM user_memory m WHERE m.organization_id = %s AND m.user_id = %s"
)


def _params(scope: Scope) -> dict[str, Any]:
    return {
        "org": scope.key.organization_id,
        "user_id": scope.key.user_id,
        "connections": list(scope.connection_ids),
        "statuses": [s.value for s in scope.statuses],
        "context_types": list(scope.context_types),
    }


class PostgresReadModel:
    def __init__(self, pool: ConnectionPool, subjects: SubjectHasher) -> None:
        self._pool = pool
        # The audit rows' guard finds the memory's completed erasures by their digest.
        self._subjects = subjects

    def _transaction(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return transaction(self._pool, "read model query")

    def _statement(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """For the hot path's single-statement reads: one round trip, no BEGIN/COMMIT."""
        return statement(self._pool, "read model query")

    # -- injection ------------------------------------------------------------------------

    def memory_stamp(self, key: MemoryKey) -> MemoryStamp | None:
        """The memory's generation and version (a primary-key lookup), None for an unknown one."""
        with self._statement() as conn:
            row = conn.execute(
                f"SELECT generation, version FROM user_memory WHERE {_MEMORY}", memory_params(key)
            ).fetchone()
        return None if row is None else MemoryStamp(row[0], int(row[1]))

    def memory_stamps(self, keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        """The stamps of these memories in one statement; a memory that is gone is absent."""
        with self._statement() as conn:
            rows = conn.execute(
                "SELECT m.organization_id, m.user_id, m.generation, m.version"
                " FROM user_memory m JOIN unnest(%s::text[], %s::text[]) AS k(org, usr)"
                " ON m.organization_id = k.org AND m.user_id = k.usr",
                ([k.organization_id for k in keys], [k.user_id for k in keys]),
            ).fetchall()
        return {MemoryKey(r[0], r[1]): MemoryStamp(r[2], int(r[3])) for r in rows}

    def injection(self, key: MemoryKey) -> Injection | None:
        with self._statement() as conn:
            row = conn.execute(_INJECTION, memory_params(key)).fetchone()
        if row is None:
            return None
        *state, generation, connections, pinned = row
        return Injection(
            state=fact_rows.state_from_row(key.user_id, state),
            connections={k: tuple(v) for k, v in connections.items()},
            pinned=tuple(fact_from_json(f) for f in pinned),
            generation=generation,
        )

    # -- retrieval ------------------------------------------------------------------------

    def keyword_search(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        """Facts in scope matching any lexeme of text, best Okapi BM25 score first."""
        (found,) = self.keyword_searches([(scope, text)], limit)
        return found

    def keyword_searches(
        self, searches: Sequence[tuple[Scope, str]], limit: int
    ) -> list[list[Fact]]:
        """Each search's facts, the queries sent together in one pipeline (one round trip
        for a consolidation batch's observations instead of a transaction each; no COMMIT
        round trip either, as each is a single statement)."""
        wanted = [(s, t) for s, t in searches if limit > 0 and s.statuses]
        if not wanted:
            return [[] for _ in searches]
        bm25 = {"limit": limit, "k1": BM25_K1, "b": BM25_B}
        with self._statement() as conn:
            with conn.pipeline():
                cursors = [
                    conn.execute(_BM25_SEARCH, {**_params(s), "text": t, **bm25}) for s, t in wanted
                ]
            found = iter([[fact_rows.from_row(r) for r in c.fetchall()] for c in cursors])
        return [next(found) if limit > 0 and s.statuses else [] for s, _ in searches]

    def indexed_ids(self, scope: Scope, limit: int) -> list[uuid.UUID]:
        """Ids of facts in scope whose current version is in the vector index, at most limit."""
        return [r[0] for r in self._indexed("fact_id", scope, limit)]

    def indexed_texts(self, scope: Scope, limit: int) -> dict[uuid.UUID, str]:
        """`indexed_ids` with each fact's current text (what its stored vector embeds)."""
        return {r[0]: r[1] for r in self._indexed("fact_id, content", scope, limit)}

    def _indexed(self, columns: str, scope: Scope, limit: int) -> list[tuple[Any, ...]]:
        if limit <= 0 or not scope.statuses:
            return []
        sql = (
            f"SELECT {columns} FROM memory_facts"
            f" WHERE indexed_at IS NOT NULL AND {_SCOPE} LIMIT %(limit)s"
        )
        with self._statement() as conn:
            return conn.execute(sql, {**_params(scope), "limit": limit}).fetchall()

    def facts_in_scope(self, scope: Scope, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        """The current rows of these facts that are still in scope (Chroma may lag)."""
        if not fact_ids or not scope.statuses:
            return []
        sql = (
            f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM}"
            f" WHERE fact_id = ANY(%(ids)s) AND {_SCOPE}"
        )
        with self._statement() as conn:
            rows = conn.execute(sql, {**_params(scope), "ids": list(fact_ids)}).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def fact_counters(
        self, scope: Scope, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, FactCounters]:
        """Four narrow columns instead of whole rows: a turn's check of what it picked costs
        no row decoding (bench.api)."""
        if not fact_ids or not scope.statuses:
            return {}
        sql = (
            f"SELECT fact_id, version, recall_count, last_recalled_at FROM {fact_rows.READ_FROM}"
            f" WHERE fact_id = ANY(%(ids)s) AND {_SCOPE}"
        )
        with self._statement() as conn:
            rows = conn.execute(sql, {**_params(scope), "ids": list(fact_ids)}).fetchall()
        return {r[0]: FactCounters(r[1], r[2], r[3]) for r in rows}

    # -- inspection -----------------------------------------------------------------------

    def known(self, key: MemoryKey) -> bool:
        """Whether memoryd has anything of this memory: a memory row, or logged events."""
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM user_memory WHERE {_MEMORY})"
                f" OR EXISTS (SELECT 1 FROM context_events WHERE {_MEMORY})",
                (*memory_params(key), *memory_params(key)),
            ).fetchone()
        return bool(row and row[0])

    def user_facts(
        self,
        key: MemoryKey,
        statuses: Sequence[FactStatus] = tuple(FactStatus),
        *,
        after: tuple[datetime, uuid.UUID] | None = None,
        limit: int | None = None,
    ) -> list[Fact]:
        """The memory's facts by creation time, then fact id: the first `limit` of them past
        the (created_at, fact_id) `after`, a page that pages on however the memory changes
        (a fact's place never moves)."""
        past = "" if after is None else " AND (created_at, fact_id) > (%s, %s)"
        with self._transaction() as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} WHERE {_MEMORY}"
                f" AND status = ANY(%s){past} ORDER BY created_at, fact_id LIMIT %s",
                (*memory_params(key), [s.value for s in statuses], *(after or ()), limit),
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def user_fact(self, key: MemoryKey, fact_id: uuid.UUID) -> Fact | None:
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM}"
                f" WHERE fact_id = %s AND {_MEMORY}",
                (fact_id, *memory_params(key)),
            ).fetchone()
        return None if row is None else fact_rows.from_row(row)

    def context_logs(self, key: MemoryKey, limit: int | None = 100) -> list[dict[str, Any]]:
        """The memory's read audit rows, newest first; `limit` None: all of them."""
        with (
            self._transaction() as conn,
            conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
        ):
            cur.execute(
                f"SELECT * FROM context_logs WHERE {_MEMORY} ORDER BY created_at DESC LIMIT %s",
                (*memory_params(key), limit),
            )
            return list(cur.fetchall())

    def iter_context_logs(self, key: MemoryKey) -> Iterator[dict[str, Any]]:
        """The memory's read audit rows, oldest first, read as they are used (an export)."""
        return streamed(
            self._pool,
            f"SELECT * FROM context_logs WHERE {_MEMORY} ORDER BY created_at, log_id",
            memory_params(key),
            "read model query",
            row_factory=psycopg.rows.dict_row,
        )

    # -- off the hot path -----------------------------------------------------------------

    def write_context_logs(self, rows: Sequence[ContextLogRow]) -> None:
        """Idempotent on log_id, so a retried batch (or turn) writes each row once, and
        counts the recalls of the rows it wrote, in the same transaction.

        Written in the background, a row can arrive after its memory was erased: it is only
        inserted while the memory is still the one the turn read (`still_the_memory_read`).
        """
        first = {r.log_id: r for r in reversed(rows)}
        if not first:
            return
        # In log id order: two batches retrying the same turns cannot deadlock on them.
        ordered = [first[i] for i in sorted(first)]
        with self._transaction() as conn, conn.cursor() as cur:
            hold_off_erasures(cur, [MemoryKey(r.organization_id, r.user_id) for r in ordered])
            params = [
                _log_params(r)
                | {"subject": self._subjects(MemoryKey(r.organization_id, r.user_id))}
                for r in ordered
            ]
            cur.executemany(_INSERT_CONTEXT_LOG, params, returning=True)
            written: set[uuid.UUID] = set()
            while True:
                written.update(row[0] for row in cur.fetchall())
                if not cur.nextset():
                    break
            _count_recalls(cur, [r for r in ordered if r.log_id in written])


def _log_params(r: ContextLogRow) -> dict[str, Any]:
    return {
        "log_id": r.log_id,
        "user_id": r.user_id,
        "org": r.organization_id,
        "query": r.query,
        "rewritten_query": r.rewritten_query,
        "memory_version": r.memory_version,
        "budget": r.budget,
        "connection_ids": list(r.connection_ids),
        "injected": Jsonb(dict(r.injected)),
        "retrieved": Jsonb([dict(x) for x in r.retrieved]),
        "latency_ms": r.latency_ms,
        "degraded": r.degraded,
        "degraded_reason": r.degraded_reason,
        "created_at": r.created_at,
        "generation": r.generation,
        "read_at": r.read_at,
    }


def _count_recalls(cur: psycopg.Cursor[Any], rows: Sequence[ContextLogRow]) -> None:
    """Add each fact's recalls in one statement; a fact gone since is skipped.

    Counted in `fact_recalls`, not in the fact's own wide row (migration 0009). A fact
    erased between the check and the insert fails the transaction on its foreign key, audit
    rows included; the writer retries the batch, and then the check skips the fact.
    """
    counts: dict[uuid.UUID, tuple[int, datetime]] = {}
    for r in rows:
        for fact_id in r.recalled:
            n, at = counts.get(fact_id, (0, r.created_at))
            counts[fact_id] = (n + 1, max(at, r.created_at))
    if not counts:
        return
    # Sorted ids: concurrent batches lock rows in one order and cannot deadlock each other.
    ids = sorted(counts)
    cur.execute(
        "INSERT INTO fact_recalls AS c (fact_id, recall_count, last_recalled_at)"
        " SELECT r.fact_id, r.n, r.at"
        " FROM unnest(%s::uuid[], %s::int[], %s::timestamptz[]) AS r(fact_id, n, at)"
        " WHERE EXISTS (SELECT 1 FROM memory_facts f WHERE f.fact_id = r.fact_id)"
        " ORDER BY r.fact_id ON CONFLICT (fact_id) DO UPDATE SET"
        " recall_count = c.recall_count + EXCLUDED.recall_count,"
        " last_recalled_at = greatest(c.last_recalled_at, EXCLUDED.last_recalled_at)",
        (ids, [counts[i][0] for i in ids], [counts[i][1] for i in ids]),
    )
