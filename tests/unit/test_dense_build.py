"""Building a memory's entry at a new stamp from the one before: what is reused and read."""

from __future__ import annotations

import uuid

import numpy as np

from tests.support.dense_memory import KEY, SCOPE, Memory, search_over, stamp, vector_of


def test_a_new_version_reads_only_the_facts_that_changed() -> None:
    memory = Memory()
    bees = memory.add("keeps bees on the roof")
    tea = memory.add("drinks green tea")
    pending = memory.add("plays the cello", indexed=False)
    search = search_over(memory)
    first = search.memory(KEY, stamp(1))
    assert sorted(memory.details_read, key=str) == sorted(first.ids, key=str)

    memory.details_read.clear()
    memory.vectors_read.clear()
    new = memory.add("runs on sundays")
    memory.versions[tea.fact_id] = 2  # a run rewrote it
    memory.wrote(tea.fact_id)
    memory.indexed.add(pending.fact_id)  # the indexer got to it
    memory.wrote(pending.fact_id)
    memory.delete(bees.fact_id)
    entry = search.memory(KEY, stamp(2))

    assert set(memory.details_read) == {new.fact_id, tea.fact_id}
    assert set(memory.vectors_read) == {new.fact_id, tea.fact_id, pending.fact_id}
    assert list(entry.ids) == sorted(entry.ids, key=str)
    assert set(entry.ids) == {tea.fact_id, pending.fact_id, new.fact_id}
    assert bool(entry.vectored.all())
    for fact_id in entry.ids:
        row = entry.row_of[fact_id]
        assert entry.facts[row].fact_id == fact_id
        assert np.array_equal(entry.vector(row), vector_of(memory.facts[fact_id].content))
    assert entry.pending == {}
    assert search.keyword_in(entry, SCOPE, "green tea", 3) == [tea.fact_id]


def test_an_entry_with_no_facts_is_built_on_at_the_next_version() -> None:
    memory = Memory()
    search = search_over(memory)
    assert search.memory(KEY, stamp(1)).ids == ()
    tea = memory.add("drinks green tea")
    entry = search.memory(KEY, stamp(2))
    assert entry.ids == (tea.fact_id,)
    assert bool(entry.vectored[0])


def test_a_new_generation_reads_everything_again() -> None:
    memory = Memory()
    memory.add("keeps bees on the roof")
    memory.add("drinks green tea")
    search = search_over(memory)
    search.memory(KEY, stamp(1))
    memory.details_read.clear()
    memory.vectors_read.clear()
    entry = search.memory(KEY, stamp(1, uuid.UUID(int=2)))
    assert sorted(memory.details_read, key=str) == sorted(entry.ids, key=str)
    assert sorted(memory.vectors_read, key=str) == sorted(entry.ids, key=str)
