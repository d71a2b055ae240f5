"""What one turn's read hands the agent: the bundle `ContextService.assemble` returns."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from domain.model import Fact
from store.read.ranking import Budget


@dataclass(frozen=True)
class RetrievedFact:
    fact: Fact
    similarity: float  # cosine to the query; 0.0 when only the keyword search found it
    score: float  # fused relevance × recency × salience/confidence; 1.0 for pinned facts
    pinned: bool = False
    dense_rank: int | None = None
    keyword_rank: int | None = None

    def audit(self) -> dict[str, Any]:
        return {
            "fact_id": str(self.fact.fact_id),
            "pinned": self.pinned,
            "score": round(self.score, 6),
            "similarity": round(self.similarity, 6),
            "dense_rank": self.dense_rank,
            "keyword_rank": self.keyword_rank,
            "surface": self.fact.surface.value,
            "status": self.fact.status.value,
        }


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
    connection_ids: tuple[str, ...] = ()
    log_id: uuid.UUID | None = None
    budget: Budget = Budget.BALANCED
    query: str = ""
    rewritten_query: str | None = None
    timings_ms: Mapping[str, float] = field(default_factory=dict)
