"""The vectors shared by a memory's entry versions: a version writes only rows nobody else
holds, and an older version reads what it read before, whatever came after."""

from __future__ import annotations

import threading

import numpy as np

from domain.model import FactStatus
from domain.reads import MemoryStamp
from store.read import entry_delta
from store.read.dense_reads import IndexedRow, RowChanges
from store.read.vector_rows import AppendOnlyMatrix
from tests.support.dense_memory import KEY, Memory, search_over, stamp, vector_of


def unit(i: int) -> np.ndarray:
    v = np.zeros(4, dtype=np.float32)
    v[i % 4] = 1.0
    return v


def test_claims_never_overlap_across_threads() -> None:
    matrix = AppendOnlyMatrix(np.zeros((2, 4), dtype=np.float32))
    grown, _, _ = matrix.appended(
        np.arange(2, dtype=np.int64), np.ones(2, dtype=np.bool_), 2, [(0, unit(1))]
    )
    claims: list[int] = []
    lock = threading.Lock()

    def claim() -> None:
        for _ in range(200):
            start = grown.claim(1)
            if start is not None:
                with lock:
                    claims.append(start)

    workers = [threading.Thread(target=claim) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(claims) == len(set(claims)) == grown.rows.shape[0] - 3  # two kept, one written
    assert grown.claim(1) is None


def test_growth_copies_only_live_rows_and_leaves_the_old_buffer_alone() -> None:
    old = AppendOnlyMatrix(np.stack([unit(0), unit(1), unit(2)]))
    slots = np.array([2, 0, 1], dtype=np.int64)  # entry row -> buffer row
    live = np.array([True, False, True])  # row 1 is being rewritten
    grown, new_slots, extent = old.appended(slots.copy(), live, 3, [(1, unit(3))])
    assert grown is not old
    assert extent == 3
    assert np.array_equal(grown.rows[new_slots[0]], unit(2))
    assert np.array_equal(grown.rows[new_slots[1]], unit(3))
    assert np.array_equal(grown.rows[new_slots[2]], unit(1))
    assert np.array_equal(old.rows, np.stack([unit(0), unit(1), unit(2)]))


def test_two_versions_built_from_one_entry_keep_their_own_vectors() -> None:
    """The processor's candidate search and a turn may both bring one entry up to date at
    once, each from its own reading of the changes: each gets its vectors, and the entry they
    started from still reads its own."""
    memory = Memory()
    facts = [memory.add(f"fact number {i}") for i in range(30)]
    search = search_over(memory)
    search.memory(KEY, stamp(1))
    facts.append(memory.add("one more fact"))
    base = search.memory(KEY, stamp(2))
    before = [base.vector(r).copy() for r in range(len(base.ids))]
    new = [memory.add(f"new fact {i}") for i in range(2)]
    rows = [IndexedRow(f.fact_id, 1, None, FactStatus.ACTIVE, "fact", True) for f in new]
    versions = []
    for k, row in enumerate(rows):
        delta = entry_delta.plan(base, RowChanges([row], len(facts) + 1, str(100 + k)))
        assert delta is not None
        details = memory.details(KEY, delta.to_read())
        entry = delta.apply(MemoryStamp(None, 3 + k), details, memory.embeddings(delta.to_fetch()))
        assert entry is not None
        versions.append((entry, new[k]))
    for entry, fact in versions:
        row = entry.row_of[fact.fact_id]
        assert np.array_equal(entry.vector(row), vector_of(fact.content))
        for old in facts:
            assert np.array_equal(entry.vector(entry.row_of[old.fact_id]), vector_of(old.content))
    assert all(np.array_equal(base.vector(r), v) for r, v in enumerate(before))
