"""The dense stage of retrieval: an exact search over one memory's vectors, held in process.

A memory (organization, user) changes only when a consolidation run commits, which increments
`user_memory.version`, or when an erasure gives it a new generation. So the vectors of a memory
at a stamp (generation, version) are fetched from Chroma once, kept as one matrix with each
fact's scope columns (and its lexemes, for the keyword stage's index, `keyword_index`) beside
it, and every later turn of that memory costs one matrix-vector product and a mask, whatever
the collection holds: no Chroma call, no Postgres query beyond the version check.

Why not Chroma's own filtered query: Chroma 1.5 answers a metadata-filtered query by scanning
the metadata of the whole collection (265 ms at 100k facts), and a fetch by id grows with the
user's facts (9 ms for 100, about 100 ms for 10,000). A new version reuses the vectors and
lexemes of the previous one of the same generation for every fact whose (id, version) is
unchanged, so a run that adds 20 facts fetches 20, not 10,000; a new generation fetches
everything again, so nothing of erased content is carried over.

Facts written by a run are indexed in Chroma a moment after it commits. An entry built in
between holds them as pending (in the keyword index, not in the dense search); while any is
pending each turn asks Postgres (by primary key) whether they are indexed now.

The entries are bounded by bytes, least recently used evicted first; an erasure in this
process drops its memory's entry at once, the periodic sweep those erased elsewhere.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg_pool import ConnectionPool

from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import FactStatus
from domain.ports import Embedder, Vector, VectorHit
from domain.reads import MemoryStamp, Scope
from store.errors import DatabaseUnavailable, StoreError
from store.postgres import statement
from store.read.keyword_index import KeywordIndex, QueryLexemes, Terms

__all__ = ["DenseCache", "DenseReads", "DenseSearch", "IndexedRow", "MemoryVectors"]

_STATUS_CODES = {status: code for code, status in enumerate(FactStatus)}
_MASKS_PER_MEMORY = 32
_ENTRY_OVERHEAD_BYTES = 232  # per fact: the id, its row in the lookup, the scope columns and masks
_TERMS = (
    "SELECT f.fact_id, t.lexemes, t.counts FROM memory_facts f, LATERAL (SELECT"
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


class VectorSource(Protocol):
    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> Mapping[uuid.UUID, Vector]: ...


class DenseReads:
    """The two Postgres reads of the dense stage; both use the memory's index or the key."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def rows(self, key: MemoryKey) -> list[IndexedRow]:
        sql = (
            "SELECT fact_id, version, connection_id, status, context_type,"
            " indexed_at IS NOT NULL FROM memory_facts"
            " WHERE organization_id = %s AND user_id = %s"
        )
        with self._transaction() as conn:
            found = conn.execute(sql, (key.organization_id, key.user_id)).fetchall()
        return [
            IndexedRow(r[0], int(r[1]), r[2], FactStatus(r[3]), str(r[4]), bool(r[5]))
            for r in found
        ]

    def terms(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Terms]:
        """These facts' lexemes and counts, as the SQL BM25 reads them from `content_tsv`."""
        if not fact_ids:
            return {}
        with self._transaction() as conn:
            found = conn.execute(_TERMS, (key.organization_id, key.user_id, list(fact_ids)))
            return {r[0]: Terms(tuple(r[1] or ()), tuple(r[2] or ())) for r in found}

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
        """One statement (no BEGIN/COMMIT round trips); driver errors become StoreError
        (DatabaseUnavailable if transient)."""
        try:
            with statement(self._pool) as conn:
                yield conn
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e)) from e
        except psycopg.Error as e:
            raise StoreError(f"dense read failed: {e}") from e


