"""`FactSearch`: the facts a consolidation batch is about, found the way the read path finds them.

`HybridFactSearch` is the live one: per observation, the dense search of the read path (an
exact scoring of the user's vectors while they are few, Chroma's filtered ANN query beyond)
and its Postgres keyword search, fused by reciprocal rank. Unlike a chat turn it does not
weigh recency or salience: a correction is about the fact it corrects, however old or dull.
Postgres decides what is current and in scope, as on the read path. With Chroma down the
rankings are keyword-only and say so, and consolidation goes on.

`InMemoryFactSearch` does the same over facts held in memory (a shadow replay's image).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import numpy as np
import psycopg
from psycopg_pool import ConnectionPool

from store import fact_rows
from store.context_service import EXACT_SEARCH_MAX_FACTS
from store.errors import DatabaseUnavailable, StoreError, VectorIndexUnavailable
from store.fact_queries import PostgresReadModel, Scope
from store.postgres import transaction
from store.protocols import Embedder, FactQuery, RelatedFacts, Vector
from store.ranking import reciprocal_rank_fusion
from store.records import Fact, FactStatus
from store.vector_index import VectorHit

# What a consolidation works with: a held fact observed again is what earns it its place.
CONSOLIDATION_STATUSES = (FactStatus.ACTIVE, FactStatus.HELD)


class DenseIndex(Protocol):
    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]: ...

    def query(
        self,
        *,
        user_id: str,
        text: str,
        connection_ids: Sequence[str],
        n: int,
        statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,),
        context_types: Sequence[str] = (),
    ) -> list[VectorHit]: ...


def _scope(user_id: str, organization_id: str, connection_id: str | None) -> Scope:
    return Scope(
        user_id=user_id,
        connection_ids=(connection_id,) if connection_id else (),
        statuses=CONSOLIDATION_STATUSES,
        organization_id=organization_id,
    )


def _fuse(dense: Sequence[uuid.UUID], keyword: Sequence[uuid.UUID], limit: int) -> list[uuid.UUID]:
    fused = reciprocal_rank_fusion([dense, keyword])
    return sorted(fused, key=lambda i: (-fused[i], str(i)))[:limit]


def _nearest(
    keys: Sequence[uuid.UUID], matrix: np.ndarray[Any, Any], query: Vector, limit: int
) -> list[uuid.UUID]:
    """The `limit` keys whose rows are most similar to `query`; ties in key order."""
    best = np.argsort(-(matrix @ query), kind="stable")[:limit]
    return [keys[k] for k in best]


class HybridFactSearch:
    def __init__(
        self,
        pool: ConnectionPool,
        reads: PostgresReadModel,
        index: DenseIndex,
        embedder: Embedder,
    ) -> None:
        self._pool = pool
        self._reads = reads
        self._index = index
        self._embedder = embedder

    def related(
        self, user_id: str, organization_id: str, queries: Sequence[FactQuery], limit: int
    ) -> RelatedFacts:
        if not queries or limit <= 0:
            return RelatedFacts(tuple(() for _ in queries))
        scopes = {
            q.connection_id: _scope(user_id, organization_id, q.connection_id) for q in queries
        }
        degraded = None
        try:
            dense = self._dense(user_id, scopes, queries, limit)
        except VectorIndexUnavailable as e:
            dense, degraded = [[] for _ in queries], f"vector index unavailable: {e}"
        keyword = [
            self._reads.keyword_search(scopes[q.connection_id], q.text, limit) for q in queries
        ]
        truth = self._current(scopes, queries, dense, keyword)
        ranked = []
        for query, dense_ids, keyword_facts in zip(queries, dense, keyword, strict=True):
            rows = truth[query.connection_id]
            order = _fuse(
                [i for i in dense_ids if i in rows], [f.fact_id for f in keyword_facts], limit
            )
            ranked.append(tuple(rows[i] for i in order))
        return RelatedFacts(tuple(ranked), degraded)

    def _dense(
        self,
        user_id: str,
        scopes: Mapping[str | None, Scope],
        queries: Sequence[FactQuery],
        limit: int,
    ) -> list[list[uuid.UUID]]:
        """Per query, its nearest facts: all queries of a scope scored in one matrix product
        while the scope holds few facts, else one filtered ANN query each."""
        out: list[list[uuid.UUID]] = [[] for _ in queries]
        for connection, scope in scopes.items():
            members = [i for i, q in enumerate(queries) if q.connection_id == connection]
            ids = self._reads.indexed_ids(scope, EXACT_SEARCH_MAX_FACTS + 1)
            if len(ids) > EXACT_SEARCH_MAX_FACTS:
                for i in members:
                    hits = self._index.query(
                        user_id=user_id,
                        text=queries[i].text,
                        connection_ids=scope.connection_ids,
                        n=limit,
                        statuses=CONSOLIDATION_STATUSES,
                    )
                    out[i] = [h.fact_id for h in hits]
                continue
            stored = self._index.embeddings(ids) if ids else {}
            if not stored:
                continue
            keys = sorted(stored, key=str)
            matrix = np.stack([stored[k] for k in keys])
            vectors = self._embedder.embed([queries[i].text for i in members])
            for i, vector in zip(members, vectors, strict=True):
                out[i] = _nearest(keys, matrix, vector, limit)
        return out

    def _current(
        self,
        scopes: Mapping[str | None, Scope],
        queries: Sequence[FactQuery],
        dense: Sequence[Sequence[uuid.UUID]],
        keyword: Sequence[Sequence[Fact]],
    ) -> dict[str | None, dict[uuid.UUID, Fact]]:
        """Per scope, the current rows of every fact found (Chroma may lag behind Postgres)."""
        truth: dict[str | None, dict[uuid.UUID, Fact]] = {c: {} for c in scopes}
        wanted: dict[str | None, set[uuid.UUID]] = {c: set() for c in scopes}
        for query, dense_ids, keyword_facts in zip(queries, dense, keyword, strict=True):
            truth[query.connection_id].update((f.fact_id, f) for f in keyword_facts)
            wanted[query.connection_id].update(dense_ids)
        for connection, ids in wanted.items():
            missing = sorted(ids - truth[connection].keys(), key=str)
            for fact in self._reads.facts_in_scope(scopes[connection], missing):
                truth[connection][fact.fact_id] = fact
        return truth

    # -- plain lookups --------------------------------------------------------------------

    def pinned(self, user_id: str, organization_id: str) -> list[Fact]:
        return self._facts(" AND pinned ORDER BY created_at, fact_id", user_id, organization_id)

    def by_ids(
        self, user_id: str, organization_id: str, fact_ids: Sequence[uuid.UUID]
    ) -> list[Fact]:
        if not fact_ids:
            return []
        return self._facts(
            " AND fact_id = ANY(%s) ORDER BY fact_id", user_id, organization_id, list(fact_ids)
        )

    def count(self, user_id: str, organization_id: str) -> int:
        sql = (
            "SELECT count(*) FROM memory_facts"
            " WHERE user_id = %s AND organization_id = %s AND status = ANY(%s)"
        )
        with self._transaction() as conn:
            row = conn.execute(sql, (user_id, organization_id, _statuses())).fetchone()
        return int(row[0]) if row else 0

    def _facts(self, tail: str, user_id: str, organization_id: str, *extra: Any) -> list[Fact]:
        sql = (
            f"SELECT {fact_rows.COLUMNS} FROM memory_facts"
            f" WHERE user_id = %s AND organization_id = %s AND status = ANY(%s){tail}"
        )
        with self._transaction() as conn:
            rows = conn.execute(sql, (user_id, organization_id, _statuses(), *extra)).fetchall()
        return [fact_rows.from_row(r) for r in rows]

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[Any]]:
        try:
            with transaction(self._pool) as conn:
                yield conn
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e)) from e
        except psycopg.Error as e:
            raise StoreError(f"candidate search failed: {e}") from e


def _statuses() -> list[str]:
    return [s.value for s in CONSOLIDATION_STATUSES]


# -- in memory ----------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have",
        "he", "her", "his", "i", "in", "is", "it", "its", "me", "my", "not", "of", "on", "or",
        "our", "she", "so", "that", "the", "their", "them", "they", "this", "to", "was", "we",
        "were", "what", "when", "who", "will", "with", "you", "your", "user",
    }
)  # fmt: skip


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS)


class InMemoryFactSearch:
    """`FactSearch` over a list of facts: cosine over the embedder (when given) and shared
    content words, fused like the live search. For shadow replays, which hold memory as an
    in-memory image; its keyword side only approximates Postgres full-text ranking."""

    def __init__(self, facts: Sequence[Fact], embedder: Embedder | None = None) -> None:
        wanted = frozenset(CONSOLIDATION_STATUSES)
        self._facts = sorted((f for f in facts if f.status in wanted), key=lambda f: str(f.fact_id))
        self._embedder = embedder

    def _owned(self, user_id: str, organization_id: str) -> list[Fact]:
        return [
            f for f in self._facts if f.user_id == user_id and f.organization_id == organization_id
        ]

    def related(
        self, user_id: str, organization_id: str, queries: Sequence[FactQuery], limit: int
    ) -> RelatedFacts:
        owned = self._owned(user_id, organization_id)
        vectors = self._vectors(owned, queries)
        ranked = []
        for n, query in enumerate(queries):
            scoped = [
                i
                for i, f in enumerate(owned)
                if f.provenance.connection_id in (None, query.connection_id)
            ]
            dense: list[uuid.UUID] = []
            if vectors is not None and scoped and limit > 0:
                facts, queried = vectors
                keys = [owned[i].fact_id for i in scoped]
                dense = _nearest(keys, facts[scoped], queried[n], limit)
            ranked.append(tuple(self._pick(owned, scoped, query.text, dense, limit)))
        return RelatedFacts(tuple(ranked))

    def _vectors(
        self, owned: Sequence[Fact], queries: Sequence[FactQuery]
    ) -> tuple[np.ndarray[Any, Any], list[Vector]] | None:
        if self._embedder is None or not owned or not queries:
            return None
        facts = np.stack(self._embedder.embed([f.content for f in owned]))
        return facts, self._embedder.embed([q.text for q in queries])

    @staticmethod
    def _pick(
        owned: Sequence[Fact],
        scoped: Sequence[int],
        text: str,
        dense: Sequence[uuid.UUID],
        limit: int,
    ) -> list[Fact]:
        words = _words(text)
        overlap = {owned[i].fact_id: len(words & _words(owned[i].content)) for i in scoped}
        keyword = sorted((k for k, v in overlap.items() if v), key=lambda k: (-overlap[k], str(k)))
        by_id = {owned[i].fact_id: owned[i] for i in scoped}
        return [by_id[i] for i in _fuse(dense, keyword[:limit], limit)]

    def pinned(self, user_id: str, organization_id: str) -> list[Fact]:
        pinned = [f for f in self._owned(user_id, organization_id) if f.pinned]
        return sorted(pinned, key=lambda f: (f.created_at, str(f.fact_id)))

    def by_ids(
        self, user_id: str, organization_id: str, fact_ids: Sequence[uuid.UUID]
    ) -> list[Fact]:
        wanted = set(fact_ids)
        return [f for f in self._owned(user_id, organization_id) if f.fact_id in wanted]

    def count(self, user_id: str, organization_id: str) -> int:
        return len(self._owned(user_id, organization_id))
