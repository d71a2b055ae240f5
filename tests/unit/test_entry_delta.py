"""A memory's entry at a new version from the rows written since its snapshot: the same entry
a build from all the rows gives, at a fraction of the reads."""

from __future__ import annotations

import uuid

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.model import FactStatus
from domain.reads import Scope
from store.read.memory_entry import MemoryVectors
from tests.support.dense_memory import KEY, Memory, search_over, stamp, vector_of

WORDS = ["bees", "roof", "tea", "green", "cello", "ledger", "postgres", "school", "honey"]
QUERIES = ["bees on the roof", "green tea", "postgres ledger honey", "cello school", "volcano"]
SCOPES = [
    Scope(KEY, (), (FactStatus.ACTIVE,)),
    Scope(KEY, ("gh",), (FactStatus.ACTIVE, FactStatus.HELD)),
]


def fresh_entry(memory: Memory, version: int) -> MemoryVectors:
    """The entry a process with nothing cached builds from all the rows."""
    return search_over(memory).memory(KEY, stamp(version))


def assert_same_entry(memory: Memory, got: MemoryVectors, want: MemoryVectors) -> None:
    assert got.ids == want.ids
    assert got.stamp == want.stamp
    assert np.array_equal(got.fact_versions, want.fact_versions)
    assert np.array_equal(got.vectored, want.vectored)
    for row in np.flatnonzero(want.vectored).tolist():
        assert np.array_equal(got.vector(row), want.vector(row))
    assert got.connections.tolist() == want.connections.tolist()
    assert np.array_equal(got.statuses, want.statuses)
    assert got.context_types.tolist() == want.context_types.tolist()
    assert dict(got.row_of) == dict(want.row_of)
    assert dict(got.pending) == dict(want.pending)
    assert got.terms == want.terms
    assert got.facts == want.facts
    assert got.nbytes - got.vectors.nbytes == want.nbytes - want.vectors.nbytes
    search = search_over(memory)
    for scope in SCOPES:
        for query in QUERIES:
            assert search.keyword_in(got, scope, query, 4) == search.keyword_in(
                want, scope, query, 4
            )
            vector = vector_of(query)
            assert search.nearest(got, scope, vector, 4) == search.nearest(want, scope, vector, 4)


def test_a_runs_changes_are_put_in_without_reading_every_row() -> None:
    memory = Memory()
    facts = [memory.add(f"{WORDS[i % 9]} {WORDS[(i * 4) % 9]} fact {i}") for i in range(40)]
    pending = memory.add("plays the cello", indexed=False)
    search = search_over(memory)
    search.memory(KEY, stamp(1))
    memory.details_read.clear()
    memory.vectors_read.clear()

    new = [memory.add(f"drinks green tea on roof {i}", indexed=i == 0) for i in range(3)]
    memory.rewrite(facts[7].fact_id, status=FactStatus.CONTRADICTED)
    memory.rewrite(facts[9].fact_id, content="keeps bees and sells honey")
    memory.index(facts[9].fact_id)
    memory.index(pending.fact_id)
    entry = search.memory(KEY, stamp(2))

    assert memory.rows_read == 1  # the first build only
    assert set(memory.details_read) == {f.fact_id for f in new} | {
        facts[7].fact_id,
        facts[9].fact_id,
    }
    assert set(memory.vectors_read) == {new[0].fact_id, facts[9].fact_id, pending.fact_id}
    assert entry.pending == {new[1].fact_id: 1, new[2].fact_id: 1, facts[7].fact_id: 2}
    assert_same_entry(memory, entry, fresh_entry(memory, 2))


def test_a_deleted_fact_makes_the_next_version_read_every_row() -> None:
    memory = Memory()
    kept = memory.add("keeps bees on the roof")
    gone = memory.add("drinks green tea")
    search = search_over(memory)
    search.memory(KEY, stamp(1))
    memory.delete(gone.fact_id)
    memory.add("plays the cello")
    entry = search.memory(KEY, stamp(2))
    assert memory.rows_read == 2
    assert gone.fact_id not in entry.row_of
    assert kept.fact_id in entry.row_of
    assert_same_entry(memory, entry, fresh_entry(memory, 2))


def test_an_entry_with_nothing_changed_shares_its_arrays() -> None:
    memory = Memory()
    memory.add("keeps bees on the roof")
    search = search_over(memory)
    first = search.memory(KEY, stamp(1))
    second = search.memory(KEY, stamp(2))
    assert second.stamp == stamp(2)
    assert second.vectors is first.vectors
    assert second.keywords is first.keywords
    assert memory.rows_read == 1


_OPERATION = st.tuples(
    st.sampled_from(["add", "add_pending", "rewrite", "retext", "index", "status", "connect"]),
    st.integers(0, 10_000),
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_OPERATION, max_size=6), min_size=1, max_size=8))
def test_every_version_equals_a_build_from_all_the_rows(
    versions: list[list[tuple[str, int, list[str]]]],
) -> None:
    """Random runs (new facts indexed or pending, new versions, new texts, the indexer's
    marks, status and connection changes) between versions; each entry built on the one
    before equals the entry built from nothing, row for row and search for search."""
    memory = Memory()
    for i in range(12):
        memory.add(f"{WORDS[i % 9]} {WORDS[(i * 5) % 9]} fact {i}", indexed=i % 4 != 0)
    search = search_over(memory)
    search.memory(KEY, stamp(1))
    for version, operations in enumerate(versions, start=2):
        for operation, pick, words in operations:
            _apply(memory, operation, pick, " ".join(words))
        rows_read = memory.rows_read
        entry = search.memory(KEY, stamp(version))
        assert memory.rows_read == rows_read  # only the changes
        assert_same_entry(memory, entry, fresh_entry(memory, version))


def _apply(memory: Memory, operation: str, pick: int, text: str) -> None:
    ids = sorted(memory.facts, key=str)
    fact_id: uuid.UUID = ids[pick % len(ids)]
    if operation in ("add", "add_pending"):
        memory.add(f"{text} {pick}", indexed=operation == "add")
    elif operation == "rewrite":
        memory.rewrite(fact_id)
    elif operation == "retext":
        memory.rewrite(fact_id, content=f"{text} {pick}")
    elif operation == "index":
        memory.index(fact_id)
    elif operation == "status":
        memory.rewrite(fact_id, status=[FactStatus.HELD, FactStatus.ACTIVE][pick % 2])
    else:
        memory.rewrite(fact_id, connection="gh" if pick % 2 else "a-much-longer-connection")


def test_versions_that_outgrow_the_vector_buffer_keep_every_vector() -> None:
    memory = Memory()
    for i in range(10):
        memory.add(f"first fact {i}")
    search = search_over(memory)
    buffers = [search.memory(KEY, stamp(1)).vectors]
    for version in range(2, 32):
        for j in range(5):
            memory.add(f"fact {j} of run {version}", indexed=j % 2 == 0)
        entry = search.memory(KEY, stamp(version))
        buffers.append(entry.vectors)
    # The room ran out, and a larger buffer took the live rows.
    assert any(b is not buffers[0] for b in buffers)
    assert_same_entry(memory, entry, fresh_entry(memory, 31))
