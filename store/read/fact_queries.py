"""The read side of memory in Postgres: what a chat turn, the API and the audit need.

Kept apart from `memory_store` (the consolidation's write side). Every fact query carries the
same scope: the user, their active connections or none, the wanted statuses and, when the
caller names it, the organization, so a fact can only come back to the tenant that owns it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from domain.codec import fact_from_json
from domain.model import Fact, FactStatus
from domain.reads import ContextLogRow, Injection, Recall, Scope
from store import fact_rows
from store.postgres import transaction

_SCOPE = (
    " user_id = %(user_id)s"
    " AND (connection_id IS NULL OR connection_id = ANY(%(connections)s))"
    " AND status = ANY(%(statuses)s)"
    " AND (cardinality(%(context_types)s::text[]) = 0 OR context_type = ANY(%(context_types)s))"
    " AND (%(org)s::text IS NULL OR organization_id = %(org)s)"
)

# OR of the query's lexemes: plainto_tsquery ANDs them, which a chat turn rarely satisfies.
# The cast (not to_tsquery) keeps the already-stemmed lexemes as they are.
_OR_QUERY = "replace(plainto_tsquery('english', %(text)s)::text, '&', '|')::tsquery"

# W, S, learned info, every connection's learned info and the pinned facts in one statement.
_INJECTION = (
    "SELECT m.organization_id, m.working_memory, m.information_scaffold,"
    " m.persistent_learned_info, m.version, m.updated_at,"
    " coalesce((SELECT jsonb_object_agg(c.connection_id, c.persistent_learned_info)"
    "   FROM connections c WHERE c.user_id = m.user_id), '{}'::jsonb),"
    " coalesce((SELECT jsonb_agg(to_jsonb(f) - 'content_tsv' ORDER BY f.created_at, f.fact_id)"
    "   FROM memory_facts f WHERE f.user_id = m.user_id AND f.pinned AND f.status = 'active'),"
    "   '[]'::jsonb)"
    " FROM user_memory m WHERE m.user_id = %s"
)


def _params(scope: Scope) -> dict[str, Any]:
    return {
        "user_id": scope.user_id,
        "connections": list(scope.connection_ids),
        "statuses": [s.value for s in scope.statuses],
        "context_types": list(scope.context_types),
        "org": scope.organization_id,
    }


class PostgresReadModel:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def _transaction(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return transaction(self._pool, "read model query")

    # -- injection ------------------------------------------------------------------------

    def memory_version(self, user_id: str) -> int | None:
        """The user's memory version (a primary-key lookup), None for an unknown user."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT version FROM user_memory WHERE user_id = %s", (user_id,)
            ).fetchone()
        return None if row is None else int(row[0])

    def injection(self, user_id: str) -> Injection | None:
        with self._transaction() as conn:
            row = conn.execute(_INJECTION, (user_id,)).fetchone()
        if row is None:
            return None
        *state, connections, pinned = row
        return Injection(
            state=fact_rows.state_from_row(user_id, state),
            connections={k: tuple(v) for k, v in connections.items()},
            pinned=tuple(fact_from_json(f) for f in pinned),
        )

    # -- retrieval ------------------------------------------------------------------------

    def keyword_search(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        """Facts in scope matching any lexeme of text, best ts_rank_cd first."""
        if limit <= 0 or not scope.statuses:
            return []
        sql = (
            f"WITH q AS (SELECT {_OR_QUERY} AS q)"
            f" SELECT {fact_rows.COLUMNS} FROM memory_facts, q"
            f" WHERE content_tsv @@ q.q AND {_SCOPE}"
            " ORDER BY ts_rank_cd(content_tsv, q.q) DESC, fact_id LIMIT %(limit)s"
        )
        with self._transaction() as conn:
            rows = conn.execute(sql, {**_params(scope), "text": text, "limit": limit}).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def indexed_ids(self, scope: Scope, limit: int) -> list[uuid.UUID]:
        """Ids of facts in scope whose current version is in the vector index, at most limit."""
        if limit <= 0 or not scope.statuses:
            return []
        sql = (
            "SELECT fact_id FROM memory_facts"
            f" WHERE indexed_at IS NOT NULL AND {_SCOPE} LIMIT %(limit)s"
        )
        with self._transaction() as conn:
            rows = conn.execute(sql, {**_params(scope), "limit": limit}).fetchall()
        return [r[0] for r in rows]

    def facts_in_scope(self, scope: Scope, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        """The current rows of these facts that are still in scope (Chroma may lag)."""
        if not fact_ids or not scope.statuses:
            return []
        sql = (
            f"SELECT {fact_rows.COLUMNS} FROM memory_facts"
            f" WHERE fact_id = ANY(%(ids)s) AND {_SCOPE}"
        )
        with self._transaction() as conn:
            rows = conn.execute(sql, {**_params(scope), "ids": list(fact_ids)}).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    # -- inspection -----------------------------------------------------------------------

    def owner_organization(self, user_id: str) -> str | None:
        """The organization a user belongs to, from their memory or else their first event."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT organization_id FROM user_memory WHERE user_id = %s"
                " UNION ALL (SELECT organization_id FROM context_events WHERE user_id = %s"
                " ORDER BY seq LIMIT 1) LIMIT 1",
                (user_id, user_id),
            ).fetchone()
        return None if row is None else str(row[0])

    def user_facts(
        self, user_id: str, statuses: Sequence[FactStatus] = tuple(FactStatus)
    ) -> list[Fact]:
        with self._transaction() as conn:
            rows = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM memory_facts WHERE user_id = %s"
                " AND status = ANY(%s) ORDER BY created_at, fact_id",
                (user_id, [s.value for s in statuses]),
            ).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    def user_fact(self, user_id: str, fact_id: uuid.UUID) -> Fact | None:
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {fact_rows.COLUMNS} FROM memory_facts WHERE fact_id = %s AND user_id = %s",
                (fact_id, user_id),
            ).fetchone()
        return None if row is None else fact_rows.from_row(row)

    def context_logs(self, user_id: str, limit: int = 100) -> list[dict[str, Any]]:
        with (
            self._transaction() as conn,
            conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
        ):
            cur.execute(
                "SELECT * FROM context_logs WHERE user_id = %s ORDER BY created_at DESC LIMIT %s",
                (user_id, limit),
            )
            return list(cur.fetchall())

    # -- off the hot path -----------------------------------------------------------------

    def record_recalls(self, recalls: Sequence[Recall]) -> None:
        """Add each fact's recalls in one statement; a fact gone since is skipped."""
        counts: dict[uuid.UUID, tuple[int, datetime]] = {}
        for r in recalls:
            n, at = counts.get(r.fact_id, (0, r.at))
            counts[r.fact_id] = (n + 1, max(at, r.at))
        if not counts:
            return
        # Sorted ids: concurrent batches lock rows in one order and cannot deadlock each other.
        ids = sorted(counts)
        with self._transaction() as conn:
            conn.execute(
                "UPDATE memory_facts AS f SET recall_count = f.recall_count + r.n,"
                " last_recalled_at = greatest(f.last_recalled_at, r.at)"
                " FROM unnest(%s::uuid[], %s::int[], %s::timestamptz[]) AS r(fact_id, n, at)"
                " WHERE f.fact_id = r.fact_id",
                (ids, [counts[i][0] for i in ids], [counts[i][1] for i in ids]),
            )

    def write_context_logs(self, rows: Sequence[ContextLogRow]) -> None:
        """Idempotent on log_id, so a retried batch writes each row once."""
        if not rows:
            return
        with self._transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO context_logs (log_id, user_id, organization_id, query,"
                " rewritten_query, memory_version, budget, connection_ids, injected, retrieved,"
                " latency_ms, degraded, degraded_reason, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (log_id) DO NOTHING",
                [
                    (
                        r.log_id,
                        r.user_id,
                        r.organization_id,
                        r.query,
                        r.rewritten_query,
                        r.memory_version,
                        r.budget,
                        list(r.connection_ids),
                        Jsonb(dict(r.injected)),
                        Jsonb([dict(x) for x in r.retrieved]),
                        r.latency_ms,
                        r.degraded,
                        r.degraded_reason,
                        r.created_at,
                    )
                    for r in rows
                ],
            )
