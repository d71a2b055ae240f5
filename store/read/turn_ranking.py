"""Ranking one turn's candidates: fuse the dense and keyword rankings, weigh recency,
salience and the question's cues, drop repeats, diversify (MMR) and cut to the budget.

Pure but for `embeddings`, which fetches the vectors of candidates the dense stage did not
score (not indexed yet, or found by keywords only)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from domain.ids import normalize_content
from domain.model import Fact
from domain.ports import Vector, VectorHit
from store.errors import VectorIndexUnavailable
from store.read.bundle import RetrievedFact
from store.read.ranking import (
    BudgetProfile,
    cue_weight,
    mmr,
    query_cues,
    reciprocal_rank_fusion,
    rerank,
    within_budget,
)

__all__ = ["Candidates", "Picked", "rank"]


@dataclass(frozen=True)
class Candidates:
    """What a turn's candidates are ranked from."""

    hits: Sequence[VectorHit]
    keyword: Sequence[Fact]
    rows: Mapping[uuid.UUID, Fact]
    pinned: Sequence[Fact]
    degraded: str | None
    vectors: Mapping[uuid.UUID, Vector]

    @cached_property
    def similarity(self) -> dict[uuid.UUID, float]:
        return {h.fact_id: h.similarity for h in self.hits}

    def retrieved(self, picked: Picked) -> list[RetrievedFact]:
        similarity = self.similarity
        facts = [RetrievedFact(f, 1.0, 1.0, pinned=True) for f in self.pinned]
        facts += [
            RetrievedFact(
                self.rows[fid],
                similarity.get(fid, 0.0),
                picked.scores[fid],
                dense_rank=picked.dense_rank.get(fid),
                keyword_rank=picked.keyword_rank.get(fid),
            )
            for fid in picked.chosen
        ]
        return facts


@dataclass(frozen=True)
class Picked:
    """The facts a ranking chose, in order, and how each candidates."""

    chosen: list[uuid.UUID]
    scores: Mapping[uuid.UUID, float]
    dense_rank: Mapping[uuid.UUID, int]
    keyword_rank: Mapping[uuid.UUID, int]
    candidates: int
    degraded: str | None


def rank(
    candidates: Candidates,
    text: str,
    profile: BudgetProfile,
    now: datetime,
    embeddings: Callable[[Sequence[uuid.UUID]], Mapping[uuid.UUID, Vector]],
) -> Picked:
    """Fuse, re-rank, drop repeats, diversify and cut to the budget."""
    rows, degraded = candidates.rows, candidates.degraded
    pinned_ids = {f.fact_id for f in candidates.pinned}
    similarity = candidates.similarity
    dense_ranking = [
        h.fact_id for h in candidates.hits if h.fact_id in rows and h.fact_id not in pinned_ids
    ]
    keyword_ranking = [f.fact_id for f in candidates.keyword if f.fact_id not in pinned_ids]
    if degraded:
        fused = reciprocal_rank_fusion([keyword_ranking])
    else:
        # The dense term keeps how near a fact is, not only its rank (see the fusion).
        fused = reciprocal_rank_fusion(
            [dense_ranking, keyword_ranking], strengths=[similarity, None]
        )
    cues = query_cues(text)
    scores = {
        fid: rerank(
            fused[fid],
            # When it happened, not when a run last touched it.
            updated_at=rows[fid].observed_at or rows[fid].updated_at,
            salience=rows[fid].salience,
            confidence=rows[fid].confidence,
            now=now,
        )
        * cue_weight(rows[fid], cues)
        for fid in fused
    }
    ordered = _without_repeats(sorted(scores.items(), key=_best_first), rows, candidates.pinned)
    wanted = [*pinned_ids, *(k for k, _ in ordered)]
    vectors: dict[uuid.UUID, Vector] = {
        k: candidates.vectors[k] for k in wanted if k in candidates.vectors
    }
    missing = [k for k in wanted if k not in vectors]
    if not degraded and missing:
        try:
            vectors |= embeddings(missing)
        except VectorIndexUnavailable as e:
            degraded = f"vector index unavailable: {e}"
    picked = mmr(
        ordered,
        vectors,
        limit=profile.max_facts,
        lam=profile.mmr_lambda,
        selected=list(pinned_ids),
    )
    sizes = {k: len(rows[k].content) for k in picked}
    chosen = within_budget([(k, scores[k]) for k in picked], profile, sizes)
    return Picked(
        chosen=chosen,
        scores=scores,
        dense_rank={fid: i for i, fid in enumerate(dense_ranking, start=1)},
        keyword_rank={fid: i for i, fid in enumerate(keyword_ranking, start=1)},
        candidates=len(fused),
        degraded=degraded,
    )


def _best_first(scored: tuple[uuid.UUID, float]) -> tuple[float, int]:
    """Highest score first, equal scores by fact id (a UUID's integer orders as its text)."""
    return -scored[1], scored[0].int


def _without_repeats(
    ordered: list[tuple[uuid.UUID, float]], rows: Mapping[uuid.UUID, Fact], pinned: Sequence[Fact]
) -> list[tuple[uuid.UUID, float]]:
    """Drop a fact whose text repeats a pinned or a better-ranked one (vectors or not)."""
    seen = {normalize_content(f.content) for f in pinned}
    out = []
    for fid, score in ordered:
        key = normalize_content(rows[fid].content)
        if key not in seen:
            seen.add(key)
            out.append((fid, score))
    return out
