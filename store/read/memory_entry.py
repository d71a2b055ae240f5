"""One memory's facts at one stamp as the read path holds them in process, and the
byte-bounded cache of them (`store.read.dense` builds the entries and searches them)."""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import numpy.typing as npt

from domain.ids import NO_CONNECTION, MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Vector
from domain.reads import MemoryStamp, Scope
from store.read.keyword_index import KeywordIndex, Terms
from store.read.vector_rows import AppendOnlyMatrix

__all__ = ["STATUS_CODES", "DenseCache", "MemoryVectors", "RowVectors"]

STATUS_CODES = {status: code for code, status in enumerate(FactStatus)}
_MASKS_PER_MEMORY = 32
_ENTRY_OVERHEAD_BYTES = 232  # per fact: the id, its row in the lookup, the scope columns and masks
_FACT_ROW_BYTES = 1_300  # a `Fact` as Python holds it, measured with tracemalloc, less its text


@dataclass(frozen=True)
class MemoryVectors:
    """One memory's facts at one stamp, rows in fact-id order: their vectors (for those in the
    vector index), their scope columns and their keyword index."""

    stamp: MemoryStamp
    ids: tuple[uuid.UUID, ...]
    fact_versions: npt.NDArray[np.int64]
    # The rows' vectors: row i's is `vectors.rows[slots[i]]` when `vectored[i]`; an entry reads
    # the buffer up to `extent` only. Unit vectors.
    vectors: AppendOnlyMatrix
    slots: npt.NDArray[np.int64]
    extent: int
    vectored: npt.NDArray[np.bool_]  # the row's vector is in the index (and in `vectors`)
    connections: npt.NDArray[np.str_]  # NO_CONNECTION for a fact outside every connection
    statuses: npt.NDArray[np.int8]
    context_types: npt.NDArray[np.object_]
    row_of: Mapping[uuid.UUID, int]
    pending: Mapping[uuid.UUID, int]  # fact id -> version written but not indexed yet
    terms: tuple[Terms, ...]
    keywords: KeywordIndex
    # The rows themselves as read at (or, racing a run, just after) the stamp: what ranking
    # weighs changes only with a fact's version, so a turn ranks on these and asks Postgres
    # only for the facts it picked (`ContextService`).
    facts: tuple[Fact, ...]
    # Taken before the rows were read (`DenseReads`): the next version asks Postgres for the
    # rows written since, not for all of them (`store.read.entry_delta`).
    snapshot: str | None = None
    # The length of the facts' texts, carried from version to version (counting 10,000 texts
    # cost a millisecond or two each time); None: count them.
    text_bytes: int | None = None
    # Masks by scope: a turn needs its mask twice (dense and keyword) and a memory sees few
    # scopes; np.isin over the string columns was a twentieth of an API worker's time.
    _masks: dict[tuple[object, ...], npt.NDArray[np.bool_]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @cached_property
    def nbytes(self) -> int:
        facts = len(self.ids) + len(self.pending)
        rows = _FACT_ROW_BYTES * len(self.facts) + self.text_length
        held = self.vectors.nbytes + _ENTRY_OVERHEAD_BYTES * facts + rows
        return held + self.keywords.nbytes

    def similarity(self, rows: npt.NDArray[np.intp], query: Vector) -> npt.NDArray[np.float32]:
        """The cosine of the query and each of these rows' vectors (rows vectored)."""
        buffer = self.vectors.rows
        # Gathering the rows copies them: dearer than scoring every row of the buffer unless
        # few of them are asked for.
        if rows.size * 3 > self.extent:
            scores: npt.NDArray[np.float32] = (buffer[: self.extent] @ query)[self.slots[rows]]
            return scores
        gathered: npt.NDArray[np.float32] = buffer[self.slots[rows]] @ query
        return gathered

    def vector(self, row: int) -> Vector:
        """The row's vector (the row vectored)."""
        vector: Vector = self.vectors.rows[self.slots[row]]
        return vector

    @cached_property
    def text_length(self) -> int:
        """The length of the facts' texts."""
        if self.text_bytes is not None:
            return self.text_bytes
        return sum(len(f.content) for f in self.facts)

    def mask(self, scope: Scope) -> npt.NDArray[np.bool_]:
        """Rows the scope may see: its statuses, its connections or none, its context types.
        Read-only: the same array answers every turn of the same scope."""
        memo = (scope.statuses, scope.connection_ids, scope.context_types)
        keep = self._masks.get(memo)
        if keep is None:
            wanted = np.array([STATUS_CODES[s] for s in scope.statuses], dtype=np.int8)
            keep = np.isin(self.statuses, wanted)
            keep &= np.isin(self.connections, [NO_CONNECTION, *scope.connection_ids])
            if scope.context_types:
                keep &= np.isin(self.context_types, list(scope.context_types))
            keep.flags.writeable = False
            if len(self._masks) >= _MASKS_PER_MEMORY:
                self._masks.clear()  # a memory read under many scopes: start over
            self._masks[memo] = keep
        return keep


class RowVectors(Mapping[uuid.UUID, Vector]):
    """The vectors of a memory's facts by id, without copying the matrix into a dict."""

    def __init__(self, entry: MemoryVectors) -> None:
        self._entry = entry

    def __getitem__(self, fact_id: uuid.UUID) -> Vector:
        row = self._entry.row_of[fact_id]
        if not self._entry.vectored[row]:
            raise KeyError(fact_id)
        return self._entry.vector(row)

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
        self,
        stamps: Callable[[Sequence[MemoryKey]], Mapping[MemoryKey, MemoryStamp]],
        *,
        keep_older_versions: bool = False,
    ) -> int:
        """Drop the matrices whose memory is gone or changed; returns how many.

        `stamps` gives the stored stamp of each memory that still exists (the read model's
        `memory_stamps`): an erasure done by another process is seen here within one sweep.
        `keep_older_versions`: drop only the memories gone or of another generation (an
        erasure), and keep an entry a consolidation has made older; the next build of that
        memory reuses its unchanged facts (the processor's candidate search, whose own runs
        make every entry older).
        """
        with self._lock:
            keys = list(self._entries)
        current = stamps(keys) if keys else {}
        dropped = 0
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None and _stale(entry.stamp, current.get(key), keep_older_versions):
                    del self._entries[key]
                    self._bytes -= entry.nbytes
                    dropped += 1
        return dropped


def _stale(held: MemoryStamp, stored: MemoryStamp | None, keep_older_versions: bool) -> bool:
    if stored is None or held.generation != stored.generation:
        return True
    return held.version != stored.version and not keep_older_versions
