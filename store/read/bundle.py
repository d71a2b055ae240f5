"""What one turn's read hands the agent: the bundle `ContextService.assemble` returns."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from domain.model import Fact
from domain.reads import ContextLogRow, Injection
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
    organization_id: str
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


def audit_row(
    bundle: ContextBundle, injection: Injection, candidates: int, at: datetime, read_at: datetime
) -> ContextLogRow:
    """The AgentContextLog row of an assembled bundle, written `at`, of a turn that started
    reading the memory `read_at`."""
    if bundle.log_id is None:
        raise ValueError("an assembled bundle always has a log id")
    state = injection.state
    return ContextLogRow(
        log_id=bundle.log_id,
        user_id=bundle.user_id,
        organization_id=bundle.organization_id,
        query=bundle.query,
        rewritten_query=bundle.rewritten_query,
        memory_version=bundle.memory_version,
        budget=bundle.budget.value,
        connection_ids=bundle.connection_ids,
        injected={
            "working_memory_chars": len(state.working_memory),
            "scaffold_keys": sorted(str(k) for k in state.scaffold),
            "learned_info": len(state.learned_info),
            "connection_info": {k: len(v) for k, v in sorted(bundle.connection_info.items())},
            "pinned_fact_ids": [str(r.fact.fact_id) for r in bundle.facts if r.pinned],
            "candidates": candidates,
            "prompt_chars": len(bundle.prompt_block),
            "prompt_sha256": hashlib.sha256(bundle.prompt_block.encode()).hexdigest(),
            "timings_ms": {k: round(v, 3) for k, v in bundle.timings_ms.items()},
        },
        retrieved=[r.audit() for r in bundle.facts],
        latency_ms=bundle.latency_ms,
        degraded=bundle.degraded,
        degraded_reason=bundle.degraded_reason,
        created_at=at,
        read_at=read_at,
        generation=injection.generation,
        recalled=tuple(r.fact.fact_id for r in bundle.facts),
    )
