"""`FactSearch` over facts held in memory: a shadow replay's image, unit tests.

Ranks like the live search (`store.read.candidate_search`): cosine over the embedder, when
one is given, and a keyword ranking, fused by reciprocal rank. The keyword side counts shared
content words, which only approximates Postgres full-text ranking: a replay of a live batch
shows the facts its run recorded, not a new search (`consumers.replay`).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from domain.ids import MemoryKey
from domain.model import Fact
from domain.ports import Embedder, FactQuery, RelatedFacts, Vector
from store.candidate_ranking import CONSOLIDATION_STATUSES, fuse, nearest_ids
from store.inmemory.database import InMemoryDatabase

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have",
        "he", "her", "his", "i", "in", "is", "it", "its", "me", "my", "not", "of", "on", "or",
        "our", "she", "so", "that", "the", "their", "them", "they", "this", "to", "was", "we",
        "were", "what", "when", "who", "will", "with", "you", "your", "user",
    }
)  # fmt: skip


def _words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS)


class InMemoryFactSearch:
    """`FactSearch` over facts in memory: cosine over the embedder (when given) and shared
    content words, fused like the live search. `facts` is read on every call, so it may be
    a live view (an `InMemoryDatabase`'s table) or a fixed image (a shadow replay's)."""

    def __init__(
        self, facts: Callable[[], Iterable[Fact]], embedder: Embedder | None = None
    ) -> None:
        self._facts = facts
        self._embedder = embedder

    @classmethod
    def over(cls, facts: Sequence[Fact], embedder: Embedder | None = None) -> InMemoryFactSearch:
        """A search over these facts, as they are now."""
        image = tuple(facts)
        return cls(lambda: image, embedder)

    @classmethod
    def of(cls, db: InMemoryDatabase, embedder: Embedder | None = None) -> InMemoryFactSearch:
        """A search over the facts the in-memory stores write."""

        def current() -> list[Fact]:
            with db.lock:
                return list(db.facts.values())

        return cls(current, embedder)

    def _owned(self, key: MemoryKey) -> list[Fact]:
        wanted = frozenset(CONSOLIDATION_STATUSES)
        owned = [f for f in self._facts() if f.key == key and f.status in wanted]
        return sorted(owned, key=lambda f: str(f.fact_id))

    def related(self, key: MemoryKey, queries: Sequence[FactQuery], limit: int) -> RelatedFacts:
        owned = self._owned(key)
        vectors = self._vectors(owned, queries)
        ranked = []
        for n, query in enumerate(queries):
            scoped = [
                i
                for i, f in enumerate(owned)
                if f.provenance.connection_id in (None, query.connection_id)
            ]
            dense: list[uuid.UUID] = []
            if vectors is not None and scoped and limit > 0:
                facts, queried = vectors
                stored = {owned[i].fact_id: facts[i] for i in scoped}
                dense = nearest_ids(stored, queried[n], limit)
            ranked.append(tuple(self._pick(owned, scoped, query.text, dense, limit)))
        return RelatedFacts(tuple(ranked))

    def _vectors(
        self, owned: Sequence[Fact], queries: Sequence[FactQuery]
    ) -> tuple[np.ndarray[Any, Any], list[Vector]] | None:
        if self._embedder is None or not owned or not queries:
            return None
        facts = np.stack(self._embedder.embed([f.content for f in owned]))
        return facts, self._embedder.embed([q.text for q in queries])

    @staticmethod
    def _pick(
        owned: Sequence[Fact],
        scoped: Sequence[int],
        text: str,
        dense: Sequence[uuid.UUID],
        limit: int,
    ) -> list[Fact]:
        words = _words(text)
        overlap = {owned[i].fact_id: len(words & _words(owned[i].content)) for i in scoped}
        keyword = sorted((k for k, v in overlap.items() if v), key=lambda k: (-overlap[k], str(k)))
        by_id = {owned[i].fact_id: owned[i] for i in scoped}
        return [by_id[i] for i in fuse(dense, keyword[:limit], limit)]

    def pinned(self, key: MemoryKey) -> list[Fact]:
        pinned = [f for f in self._owned(key) if f.pinned]
        return sorted(pinned, key=lambda f: (f.created_at, str(f.fact_id)))

    def by_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        wanted = set(fact_ids)
        return [f for f in self._owned(key) if f.fact_id in wanted]

    def count(self, key: MemoryKey) -> int:
        return len(self._owned(key))
