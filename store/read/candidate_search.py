"""`FactSearch`: the facts a consolidation batch is about, found the way the read path finds them.

`HybridFactSearch` is the live one: per observation, the dense search of the read path and
its keyword search, fused by reciprocal rank. While a scope has few facts their stored vectors
are scored exactly and Postgres runs the keyword search; beyond that the memory's entry held in
process answers both (`store.read.dense`: built once, then only the facts a run changed are
read again), as Chroma's filtered query and Postgres's BM25 both grow with the facts (together
1.4 s for five observations of a user of 10,000 facts: BENCHMARKS.md, Processor overhead).
Unlike a chat turn it does not weigh recency or salience: a correction is about the fact it
corrects, however old or dull.
Postgres decides what is current and in scope, as on the read path. With Chroma down the
rankings are keyword-only and say so, and consolidation goes on.

`store.inmemory.InMemoryFactSearch` does the same over facts held in memory (a shadow
replay's image).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from domain.model import Fact
from domain.ports import Embedder, FactQuery, RelatedFacts, Vector, VectorIndex
from domain.reads import Scope
from store import fact_rows
from store.candidate_ranking import (
    CONSOLIDATION_STATUS_VALUES,
    CONSOLIDATION_STATUSES,
    COUNT_CONSOLIDATION_FACTS,
    fuse,
    nearest_ids,
)
from store.errors import VectorIndexUnavailable
from store.postgres import memory_params, statement
from store.read.dense import DenseSearch
from store.read.fact_queries import PostgresReadModel
from store.read.memory_entry import MemoryVectors, RowVectors

# Up to this many indexed facts in scope a memory's vectors are fetched and scored exactly and
# Postgres runs the keyword search; beyond it the memory's entry answers (or, without one,
# Chroma's filtered query, cheaper than fetching every vector for one batch).
EXACT_SEARCH_MAX_FACTS = 200
# Chroma's filtered query, refilled for facts it still has active, asks for at most this many
# times the facts wanted (`HybridFactSearch._nearest_current`).
MAX_ASKED_GROWTH = 8


def _scope(key: MemoryKey, connection_id: str | None) -> Scope:
    return Scope(
        key=key,
        connection_ids=(connection_id,) if connection_id else (),
        statuses=CONSOLIDATION_STATUSES,
    )


class VectorMemory(Protocol):
    """Vectors of texts a process holds (`store.embedding_cache.CachingEmbedder`)."""

    def known(self, texts: Sequence[str]) -> Mapping[str, Vector]: ...

    def remember(self, vectors: Mapping[str, Vector]) -> None: ...


class HybridFactSearch:
    def __init__(
        self,
        pool: ConnectionPool,
        reads: PostgresReadModel,
        index: VectorIndex,
        embedder: Embedder,
        *,
        vectors: VectorMemory | None = None,
        memories: DenseSearch | None = None,
    ) -> None:
        """`vectors`: the process's embedding cache. The dense stage takes the vectors of
        stored facts whose texts it holds from it, and asks Chroma for the others; the
        vectors of the facts found go to it, so the write gate compares the batch's proposals
        with them without running the model on the facts' texts again.

        `memories`: the memories' entries held in process, for scopes of more than
        `EXACT_SEARCH_MAX_FACTS`; the batch's queries are embedded once, for every scope. A
        flush searches under its memory's lock, so the entry at the memory's stamp is the
        memory as the flush sees it."""
        self._pool = pool
        self._reads = reads
        self._index = index
        self._embedder = embedder
        self._vectors = vectors
        self._memories = memories

    def related(self, key: MemoryKey, queries: Sequence[FactQuery], limit: int) -> RelatedFacts:
        if not queries or limit <= 0:
            return RelatedFacts(tuple(() for _ in queries))
        scopes = {q.connection_id: _scope(key, q.connection_id) for q in queries}
        indexed = {
            c: self._reads.indexed_texts(s, EXACT_SEARCH_MAX_FACTS + 1) for c, s in scopes.items()
        }
        exact = {c for c, ids in indexed.items() if 0 < len(ids) <= EXACT_SEARCH_MAX_FACTS}
        large = {c for c, ids in indexed.items() if len(ids) > EXACT_SEARCH_MAX_FACTS}
        memories = self._memories if large else None
        stamp = self._reads.memory_stamps([key]).get(key) if memories is not None else None
        held = large if stamp is not None else set()
        members = [i for i, q in enumerate(queries) if q.connection_id in exact | held]
        texts = [queries[i].text for i in members]
        # The queries are embedded on a thread of their own while this one waits for Postgres
        # and Chroma: in a flush of five observations the model took 10-15 ms, the keyword
        # search and Chroma's vectors 5-6 ms (bench.processor --history 1). Leaving the block
        # waits for that thread; where the vectors are used, `result()` raises what it raised.
        with ThreadPoolExecutor(1, "candidate-queries") as side:
            vectors = side.submit(self._embedder.embed, texts) if texts else None
            in_sql = [i for i, q in enumerate(queries) if q.connection_id not in held]
            keyword, rows_found = self._keyword(scopes, queries, in_sql, limit)
            degraded = None
            stored: dict[str | None, Mapping[uuid.UUID, Vector]] = {}
            try:
                elsewhere = {c: ids for c, ids in indexed.items() if c not in held}
                dense, stored = self._dense(
                    scopes, elsewhere, queries, limit, members, vectors, rows_found
                )
                if memories is not None and stamp is not None:
                    entry = memories.memory(key, stamp)
                    of_query = dict(zip(members, vectors.result(), strict=True)) if vectors else {}
                    held_ids = _from_entry(memories, entry, scopes, queries, held, of_query, limit)
                    for i, (nearest, best) in held_ids.items():
                        dense[i], keyword[i] = nearest, best
                    stored |= {c: RowVectors(entry) for c in held}
            except VectorIndexUnavailable as e:
                dense, degraded = [[] for _ in queries], f"vector index unavailable: {e}"
                rest = [i for i in range(len(queries)) if i not in in_sql]
                more_ids, more_rows = self._keyword(scopes, queries, rest, limit)
                for i in rest:
                    connection = queries[i].connection_id
                    keyword[i] = more_ids[i]
                    rows_found[connection].update(more_rows[connection])
        truth = self._current(scopes, queries, dense, keyword, rows_found)
        if self._vectors is not None:
            found = (
                (f, stored.get(c, {}).get(i)) for c, rows in truth.items() for i, f in rows.items()
            )
            self._vectors.remember({f.content: v for f, v in found if v is not None})
        ranked = []
        for query, dense_ids, keyword_ids in zip(queries, dense, keyword, strict=True):
            rows = truth[query.connection_id]
            order = fuse(
                [i for i in dense_ids if i in rows], [i for i in keyword_ids if i in rows], limit
            )
            ranked.append(tuple(rows[i] for i in order))
        return RelatedFacts(tuple(ranked), degraded)

    def _keyword(
        self,
        scopes: Mapping[str | None, Scope],
        queries: Sequence[FactQuery],
        members: Sequence[int],
        limit: int,
    ) -> tuple[list[list[uuid.UUID]], dict[str | None, dict[uuid.UUID, Fact]]]:
        """Postgres's keyword search for the `members` queries: their ids in BM25 order (the
        others' lists stay empty, for the entries to fill), and the rows found, per scope."""
        ids: list[list[uuid.UUID]] = [[] for _ in queries]
        rows: dict[str | None, dict[uuid.UUID, Fact]] = {c: {} for c in scopes}
        searches = [(scopes[queries[i].connection_id], queries[i].text) for i in members]
        for i, found in zip(members, self._reads.keyword_searches(searches, limit), strict=True):
            ids[i] = [f.fact_id for f in found]
            rows[queries[i].connection_id].update((f.fact_id, f) for f in found)
        return ids, rows

    def _dense(
        self,
        scopes: Mapping[str | None, Scope],
        indexed: Mapping[str | None, Mapping[uuid.UUID, str]],
        queries: Sequence[FactQuery],
        limit: int,
        members: Sequence[int],
        vectors: Future[list[Vector]] | None,
        rows_found: dict[str | None, dict[uuid.UUID, Fact]],
    ) -> tuple[list[list[uuid.UUID]], dict[str | None, Mapping[uuid.UUID, Vector]]]:
        """Per query, its nearest facts: in a scope of few facts its vector (`members`' are
        being computed in `vectors`) scored against the scope's stored ones, else one filtered
        ANN query each (`_nearest_current`, whose rows go in `rows_found`). Also the stored
        vectors fetched, per scope."""
        out: list[list[uuid.UUID]] = [[] for _ in queries]
        stored: dict[str | None, Mapping[uuid.UUID, Vector]] = {}
        for connection, ids in indexed.items():
            if len(ids) > EXACT_SEARCH_MAX_FACTS:
                for i, query in enumerate(queries):
                    if query.connection_id == connection:
                        found = self._nearest_current(scopes[connection], query.text, limit)
                        out[i] = [f.fact_id for f in found]
                        rows_found[connection].update((f.fact_id, f) for f in found)
            elif ids:
                stored[connection] = self._stored_vectors(ids)
        if vectors is not None and any(stored.values()):
            for i, vector in zip(members, vectors.result(), strict=True):
                if vectors_of_scope := stored.get(queries[i].connection_id):
                    out[i] = nearest_ids(vectors_of_scope, vector, limit)
        return out, stored

    def _nearest_current(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        """Chroma's `limit` nearest facts in scope, as Postgres has them now.

        Chroma's metadata follows Postgres a moment after a run commits: a fact just closed
        may still match there, and is dropped here. It takes no place: Chroma is asked for
        twice as many until `limit` current facts are found, it has no more to give, or it
        was asked for `MAX_ASKED_GROWTH` times `limit` (an index that far behind is caught up
        by the indexer and the index check, not by one search).
        """
        asked = limit
        while True:
            hits = self._index.query(scope, text, asked)
            rows = {
                f.fact_id: f for f in self._reads.facts_in_scope(scope, [h.fact_id for h in hits])
            }
            current = [rows[h.fact_id] for h in hits if h.fact_id in rows]
            if len(current) >= limit or len(hits) < asked or asked >= MAX_ASKED_GROWTH * limit:
                return current[:limit]
            asked *= 2

    def _stored_vectors(self, texts: Mapping[uuid.UUID, str]) -> Mapping[uuid.UUID, Vector]:
        """The stored vectors of these indexed facts. An indexed fact's stored vector is the
        model's vector of its current text (a new version is not indexed until its own vector
        is stored), so a vector of that text held in the process is the same vector."""
        held = self._vectors.known(list(texts.values())) if self._vectors is not None else {}
        found = {i: held[t] for i, t in texts.items() if t in held}
        if missing := [i for i in texts if i not in found]:
            found |= self._index.embeddings(missing)
        return found

    def _current(
        self,
        scopes: Mapping[str | None, Scope],
        queries: Sequence[FactQuery],
        dense: Sequence[Sequence[uuid.UUID]],
        keyword: Sequence[Sequence[uuid.UUID]],
        rows_found: Mapping[str | None, Mapping[uuid.UUID, Fact]],
    ) -> dict[str | None, dict[uuid.UUID, Fact]]:
        """Per scope, the current rows of every fact found: those Postgres's keyword search
        returned, and the others (Chroma or the entry found them) read by id."""
        truth: dict[str | None, dict[uuid.UUID, Fact]] = {c: dict(rows_found[c]) for c in scopes}
        wanted: dict[str | None, set[uuid.UUID]] = {c: set() for c in scopes}
        for query, dense_ids, keyword_ids in zip(queries, dense, keyword, strict=True):
            wanted[query.connection_id].update(dense_ids, keyword_ids)
        for connection, ids in wanted.items():
            missing = sorted(ids - truth[connection].keys(), key=str)
            for fact in self._reads.facts_in_scope(scopes[connection], missing):
                truth[connection][fact.fact_id] = fact
        return truth

    # -- plain lookups --------------------------------------------------------------------

    def pinned(self, key: MemoryKey) -> list[Fact]:
        return self._facts(" AND pinned ORDER BY created_at, fact_id", key)

    def by_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        if not fact_ids:
            return []
        return self._facts(" AND fact_id = ANY(%s) ORDER BY fact_id", key, list(fact_ids))

    def count(self, key: MemoryKey) -> int:
        with statement(self._pool, "counting facts") as conn:
            params = (*memory_params(key), CONSOLIDATION_STATUS_VALUES)
            row = conn.execute(COUNT_CONSOLIDATION_FACTS, params).fetchone()
        return int(row[0]) if row else 0

    def _facts(self, tail: str, key: MemoryKey, *extra: Any) -> list[Fact]:
        sql = (
            f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM}"
            f" WHERE organization_id = %s AND user_id = %s AND status = ANY(%s){tail}"
        )
        with statement(self._pool, "candidate search") as conn:
            params = (*memory_params(key), CONSOLIDATION_STATUS_VALUES, *extra)
            rows = conn.execute(sql, params).fetchall()
        return [fact_rows.from_row(r) for r in rows]


def _from_entry(
    memories: DenseSearch,
    entry: MemoryVectors,
    scopes: Mapping[str | None, Scope],
    queries: Sequence[FactQuery],
    held: set[str | None],
    vectors: Mapping[int, Vector],
    limit: int,
) -> dict[int, tuple[list[uuid.UUID], list[uuid.UUID]]]:
    """Per query whose scope the memory's entry holds, by position: its nearest facts (from
    its vector in `vectors`) and its best by keyword, ids in rank order."""
    found = {}
    for i, query in enumerate(queries):
        if query.connection_id in held:
            scope = scopes[query.connection_id]
            nearest = [h.fact_id for h in memories.nearest(entry, scope, vectors[i], limit)]
            found[i] = (nearest, memories.keyword_in(entry, scope, query.text, limit))
    return found
