"""A memory's entry at its next version from the one before and the rows written since.

A run changes a handful of a memory's facts and the indexer marks them indexed a moment
later, yet reading all the memory's rows again and rebuilding its entry cost a user of 10,000
facts about 140 ms a version (BENCHMARKS.md, "The entry's update in place"). Postgres gives
the rows written since the entry's snapshot (`DenseReads.changes`); this puts them in: a
changed row in its place, a new fact before the first row of a greater id (rows stay in
fact-id order, which ties are broken by), the keyword index's postings shifted, not rebuilt.
The result equals a build from nothing at the same rows (tests/unit/test_entry_delta.py).

A memory that lost a fact since (an erasure of one fact) has fewer rows than the entry plus
the new ones: `plan` answers None and the caller builds the entry from all its rows.
"""

from __future__ import annotations

import uuid
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from domain.ids import NO_CONNECTION
from domain.model import Fact
from domain.ports import Vector
from domain.reads import MemoryStamp
from store.read.dense_reads import IndexedRow, RowChanges
from store.read.keyword_index import KeywordIndex, Terms
from store.read.memory_entry import STATUS_CODES, MemoryVectors
from store.read.vector_rows import AppendOnlyMatrix

__all__ = ["Delta", "plan"]

# Postings of inserted rows held beside the spans, as a share of the spans', before the
# keyword index is rebuilt from all the rows' terms.
_ADDED_POSTINGS_SHARE = 0.25
_T = TypeVar("_T")


@dataclass(frozen=True)
class Delta:
    """The rows written since an entry's snapshot: those it holds (with their row in it) and
    the new ones, in fact-id order."""

    entry: MemoryVectors
    changes: RowChanges
    held: tuple[tuple[int, IndexedRow], ...]
    new: tuple[IndexedRow, ...]

    def to_read(self) -> list[uuid.UUID]:
        """The facts whose row and terms must be read: new, or at a new version."""
        versions = self.entry.fact_versions
        changed = [r.fact_id for at, r in self.held if versions[at] != r.version]
        return changed + [r.fact_id for r in self.new]

    def to_fetch(self) -> list[uuid.UUID]:
        """The facts whose vector must come from the index: indexed, and not held in the
        matrix at this version."""
        return [r.fact_id for at, r in self.held if r.indexed and not self._kept(at, r)] + [
            r.fact_id for r in self.new if r.indexed
        ]

    def _kept(self, at: int, row: IndexedRow) -> bool:
        entry = self.entry
        return bool(entry.vectored[at]) and int(entry.fact_versions[at]) == row.version

    def apply(
        self,
        stamp: MemoryStamp,
        details: Mapping[uuid.UUID, tuple[Fact, Terms]],
        vectors: Mapping[uuid.UUID, Vector],
    ) -> MemoryVectors | None:
        """The entry with these rows put in; None if a fact to read is gone (deleted since
        the changes were read): the caller builds from all the rows then."""
        if any(fact_id not in details for fact_id in self.to_read()):
            return None
        entry = self.entry
        versions = entry.fact_versions.copy()
        statuses = entry.statuses.copy()
        context_types = entry.context_types.copy()
        vectored = entry.vectored.copy()
        connections: dict[int, str] = {}
        facts, terms = list(entry.facts), list(entry.terms)
        pending = dict(entry.pending)
        rewritten: dict[int, Vector | None] = {}
        terms_changed = False
        text_bytes = entry.text_length
        for at, row in self.held:
            if int(versions[at]) != row.version:
                fact, fact_terms = details[row.fact_id]
                terms_changed |= fact_terms != terms[at]
                text_bytes += len(fact.content) - len(facts[at].content)
                facts[at], terms[at] = fact, fact_terms
            if not (row.indexed and self._kept(at, row)):
                vector = vectors.get(row.fact_id) if row.indexed else None
                rewritten[at] = vector
                vectored[at] = vector is not None
            versions[at] = row.version
            statuses[at] = STATUS_CODES[row.status]
            context_types[at] = row.context_type
            connections[at] = row.connection_id or NO_CONNECTION
            _note_pending(pending, row)

        new = self.new
        positions = [bisect_left(entry.ids, r.fact_id) for r in new]
        new_vectors = [vectors.get(r.fact_id) if r.indexed else None for r in new]
        new_terms = [details[r.fact_id][1] for r in new]
        new_facts = [details[r.fact_id][0] for r in new]
        text_bytes += sum(len(f.content) for f in new_facts)
        for row in new:
            _note_pending(pending, row)
        vectored = np.insert(vectored, positions, [v is not None for v in new_vectors])
        buffer, slots, extent = _vectors(entry, positions, new_vectors, rewritten, vectored)
        ids = _inserted(entry.ids, positions, [r.fact_id for r in new])
        all_terms = _inserted(terms, positions, new_terms)
        keywords = entry.keywords
        if terms_changed:
            keywords = KeywordIndex(all_terms)
        elif new:
            keywords = _with_inserted(keywords, positions, new_terms, all_terms)
        connection_column = _text_column(
            entry.connections,
            connections,
            positions,
            [r.connection_id or NO_CONNECTION for r in new],
        )
        return MemoryVectors(
            stamp=stamp,
            ids=ids,
            fact_versions=np.insert(versions, positions, [r.version for r in new]),
            vectors=buffer,
            slots=slots,
            extent=extent,
            vectored=vectored,
            connections=connection_column,
            statuses=np.insert(statuses, positions, [STATUS_CODES[r.status] for r in new]),
            context_types=np.insert(context_types, positions, [r.context_type for r in new]),
            row_of=_row_of(entry, ids, positions),
            pending=pending,
            terms=all_terms,
            keywords=keywords,
            facts=_inserted(facts, positions, new_facts),
            snapshot=self.changes.snapshot,
            text_bytes=text_bytes,
        )