@dataclass(frozen=True)
class MemoryVectors:
    """One memory's facts at one stamp, rows in fact-id order: their vectors (for those in the
    vector index), their scope columns and their keyword index."""

    stamp: MemoryStamp
    ids: tuple[uuid.UUID, ...]
    fact_versions: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.float32]  # len(ids) × dimension, unit rows (zero when not vectored)
    vectored: npt.NDArray[np.bool_]  # the row's vector is in the index (and in the matrix)
    connections: npt.NDArray[np.str_]  # NO_CONNECTION for a fact outside every connection
    statuses: npt.NDArray[np.int8]
    context_types: npt.NDArray[np.object_]
    row_of: Mapping[uuid.UUID, int]
    pending: Mapping[uuid.UUID, int]  # fact id -> version written but not indexed yet
    terms: tuple[Terms, ...]
    keywords: KeywordIndex
    # Masks by scope: a turn needs its mask twice (dense and keyword) and a memory sees few
    # scopes; np.isin over the string columns was a twentieth of an API worker's time.
    _masks: dict[tuple[object, ...], npt.NDArray[np.bool_]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def nbytes(self) -> int:
        facts = len(self.ids) + len(self.pending)
        return int(self.matrix.nbytes) + _ENTRY_OVERHEAD_BYTES * facts + self.keywords.nbytes

    def mask(self, scope: Scope) -> npt.NDArray[np.bool_]:
        """Rows the scope may see: its statuses, its connections or none, its context types.
        Read-only: the same array answers every turn of the same scope."""
        memo = (scope.statuses, scope.connection_ids, scope.context_types)
        keep = self._masks.get(memo)
        if keep is None:
            wanted = np.array([_STATUS_CODES[s] for s in scope.statuses], dtype=np.int8)
            keep = np.isin(self.statuses, wanted)
            keep &= np.isin(self.connections, [NO_CONNECTION, *scope.connection_ids])
            if scope.context_types:
                keep &= np.isin(self.context_types, list(scope.context_types))
            keep.flags.writeable = False
            if len(self._masks) >= _MASKS_PER_MEMORY:
                self._masks.clear()  # a memory read under many scopes: start over
            self._masks[memo] = keep
        return keep


class _RowVectors(Mapping[uuid.UUID, Vector]):
    """The vectors of a memory's facts by id, without copying the matrix into a dict."""

    def __init__(self, entry: MemoryVectors) -> None:
        self._entry = entry

    def __getitem__(self, fact_id: uuid.UUID) -> Vector:
        row = self._entry.row_of[fact_id]
        if not self._entry.vectored[row]:
            raise KeyError(fact_id)
        vector: Vector = self._entry.matrix[row]
        return vector

    def __contains__(self, fact_id: object) -> bool:
        row = self._entry.row_of.get(fact_id)  # type: ignore[call-overload]
        return row is not None and bool(self._entry.vectored[row])

    def __iter__(self) -> Iterator[uuid.UUID]:
        return (self._entry.ids[r] for r in np.flatnonzero(self._entry.vectored))

    def __len__(self) -> int:
        return int(np.count_nonzero(self._entry.vectored))


class DenseCache:
    """Memories' vector matrices, bounded by bytes, least recently used evicted first."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self._max = max_bytes
        self._entries: OrderedDict[MemoryKey, MemoryVectors] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: MemoryKey) -> MemoryVectors | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: MemoryKey, entry: MemoryVectors) -> None:
        with self._lock:
            current = self._entries.get(key)
            # A slower builder must not replace a newer version with an older one; an entry
            # of another generation is stale whatever its version.
            if (
                current is not None
                and current.stamp.generation == entry.stamp.generation
                and current.stamp.version > entry.stamp.version
            ):
                return
            if current is not None:
                self._bytes -= current.nbytes
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._bytes += entry.nbytes
            # The newest entry stays even when it alone is over the bound: it is in use.
            while self._bytes > self._max and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def invalidate(self, key: MemoryKey) -> None:
        with self._lock:
            dropped = self._entries.pop(key, None)
            if dropped is not None:
                self._bytes -= dropped.nbytes

    def sweep(
        self, stamps: Callable[[Sequence[MemoryKey]], Mapping[MemoryKey, MemoryStamp]]
    ) -> int:
        """Drop the matrices whose memory is gone or changed; returns how many.

        `stamps` gives the stored stamp of each memory that still exists (the read model's
        `memory_stamps`): an erasure done by another process is seen here within one sweep.
        """
        with self._lock:
            keys = list(self._entries)
        current = stamps(keys) if keys else {}
        dropped = 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None and entry.stamp != current.get(key):
                    del self._entries[key]
                    self._bytes -= entry.nbytes
                    dropped += 1
        return dropped


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
        rows = np.flatnonzero(entry.mask(scope) & entry.vectored)
        if rows.size == 0:
            return [], {}
        (query,) = self._embedder.embed([text])
        similarity = entry.matrix[rows] @ query
        # Rows are in id order and the sort is stable, so equal scores rank by fact id.
        order = np.argsort(-similarity, kind="stable")[:n]
        hits = [VectorHit(entry.ids[rows[k]], float(similarity[k]), "", {}) for k in order]
        return hits, _RowVectors(entry)

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
        if n <= 0 or not scope.statuses or not entry.ids:
            return []
        rows = entry.keywords.search(self._lexemes(text), entry.mask(scope), n)
        return [entry.ids[r] for r in rows]

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
        rows = sorted(self._reads.rows(key), key=lambda r: str(r.fact_id))
        known: dict[uuid.UUID, Vector] = {}
        terms: dict[uuid.UUID, Terms] = {}
        # Only within one generation: an erasure's new generation must not inherit anything.
        if previous is not None and previous.stamp.generation == stamp.generation:
            for r in rows:
                at = previous.row_of.get(r.fact_id)
                if at is None or int(previous.fact_versions[at]) != r.version:
                    continue
                terms[r.fact_id] = previous.terms[at]
                if r.indexed and previous.vectored[at]:
                    known[r.fact_id] = previous.matrix[at]
        missing = [r.fact_id for r in rows if r.indexed and r.fact_id not in known]
        unread = [r.fact_id for r in rows if r.fact_id not in terms]
        for start in range(0, max(len(missing), len(unread)), self._fetch_batch):
            known |= self._vectors.embeddings(missing[start : start + self._fetch_batch])
            terms |= self._reads.terms(key, unread[start : start + self._fetch_batch])
        # A row gone between the two reads has no terms: it is not in the memory any more.
        rows = [r for r in rows if r.fact_id in terms]
        # A fact marked indexed but absent from Chroma (lost, or erased) cannot be scored.
        matrix = np.zeros((len(rows), self._embedder.dimension), dtype=np.float32)
        for i, r in enumerate(rows):
            if r.indexed and r.fact_id in known:
                matrix[i] = known[r.fact_id]
        ordered = tuple(terms[r.fact_id] for r in rows)
        return MemoryVectors(
            stamp=stamp,
            ids=tuple(r.fact_id for r in rows),
            fact_versions=np.array([r.version for r in rows], dtype=np.int64),
            matrix=matrix,
            vectored=np.array([r.indexed and r.fact_id in known for r in rows], dtype=np.bool_),
            connections=np.array([r.connection_id or NO_CONNECTION for r in rows], dtype=np.str_),
            statuses=np.array([_STATUS_CODES[r.status] for r in rows], dtype=np.int8),
            context_types=np.array([r.context_type for r in rows], dtype=object),
            row_of={r.fact_id: i for i, r in enumerate(rows)},
            pending={r.fact_id: r.version for r in rows if not r.indexed},
            terms=ordered,
            keywords=KeywordIndex(ordered),
        )
