"""`VectorIndex` in memory: exact cosine search over the facts' vectors, Chroma's behaviour
(idempotent upserts that embed only new text, status updates that skip unknown ids, the same
scoping and metadata) without a Chroma."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from domain.codec import fact_metadata
from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import Embedder, StoredFact, Vector, VectorHit
from domain.reads import Scope
from store.exact_search import nearest


@dataclass(frozen=True)
class _Entry:
    fact: Fact
    vector: Vector


class InMemoryVectorIndex:
    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._entries: dict[uuid.UUID, _Entry] = {}
        self._lock = threading.Lock()

    def upsert(self, facts: Sequence[Fact]) -> int:
        by_id = {f.fact_id: f for f in facts}  # the last occurrence of an id wins
        with self._lock:
            fresh = [
                f
                for f in by_id.values()
                if f.fact_id not in self._entries
                or self._entries[f.fact_id].fact.content != f.content
            ]
        vectors = dict(
            zip(
                [f.fact_id for f in fresh],
                self._embedder.embed([f.content for f in fresh]) if fresh else [],
                strict=True,
            )
        )
        with self._lock:
            for fact in by_id.values():
                vector = vectors.get(fact.fact_id)
                if vector is None:
                    vector = self._entries[fact.fact_id].vector
                self._entries[fact.fact_id] = _Entry(fact, vector)
        return len(fresh)

    def update_status(self, statuses: Mapping[uuid.UUID, FactStatus]) -> None:
        with self._lock:
            for fact_id, status in statuses.items():
                entry = self._entries.get(fact_id)
                if entry is not None:
                    self._entries[fact_id] = replace(entry, fact=replace(entry.fact, status=status))

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        if n <= 0 or not scope.statuses:
            return []
        with self._lock:
            candidates = [e for e in self._entries.values() if scope.admits(e.fact)]
        if not candidates:
            return []
        (query,) = self._embedder.embed([text])
        scored = [(float(e.vector @ query), e.fact) for e in candidates]
        scored.sort(key=lambda s: (-s[0], s[1].fact_id))
        return [
            VectorHit(fact.fact_id, similarity, fact.content, fact_metadata(fact))
            for similarity, fact in scored[:n]
        ]

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        with self._lock:
            return {i: self._entries[i].vector for i in fact_ids if i in self._entries}

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        with self._lock:
            entries = {i: self._entries[i].fact for i in fact_ids if i in self._entries}
        return {i: StoredFact(f.content, fact_metadata(f)) for i, f in entries.items()}

    def ids_page(self, offset: int, limit: int) -> list[str]:
        with self._lock:
            return [str(i) for i in list(self._entries)[offset : offset + limit]]

    def score(
        self, text: str, fact_ids: Sequence[uuid.UUID], n: int
    ) -> tuple[list[VectorHit], dict[uuid.UUID, Vector]]:
        if n <= 0 or not fact_ids:
            return [], {}
        stored = self.embeddings(fact_ids)
        if not stored:
            return [], {}
        (query,) = self._embedder.embed([text])
        return nearest(query, stored, n), stored

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None:
        with self._lock:
            for fact_id in fact_ids:
                self._entries.pop(fact_id, None)

    def delete_memory(self, key: MemoryKey) -> None:
        with self._lock:
            for fact_id in [i for i, e in self._entries.items() if e.fact.key == key]:
                del self._entries[fact_id]

    def count(self, key: MemoryKey | None = None) -> int:
        with self._lock:
            return sum(1 for e in self._entries.values() if key in (None, e.fact.key))
