"""The read path of every chat turn: W, S, learned info and the facts relevant to the turn.

Postgres is the truth for a fact's status, so a fact contradicted after Chroma last saw it is
still never shown. With Chroma down the bundle still comes back, marked degraded, with W, S,
learned info and the pinned facts.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

from store.errors import VectorIndexUnavailable
from store.memory_store import PostgresMemoryStore
from store.records import Fact, FactStatus, normalize_content
from store.rendering import render_prompt_block
from store.vector_index import VectorHit, VectorIndex

RECENCY_HALF_LIFE_DAYS = 30.0


class Budget(StrEnum):
    LEAN = "lean"
    BALANCED = "balanced"
    DEEP = "deep"


TOP_N = {Budget.LEAN: 3, Budget.BALANCED: 6, Budget.DEEP: 12}


@dataclass(frozen=True)
class RetrievedFact:
    fact: Fact
    similarity: float
    score: float
    pinned: bool = False


@dataclass(frozen=True)
class ContextBundle:
    user_id: str
    memory_version: int
    working_memory: str
    scaffold: dict[str, Any]
    learned_info: tuple[str, ...]
    connection_info: dict[str, tuple[str, ...]]
    facts: tuple[RetrievedFact, ...]
    degraded: bool
    degraded_reason: str | None
    latency_ms: float
    prompt_block: str = field(default="")


def relevance(similarity: float, fact: Fact, now: datetime) -> float:
    """similarity × recency decay × weight of salience and confidence."""
    age_days = max(0.0, (now - fact.updated_at).total_seconds() / 86_400)
    recency = 0.5 ** (age_days / RECENCY_HALF_LIFE_DAYS)
    weight = 0.5 + 0.5 * fact.salience * fact.confidence
    return float(similarity * (0.7 + 0.3 * recency) * weight)


class ContextService:
    def __init__(
        self,
        store: PostgresMemoryStore,
        index: VectorIndex,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._index = index
        self._clock = clock

    def assemble(
        self,
        user_id: str,
        query: str,
        active_connection_ids: Sequence[str] = (),
        budget: Budget = Budget.BALANCED,
    ) -> ContextBundle:
        started = time.perf_counter()
        state = self._store.load_state(user_id)
        connections = self._store.connections(user_id, active_connection_ids)
        pinned = [
            f
            for f in self._store.facts(user_id)
            if f.pinned and _in_scope(f, active_connection_ids)
        ]
        degraded_reason: str | None = None
        try:
            hits = self._index.query(
                user_id=user_id,
                text=query,
                connection_ids=list(active_connection_ids),
                n=TOP_N[budget] * 3,
            )
        except VectorIndexUnavailable as e:
            hits, degraded_reason = [], f"vector index unavailable: {e}"
        retrieved = self._rank(hits, pinned, TOP_N[budget])
        bundle = ContextBundle(
            user_id=user_id,
            memory_version=state.version,
            working_memory=state.working_memory,
            scaffold=dict(state.scaffold),
            learned_info=state.learned_info,
            connection_info={c.connection_id: c.learned_info for c in connections},
            facts=tuple(retrieved),
            degraded=degraded_reason is not None,
            degraded_reason=degraded_reason,
            latency_ms=(time.perf_counter() - started) * 1000,
        )
        return replace(bundle, prompt_block=render_prompt_block(bundle))

    def _rank(
        self, hits: Sequence[VectorHit], pinned: Sequence[Fact], top_n: int
    ) -> list[RetrievedFact]:
        now = self._clock()
        # Chroma may lag behind a status change: only what Postgres says is active counts.
        current = {f.fact_id: f for f in self._store.facts_by_id([h.fact_id for h in hits])}
        scored: list[RetrievedFact] = []
        for hit in hits:
            fact = current.get(hit.fact_id)
            if fact is None or fact.status is not FactStatus.ACTIVE or fact.pinned:
                continue
            scored.append(RetrievedFact(fact, hit.similarity, relevance(hit.similarity, fact, now)))
        scored.sort(key=lambda r: (-r.score, str(r.fact.fact_id)))
        out = [RetrievedFact(f, 1.0, math.inf, pinned=True) for f in pinned]
        seen = {normalize_content(r.fact.content) for r in out}
        for r in scored:
            key = normalize_content(r.fact.content)
            if key in seen:
                continue
            seen.add(key)
            out.append(r)
            if len(out) - len(pinned) >= top_n:
                break
        return out


def _in_scope(fact: Fact, connection_ids: Sequence[str]) -> bool:
    connection = fact.provenance.connection_id
    return connection is None or connection in connection_ids


def fact_ids(bundle: ContextBundle) -> list[uuid.UUID]:
    return [r.fact.fact_id for r in bundle.facts]
