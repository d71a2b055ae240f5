"""Building a memory's entry at a new stamp from the one before: what is reused and read."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Vector
from domain.reads import MemoryStamp, Scope
from store.read.dense import DenseSearch, IndexedRow
from store.read.keyword_index import Terms
from store.read.memory_entry import DenseCache
from tests.support.builders import make_fact

KEY = MemoryKey("org-a", "ada")
GENERATION = uuid.UUID(int=1)
SCOPE = Scope(KEY, (), (FactStatus.ACTIVE,))


def vector_of(text: str) -> Vector:
    v = np.zeros(8, dtype=np.float32)
    v[sum(map(ord, text)) % 8] = 1.0
    return v


@dataclass
class Memory:
    """The memory's rows as Postgres would give them, and counts of what was read."""

    facts: dict[uuid.UUID, Fact] = field(default_factory=dict)
    versions: dict[uuid.UUID, int] = field(default_factory=dict)
    indexed: set[uuid.UUID] = field(default_factory=set)
    details_read: list[uuid.UUID] = field(default_factory=list)
    vectors_read: list[uuid.UUID] = field(default_factory=list)

    def add(self, content: str, *, indexed: bool = True, version: int = 1) -> Fact:
        fact = make_fact(KEY.user_id, content, org=KEY.organization_id)
        self.facts[fact.fact_id] = fact
        self.versions[fact.fact_id] = version
        if indexed:
            self.indexed.add(fact.fact_id)
        return fact

    # DenseReads
    def rows(self, key: MemoryKey) -> list[IndexedRow]:
        return [
            IndexedRow(i, self.versions[i], None, FactStatus.ACTIVE, "fact", i in self.indexed)
            for i in sorted(self.facts, key=str)
        ]

    def details(
        self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Fact, Terms]]:
        self.details_read += fact_ids
        out = {}
        for i in fact_ids:
            words = tuple(sorted(set(self.facts[i].content.lower().split())))
            out[i] = (self.facts[i], Terms(words, tuple(1 for _ in words)))
        return out

    def indexed_now(self, versions: Mapping[uuid.UUID, int]) -> set[uuid.UUID]:
        return {i for i in versions if i in self.indexed}

    def query_lexemes(self, text: str) -> list[str]:
        return text.lower().split()

    # VectorSource
    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        self.vectors_read += fact_ids
        return {i: vector_of(self.facts[i].content) for i in fact_ids if i in self.indexed}


class Reads:
    def __init__(self, memory: Memory) -> None:
        self.memory = memory

    def rows(self, key: MemoryKey) -> list[IndexedRow]:
        return self.memory.rows(key)

    def details(
        self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, tuple[Fact, Terms]]:
        return self.memory.details(key, fact_ids)

    def indexed(self, versions: Mapping[uuid.UUID, int]) -> set[uuid.UUID]:
        return self.memory.indexed_now(versions)

    def query_lexemes(self, text: str) -> list[str]:
        return self.memory.query_lexemes(text)


class Model:
    dimension = 8
    model_name = "test"

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        return [vector_of(t) for t in texts]


def search_over(memory: Memory) -> DenseSearch:
    return DenseSearch(Reads(memory), memory, Model(), DenseCache(2**24))


def stamp(version: int, generation: uuid.UUID = GENERATION) -> MemoryStamp:
    return MemoryStamp(generation, version)


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
    memory.indexed.add(pending.fact_id)  # the indexer got to it
    del memory.facts[bees.fact_id], memory.versions[bees.fact_id]
    entry = search.memory(KEY, stamp(2))

    assert set(memory.details_read) == {new.fact_id, tea.fact_id}
    assert set(memory.vectors_read) == {new.fact_id, tea.fact_id, pending.fact_id}
    assert list(entry.ids) == sorted(entry.ids, key=str)
    assert set(entry.ids) == {tea.fact_id, pending.fact_id, new.fact_id}
    assert bool(entry.vectored.all())
    for fact_id in entry.ids:
        row = entry.row_of[fact_id]
        assert entry.facts[row].fact_id == fact_id
        assert np.array_equal(entry.matrix[row], vector_of(memory.facts[fact_id].content))
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
