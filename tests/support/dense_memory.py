"""A memory's rows as the dense stage reads them from Postgres, held in a dict: writes are
numbered so that `changes` since a snapshot can be answered, and reads are counted."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Vector
from domain.reads import MemoryStamp, Scope
from store.read.dense import DenseSearch
from store.read.dense_reads import IndexedRow, MemoryRows, RowChanges
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
    """The memory's rows as Postgres would give them, and counts of what was read. A write
    is numbered; a snapshot is the number of the last write it sees."""

    facts: dict[uuid.UUID, Fact] = field(default_factory=dict)
    versions: dict[uuid.UUID, int] = field(default_factory=dict)
    indexed: set[uuid.UUID] = field(default_factory=set)
    details_read: list[uuid.UUID] = field(default_factory=list)
    vectors_read: list[uuid.UUID] = field(default_factory=list)
    written: dict[uuid.UUID, int] = field(default_factory=dict)
    statuses: dict[uuid.UUID, FactStatus] = field(default_factory=dict)
    connections: dict[uuid.UUID, str] = field(default_factory=dict)
    rows_read: int = 0
    writes: int = 0

    def add(self, content: str, *, indexed: bool = True, version: int = 1) -> Fact:
        """A new fact; one whose id is stored already is left as it is, as Postgres's insert
        of new facts does (and a stored fact's version never goes back)."""
        fact = make_fact(KEY.user_id, content, org=KEY.organization_id)
        if fact.fact_id in self.facts:
            return self.facts[fact.fact_id]
        self.facts[fact.fact_id] = fact
        self.versions[fact.fact_id] = version
        if indexed:
            self.indexed.add(fact.fact_id)
        self.wrote(fact.fact_id)
        return fact

    def wrote(self, fact_id: uuid.UUID) -> None:
        self.writes += 1
        self.written[fact_id] = self.writes

    def rewrite(
        self,
        fact_id: uuid.UUID,
        *,
        content: str | None = None,
        status: FactStatus | None = None,
        connection: str | None = None,
    ) -> None:
        """A run's new version of the fact: pending until `index`."""
        if content is not None:
            self.facts[fact_id] = replace(self.facts[fact_id], content=content)
        if status is not None:
            self.statuses[fact_id] = status
        if connection is not None:
            self.connections[fact_id] = connection
        self.versions[fact_id] += 1
        self.indexed.discard(fact_id)
        self.wrote(fact_id)

    def index(self, fact_id: uuid.UUID) -> None:
        self.indexed.add(fact_id)
        self.wrote(fact_id)

    def delete(self, fact_id: uuid.UUID) -> None:
        del self.facts[fact_id], self.versions[fact_id], self.written[fact_id]
        self.indexed.discard(fact_id)

    def _row(self, i: uuid.UUID) -> IndexedRow:
        status = self.statuses.get(i, FactStatus.ACTIVE)
        return IndexedRow(
            i, self.versions[i], self.connections.get(i), status, "fact", i in self.indexed
        )

    def _snapshot(self) -> str:
        return str(self.writes)

    # DenseReads
    def rows(self, key: MemoryKey) -> MemoryRows:
        self.rows_read += 1
        return MemoryRows([self._row(i) for i in sorted(self.facts, key=str)], self._snapshot())

    def changes(self, key: MemoryKey, since: str) -> RowChanges:
        changed = [i for i in sorted(self.facts, key=str) if self.written[i] > int(since)]
        return RowChanges([self._row(i) for i in changed], len(self.facts), self._snapshot())

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

    def rows(self, key: MemoryKey) -> MemoryRows:
        return self.memory.rows(key)

    def changes(self, key: MemoryKey, since: str) -> RowChanges:
        return self.memory.changes(key, since)

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
