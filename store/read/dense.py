"""The dense stage of retrieval: an exact search over one memory's vectors, held in process.

A memory (organization, user) changes only when a consolidation run commits, which increments
`user_memory.version`, or when an erasure gives it a new generation. So the vectors of a memory
at a stamp (generation, version) are fetched from Chroma once, kept as one matrix with each
fact's scope columns, its row (for ranking) and its lexemes (for the keyword stage's index,
`keyword_index`) beside it, and every later turn of that memory costs one matrix-vector product
and a mask, whatever the collection holds: no Chroma call, and of Postgres only the version
check and the rows of the facts the turn picks (`ContextService`).

Why not Chroma's own filtered query: Chroma 1.5 answers a metadata-filtered query by scanning
the metadata of the whole collection (265 ms at 100k facts), and a fetch by id grows with the
user's facts (9 ms for 100, about 100 ms for 10,000). A new version of the same generation is
the previous entry with the rows written since its snapshot put in (`entry_delta`): a run that
adds 20 facts reads and fetches 20, not 10,000. A memory that lost a fact since is read whole
again, reusing the vectors, lexemes and rows of every fact whose (id, version) is unchanged; a
new generation fetches everything again, so nothing of erased content is carried over.

A fact marked indexed whose vector Chroma lost is held unscored until its row is written
again, as `memoryd index-verify` does when it repairs the index (`consumers.index_check`).

Facts written by a run are indexed in Chroma a moment after it commits. An entry built in
between holds them as pending (in the keyword index, not in the dense search); while any is
pending each turn asks Postgres (by primary key) whether they are indexed now.

The entries are bounded by bytes, least recently used evicted first; an erasure in this
process drops its memory's entry at once, the periodic sweep those erased elsewhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import Fact
from domain.ports import Embedder, Vector, VectorHit
from domain.reads import MemoryStamp, Scope
from store.read import entry_delta
from store.read.dense_reads import DenseReads, IndexedRow, VectorSource
from store.read.keyword_index import KeywordIndex, QueryLexemes, Terms
from store.read.memory_entry import STATUS_CODES, DenseCache, MemoryVectors, RowVectors
from store.read.ranking import top_n
from store.read.vector_rows import AppendOnlyMatrix

__all__ = ["DenseSearch"]


class DenseSearch:
    """Exact top-n by cosine over a memory's facts in scope, from the cached matrix; and the
    keyword stage's BM25 over the same cached facts."""

    def __init__(
        self,
        reads: DenseReads,
        vectors: VectorSource,
        embedder: Embedder,
        cache: DenseCache,
        *,
        fetch_batch: int = 5_000,
    ) -> None:
        self._reads = reads
        self._vectors = vectors
        self._embedder = embedder
        self._cache = cache
        self._fetch_batch = fetch_batch
        self._lexemes = QueryLexemes(reads.query_lexemes)

    def search(
        self, scope: Scope, stamp: MemoryStamp, text: str, n: int
    ) -> tuple[list[VectorHit], Mapping[uuid.UUID, Vector]]:
        """The n nearest facts in scope (ties by id), and the vectors of all of them."""
        if n <= 0 or not scope.statuses:
            return [], {}
        entry = self.memory(scope.key, stamp)
        if not (entry.mask(scope) & entry.vectored).any():
            return [], {}  # nothing to score: the query is not embedded
        (query,) = self._embedder.embed([text])
        return self.nearest(entry, scope, query, n), RowVectors(entry)

    @staticmethod
    def nearest(entry: MemoryVectors, scope: Scope, query: Vector, n: int) -> list[VectorHit]:
        """The n facts of the entry in scope nearest to the query's vector (ties by id)."""
        rows = np.flatnonzero(entry.mask(scope) & entry.vectored)
        if n <= 0 or rows.size == 0:
            return []
        similarity = entry.similarity(rows, query)
        order = top_n(similarity, n)
        return [VectorHit(entry.ids[rows[k]], float(similarity[k]), "", {}) for k in order]

    def keyword(
        self, scope: Scope, stamp: MemoryStamp, text: str, n: int
    ) -> list[uuid.UUID] | None:
        """Ids of the n facts in scope of best BM25 score for text (ties by id), ranked as
        `PostgresReadModel.keyword_search` ranks them; None when the memory has no entry at
        this stamp (its build failed: the vector index is down), for the caller to ask SQL.

        Called after `search` in a turn, so it never builds or re-checks an entry itself.
        """
        entry = self._cache.get(scope.key)
        if entry is None or entry.stamp != stamp:
            return None
        return self.keyword_in(entry, scope, text, n)

    def keyword_in(self, entry: MemoryVectors, scope: Scope, text: str, n: int) -> list[uuid.UUID]:
        """`keyword` over this entry."""
        if n <= 0 or not scope.statuses or not entry.ids:
            return []
        rows = entry.keywords.search(self._lexemes(text), entry.mask(scope), n)
        return [entry.ids[r] for r in rows]

    def rows(
        self, scope: Scope, stamp: MemoryStamp, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, Fact] | None:
        """The entry's rows of these facts that are in scope; None when the memory has no
        entry at this stamp. Called after `search` in a turn, like `keyword`."""
        entry = self._cache.get(scope.key)
        if entry is None or entry.stamp != stamp:
            return None
        keep = entry.mask(scope)
        out = {}
        for fact_id in fact_ids:
            row = entry.row_of.get(fact_id)
            if row is not None and keep[row]:
                out[fact_id] = entry.facts[row]
        return out

    def memory(self, key: MemoryKey, stamp: MemoryStamp) -> MemoryVectors:
        """The memory's entry at this stamp: cached, completed, or built."""
        cached = self._cache.get(key)
        if (
            cached is not None
            and cached.stamp == stamp
            and (not cached.pending or not self._reads.indexed(cached.pending))
        ):
            return cached
        entry = self._build(key, stamp, cached)
        self._cache.put(key, entry)
        return entry

    def forget(self, key: MemoryKey) -> None:
        """Drop the memory's entry (its erasure in this process calls it)."""
        self._cache.invalidate(key)

    def sweep(
        self, stamps: Callable[[Sequence[MemoryKey]], Mapping[MemoryKey, MemoryStamp]]
    ) -> int:
        return self._cache.sweep(stamps)

    def _build(
        self, key: MemoryKey, stamp: MemoryStamp, previous: MemoryVectors | None
    ) -> MemoryVectors:
        # Only within one generation: an erasure's new generation must not inherit anything.
        same = previous
        if same is not None and same.stamp.generation != stamp.generation:
            same = None
        if same is not None and same.snapshot is not None:
            delta = entry_delta.plan(same, self._reads.changes(key, same.snapshot))
            if delta is not None:
                fetched, details = self._read(key, delta.to_fetch(), delta.to_read())
                updated = delta.apply(stamp, details, fetched)
                if updated is not None:
                    return updated
        return self._build_from_rows(key, stamp, same)

    def _read(
        self, key: MemoryKey, missing: Sequence[uuid.UUID], unread: Sequence[uuid.UUID]
    ) -> tuple[dict[uuid.UUID, Vector], dict[uuid.UUID, tuple[Fact, Terms]]]:
        """The vectors of `missing` from the index, the rows and terms of `unread`."""
        fetched: dict[uuid.UUID, Vector] = {}
        details: dict[uuid.UUID, tuple[Fact, Terms]] = {}
        for start in range(0, max(len(missing), len(unread)), self._fetch_batch):
            fetched |= self._vectors.embeddings(missing[start : start + self._fetch_batch])
            details |= self._reads.details(key, unread[start : start + self._fetch_batch])
        return fetched, details

    def _build_from_rows(
        self, key: MemoryKey, stamp: MemoryStamp, same: MemoryVectors | None
    ) -> MemoryVectors:
        """The entry from all the memory's rows, reusing `same`'s facts at unchanged versions."""
        # In fact-id order (Postgres orders a uuid by its bytes, as its text form sorts): equal
        # scores rank by fact id, as in the SQL searches.
        read = self._reads.rows(key)
        rows = read.rows
        at = _unchanged_rows(rows, same)
        indexed = np.fromiter((r.indexed for r in rows), dtype=np.bool_, count=len(rows))
        from_previous = indexed & (at >= 0)
        if same is not None and same.ids:
            from_previous &= same.vectored[np.maximum(at, 0)]
        missing = [rows[i].fact_id for i in np.flatnonzero(indexed & ~from_previous)]
        unread = [rows[i].fact_id for i in np.flatnonzero(at < 0)]
        fetched, details = self._read(key, missing, unread)
        # A row gone between the two reads has no details: it is not in the memory any more.
        keep = [i for i, r in enumerate(rows) if at[i] >= 0 or r.fact_id in details]
        rows = [rows[i] for i in keep]
        at, from_previous = at[keep], from_previous[keep]
        # A fact marked indexed but absent from Chroma (lost, or erased) cannot be scored.
        vectors = AppendOnlyMatrix.with_room(len(rows), self._embedder.dimension)
        matrix = vectors.rows[: len(rows)]
        vectored = from_previous.copy()
        if same is not None:
            matrix[from_previous] = same.vectors.rows[same.slots[at[from_previous]]]
        facts: list[Fact] = []
        ordered: list[Terms] = []
        for r, a in zip(rows, at.tolist(), strict=True):
            if same is not None and a >= 0:
                fact, terms = same.facts[a], same.terms[a]
            else:
                fact, terms = details[r.fact_id]
            facts.append(fact)
            ordered.append(terms)
        for i, r in enumerate(rows):
            if (
                r.indexed
                and not from_previous[i]
                and (vector := fetched.get(r.fact_id)) is not None
            ):
                matrix[i] = vector
                vectored[i] = True
        return MemoryVectors(
            stamp=stamp,
            ids=tuple(r.fact_id for r in rows),
            fact_versions=np.array([r.version for r in rows], dtype=np.int64),
            vectors=vectors,
            slots=np.arange(len(rows), dtype=np.int64),
            extent=len(rows),
            vectored=vectored,
            connections=np.array([r.connection_id or NO_CONNECTION for r in rows], dtype=np.str_),
            statuses=np.array([STATUS_CODES[r.status] for r in rows], dtype=np.int8),
            context_types=np.array([r.context_type for r in rows], dtype=object),
            row_of={r.fact_id: i for i, r in enumerate(rows)},
            pending={r.fact_id: r.version for r in rows if not r.indexed},
            terms=tuple(ordered),
            keywords=KeywordIndex(ordered),
            facts=tuple(facts),
            snapshot=read.snapshot,
        )


def _unchanged_rows(
    rows: Sequence[IndexedRow], same: MemoryVectors | None
) -> npt.NDArray[np.int64]:
    """Per row, its row in `same` when the fact is there at the same version, else -1."""
    if same is None or not same.ids:
        return np.full(len(rows), -1, dtype=np.int64)
    at = np.fromiter(
        (same.row_of.get(r.fact_id, -1) for r in rows), dtype=np.int64, count=len(rows)
    )
    versions = np.fromiter((r.version for r in rows), dtype=np.int64, count=len(rows))
    unchanged = (at >= 0) & (same.fact_versions[np.maximum(at, 0)] == versions)
    return np.where(unchanged, at, -1)
