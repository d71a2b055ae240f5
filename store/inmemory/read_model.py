"""`ReadModel` in memory: the behaviour of `store.read.fact_queries` over an `InMemoryDatabase`.

The keyword search stands in for Postgres full text search with plain words: lower-cased, the
commonest English words dropped, no stemming. A fact matching more of the query's words ranks
higher, as `ts_rank_cd` ranks an OR query.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from domain.model import Fact, FactStatus
from domain.reads import ContextLogRow, Injection, Recall, Scope
from store.inmemory.database import InMemoryDatabase

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "did", "do", "does", "for", "from",
    "had", "has", "have", "he", "her", "his", "i", "if", "in", "into", "is", "it", "its", "me",
    "my", "no", "not", "of", "on", "or", "our", "she", "so", "that", "the", "their", "them",
    "then", "there", "these", "they", "this", "to", "was", "we", "were", "what", "when", "where",
    "which", "who", "why", "will", "with", "you", "your",
})  # fmt: skip


def words(text: str) -> frozenset[str]:
    return frozenset(w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS)


class InMemoryReadModel:
    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db

    # -- injection ------------------------------------------------------------------------

    def memory_version(self, user_id: str) -> int | None:
        with self._db.lock:
            state = self._db.memory.get(user_id)
        return None if state is None else state.version

    def injection(self, user_id: str) -> Injection | None:
        with self._db.lock:
            state = self._db.memory.get(user_id)
            if state is None:
                return None
            connections = {
                c: info for (u, c), info in sorted(self._db.connections.items()) if u == user_id
            }
            pinned = tuple(
                # Postgres hands pinned facts over as JSON, which does not carry indexed_at.
                replace(f, indexed_at=None)
                for f in self._db.user_facts(user_id)
                if f.pinned and f.status is FactStatus.ACTIVE
            )
        return Injection(state=state, connections=connections, pinned=pinned)

    # -- retrieval ------------------------------------------------------------------------

    def keyword_search(self, scope: Scope, text: str, limit: int) -> list[Fact]:
        wanted = words(text)
        if limit <= 0 or not wanted:
            return []
        with self._db.lock:
            matches = [
                (len(wanted & words(f.content)), f)
                for f in self._db.facts.values()
                if scope.admits(f)
            ]
        ranked = sorted((m for m in matches if m[0]), key=lambda m: (-m[0], m[1].fact_id))
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

    # -- off the hot path -----------------------------------------------------------------

    def record_recalls(self, recalls: Sequence[Recall]) -> None:
        with self._db.lock:
            for recall in recalls:
                fact = self._db.facts.get(recall.fact_id)
                if fact is None:
                    continue  # gone since: skipped, as the Postgres update skips it
                last = fact.last_recalled_at
                self._db.facts[fact.fact_id] = replace(
                    fact,
                    recall_count=fact.recall_count + 1,
                    last_recalled_at=recall.at if last is None else max(last, recall.at),
                )

    def write_context_logs(self, rows: Sequence[ContextLogRow]) -> None:
        with self._db.lock:
            for row in rows:
                self._db.context_logs.setdefault(row.log_id, row)

    # -- inspection -----------------------------------------------------------------------

    def context_logs(self, user_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """The user's audit rows as column → value, newest first (as the Postgres one)."""
        with self._db.lock:
            rows = [asdict(r) for r in self._db.context_logs.values() if r.user_id == user_id]
        rows.sort(key=lambda r: r["created_at"], reverse=True)
        return rows[:limit]
