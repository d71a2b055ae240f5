"""`ReadModel` in memory: the behaviour of `store.read.fact_queries` over an `InMemoryDatabase`.

The keyword search stands in for Postgres full text search with plain words: lower-cased, the
commonest English words dropped, no stemming, ranked by Okapi BM25 over the facts in scope as
`store.read.fact_queries` ranks them.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.reads import ContextLogRow, FactCounters, Injection, MemoryStamp, Scope
from store.inmemory.database import InMemoryDatabase
from store.read.fact_queries import BM25_B, BM25_K1

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "did", "do", "does", "for", "from",
    "had", "has", "have", "he", "her", "his", "i", "if", "in", "into", "is", "it", "its", "me",
    "my", "no", "not", "of", "on", "or", "our", "she", "so", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "to", "was", "we", "were", "what", "when", "where",
    "which", "who", "why", "will", "with", "you", "your",
})  # fmt: skip


def words(text: str) -> frozenset[str]:
    return frozenset(_tokens(text))


def _tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS]


def _bm25(query: frozenset[str], docs: Sequence[Sequence[str]]) -> list[float]:
    """Okapi BM25 of each doc, with the frequencies of `docs` (one memory), as the Postgres
    query computes it."""
    if not docs:
        return []
    avgdl = max(sum(len(d) for d in docs) / len(docs), 1.0)
    df = {w: sum(1 for d in docs if w in d) for w in query}
    idf = {w: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for w, n in df.items()}
    scores = []
    for doc in docs:
        norm = BM25_K1 * (1 - BM25_B + BM25_B * len(doc) / avgdl)
        tf = {w: doc.count(w) for w in query}
        scores.append(sum(idf[w] * tf[w] * (BM25_K1 + 1) / (tf[w] + norm) for w in query if tf[w]))
    return scores


class InMemoryReadModel:
    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db

    # -- injection ------------------------------------------------------------------------

    def memory_stamp(self, key: MemoryKey) -> MemoryStamp | None:
        with self._db.lock:
            state = self._db.memory.get(key)
            return None if state is None else MemoryStamp(self._db.generations[key], state.version)

    def memory_stamps(self, keys: Sequence[MemoryKey]) -> dict[MemoryKey, MemoryStamp]:
        found = {k: self.memory_stamp(k) for k in keys}
        return {k: stamp for k, stamp in found.items() if stamp is not None}

    def injection(self, key: MemoryKey) -> Injection | None:
        with self._db.lock:
            state = self._db.memory.get(key)
            if state is None:
                return None
            connections = {
                c: info for (k, c), info in sorted(self._db.connections.items()) if k == key
            }
            pinned = tuple(
                # Postgres hands pinned facts over as JSON, which does not carry indexed_at.
                replace(f, indexed_at=None)
                for f in self._db.user_facts(key)
                if f.pinned and f.status is FactStatus.ACTIVE
            )
            generation = self._db.generations[key]
        return Injection(state, connections, pinned, generation)

    # -- retrieval ------------------------------------------------------------------------

    def keyword_searches(
        self, searches: Sequence[tuple[Scope, str]], limit: int
    ) -> list[list[Fact]]:
        return [self.keyword_search(scope, text, limit) for scope, text in searches]

    def keyword_search(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        wanted = words(text)
        if limit <= 0 or not wanted:
            return []
        with self._db.lock:
            scoped = [(f, _tokens(f.content)) for f in self._db.facts.values() if scope.admits(f)]
        scores = _bm25(wanted, [tokens for _, tokens in scoped])
        ranked = sorted(
            ((score, f) for score, (f, _) in zip(scores, scoped, strict=True) if score > 0),
            key=lambda m: (-m[0], m[1].fact_id),
        )
        return [f for _, f in ranked[:limit]]

    def indexed_ids(self, scope: Scope, limit: int) -> list[uuid.UUID]:
        with self._db.lock:
            ids = sorted(
                f.fact_id
                for f in self._db.facts.values()
                if f.indexed_at is not None and scope.admits(f)
            )
        return ids[: max(limit, 0)]

    def facts_in_scope(self, scope: Scope, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        with self._db.lock:
            found = (self._db.facts.get(i) for i in dict.fromkeys(fact_ids))
            return [f for f in found if f is not None and scope.admits(f)]

    def fact_counters(
        self, scope: Scope, fact_ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, FactCounters]:
        return {
            f.fact_id: FactCounters(f.version, f.recall_count, f.last_recalled_at)
            for f in self.facts_in_scope(scope, fact_ids)
        }

    # -- off the hot path -----------------------------------------------------------------

    def write_context_logs(self, rows: Sequence[ContextLogRow]) -> None:
        """Only rows of the memory the turn read, as the Postgres one; a row's recalls are
        counted when the row is first written."""
        with self._db.lock:
            for row in rows:
                key = MemoryKey(row.organization_id, row.user_id)
                current = row.generation is None or self._db.generations.get(key) == row.generation
                if key in self._db.erasing or not current or row.log_id in self._db.context_logs:
                    continue
                self._db.context_logs[row.log_id] = row
                self._count_recalls(row)

    def _count_recalls(self, row: ContextLogRow) -> None:
        for fact_id in row.recalled:
            fact = self._db.facts.get(fact_id)
            if fact is None:
                continue  # gone since: skipped, as the Postgres update skips it
            last = fact.last_recalled_at
            self._db.facts[fact_id] = replace(
                fact,
                recall_count=fact.recall_count + 1,
                last_recalled_at=row.created_at if last is None else max(last, row.created_at),
            )

    # -- inspection -----------------------------------------------------------------------

    def context_logs(self, key: MemoryKey, limit: int | None = 100) -> list[dict[str, Any]]:
        """The memory's audit rows as column → value, newest first (as the Postgres one)."""
        with self._db.lock:
            rows = [
                asdict(r)
                for r in self._db.context_logs.values()
                if (r.organization_id, r.user_id) == (key.organization_id, key.user_id)
            ]
        rows.sort(key=lambda r: r["created_at"], reverse=True)
        return rows[:limit]
