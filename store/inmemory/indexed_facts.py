"""`IndexedFacts` in memory: the behaviour of `store.write.indexed_facts`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from domain.model import Fact
from store.inmemory.database import InMemoryDatabase


class InMemoryIndexedFacts:
    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db

    def indexed_after(self, after: uuid.UUID | None, limit: int) -> list[Fact]:
        with self._db.lock:
            facts = [
                f
                for f in self._db.facts.values()
                if f.indexed_at is not None and (after is None or f.fact_id > after)
            ]
        return sorted(facts, key=lambda f: f.fact_id)[:limit]

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        # The database's lock stands for the rows' locks: no write lands while `write` runs.
        with self._db.lock:
            facts = sorted(
                (
                    f
                    for i in set(fact_ids)
                    if (f := self._db.facts.get(i)) is not None and f.indexed_at is not None
                ),
                key=lambda f: f.fact_id,
            )
            if facts:
                write(facts)
        return facts

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        with self._db.lock:
            return [i for i in fact_ids if i not in self._db.facts]