def plan(entry: MemoryVectors, changes: RowChanges) -> Delta | None:
    """The delta from the entry to these changes; None when a fact was deleted since (the
    memory has fewer rows than the entry's and the new ones)."""
    held: list[tuple[int, IndexedRow]] = []
    new: list[IndexedRow] = []
    for row in changes.rows:
        at = entry.row_of.get(row.fact_id)
        if at is None:
            new.append(row)
        else:
            held.append((at, row))
    if changes.total != len(entry.ids) + len(new):
        return None
    return Delta(entry, changes, tuple(held), tuple(new))


def _vectors(
    entry: MemoryVectors,
    positions: Sequence[int],
    new: Sequence[Vector | None],
    rewritten: Mapping[int, Vector | None],
    vectored: npt.NDArray[np.bool_],
) -> tuple[AppendOnlyMatrix, npt.NDArray[np.int64], int]:
    """The buffer, slots and extent of the next version: the new rows' vectors and the
    rewritten ones appended (`store.read.vector_rows`), the others where they were."""
    slots = np.insert(entry.slots, positions, 0)
    moved = np.searchsorted(np.asarray(positions, dtype=np.int64), list(rewritten), "right")
    writes = [
        (at + shift, vector)
        for (at, vector), shift in zip(rewritten.items(), moved.tolist(), strict=True)
        if vector is not None
    ]
    writes += [
        (p + k, v) for k, (p, v) in enumerate(zip(positions, new, strict=True)) if v is not None
    ]
    if not writes:
        return entry.vectors, slots, entry.extent
    live = vectored.copy()
    live[[row for row, _ in writes]] = False
    return entry.vectors.appended(slots, live, entry.extent, writes)


def _with_inserted(
    keywords: KeywordIndex,
    positions: Sequence[int],
    new_terms: Sequence[Terms],
    all_terms: Sequence[Terms],
) -> KeywordIndex:
    grown = keywords.with_rows_inserted(positions, new_terms)
    return KeywordIndex(all_terms) if grown.added_share > _ADDED_POSTINGS_SHARE else grown


def _text_column(
    column: npt.NDArray[np.str_],
    changed: Mapping[int, str],
    positions: Sequence[int],
    inserted: Sequence[str],
) -> npt.NDArray[np.str_]:
    """The column with rows changed and rows inserted, widened if a new text is longer than
    its width allows (numpy would cut it)."""
    width = max((len(t) for t in (*changed.values(), *inserted)), default=0)
    if width > column.dtype.itemsize // np.dtype("U1").itemsize:
        column = column.astype(f"<U{width}")
    elif changed:
        column = column.copy()
    for at, text in changed.items():
        column[at] = text
    return np.insert(column, positions, inserted) if inserted else column


def _row_of(
    entry: MemoryVectors, ids: Sequence[uuid.UUID], positions: Sequence[int]
) -> Mapping[uuid.UUID, int]:
    """The row of each fact id: the entry's, with the rows from the first insertion on
    renumbered (a copy of a dict keeps its hashes; a uuid's is computed in Python)."""
    if not positions:
        return entry.row_of
    row_of = dict(entry.row_of)
    for row in range(positions[0], len(ids)):
        row_of[ids[row]] = row
    return row_of


def _note_pending(pending: dict[uuid.UUID, int], row: IndexedRow) -> None:
    if row.indexed:
        pending.pop(row.fact_id, None)
    else:
        pending[row.fact_id] = row.version


def _inserted(old: Sequence[_T], positions: Sequence[int], values: Sequence[_T]) -> tuple[_T, ...]:
    """`old` with each value put before the item at its position (positions ascending)."""
    if not values:
        return tuple(old)
    out: list[_T] = []
    start = 0
    for position, value in zip(positions, values, strict=True):
        out.extend(old[start:position])
        out.append(value)
        start = position
    out.extend(old[start:])
    return tuple(out)
