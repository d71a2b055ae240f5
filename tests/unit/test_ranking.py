"""The read path's ranking steps, table-driven: fusion, re-ranking, MMR, budgets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from domain.ports import Vector
from store.read.ranking import (
    PROFILES,
    Budget,
    BudgetProfile,
    cosine,
    mmr,
    recency,
    reciprocal_rank_fusion,
    rerank,
    within_budget,
)

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def vec(*xs: float) -> Vector:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


@pytest.mark.parametrize(
    ("rankings", "expected_order"),
    [
        ([], []),
        ([["a", "b", "c"]], ["a", "b", "c"]),
        # In both lists beats first in one.
        ([["a", "b"], ["b", "c"]], ["b", "a", "c"]),
        # Symmetric positions tie; first seen wins the tie in sorted order by key.
        ([["a", "b"], ["b", "a"]], ["a", "b"]),
        # A repeated key counts once per ranking.
        ([["a", "a", "b"]], ["a", "b"]),
        # Only one retriever answered (Chroma down): scores still reach 1.0.
        ([[], ["x", "y"]], ["x", "y"]),
    ],
)
def test_reciprocal_rank_fusion_order(rankings: list[list[str]], expected_order: list[str]) -> None:
    fused = reciprocal_rank_fusion(rankings)
    assert sorted(fused, key=lambda k: (-fused[k], k)) == expected_order


@pytest.mark.parametrize(
    ("rankings", "key", "score"),
    [
        ([["a"], ["a"]], "a", 1.0),  # first everywhere
        ([["a"]], "a", 1.0),
        ([["a"], []], "a", 0.5),  # first in one of two
        ([["b", "a"]], "a", 61 / 62),
    ],
)
def test_reciprocal_rank_fusion_scale(rankings: list[list[str]], key: str, score: float) -> None:
    assert reciprocal_rank_fusion(rankings)[key] == pytest.approx(score)


@pytest.mark.parametrize(
    ("age_days", "expected"),
    [(0, 1.0), (30, 0.5), (60, 0.25), (-5, 1.0)],
)
def test_recency_halves_every_half_life(age_days: float, expected: float) -> None:
    assert recency(NOW - timedelta(days=age_days), NOW, 30.0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("fused", "age_days", "salience", "confidence", "expected"),
    [
        (1.0, 0, 1.0, 1.0, 1.0),
        (1.0, 0, 0.0, 1.0, 0.5),  # salience 0 halves
        (1.0, 30, 1.0, 1.0, 0.85),  # one half-life: 0.7 + 0.3 * 0.5
        (1.0, 10_000, 1.0, 1.0, 0.7),  # ancient: never below 70 %
        (0.5, 0, 1.0, 1.0, 0.5),
    ],
)
def test_rerank(
    fused: float, age_days: float, salience: float, confidence: float, expected: float
) -> None:
    score = rerank(
        fused,
        updated_at=NOW - timedelta(days=age_days),
        salience=salience,
        confidence=confidence,
        now=NOW,
    )
    assert score == pytest.approx(expected)


def test_rerank_lets_a_fresh_salient_fact_overtake_a_stale_one_of_similar_relevance() -> None:
    stale = rerank(
        0.50, updated_at=NOW - timedelta(days=365), salience=0.3, confidence=0.6, now=NOW
    )
    fresh = rerank(0.45, updated_at=NOW, salience=0.9, confidence=0.9, now=NOW)
    assert fresh > stale


X, Y, Z = vec(1, 0, 0), vec(0, 1, 0), vec(0, 0, 1)
NEAR_X = vec(1, 0.05, 0)  # cosine to X ≈ 0.999: a near-duplicate
HALF_X = vec(1, 1, 0)  # cosine to X ≈ 0.71


@pytest.mark.parametrize(
    ("scored", "vectors", "limit", "selected", "expected"),
    [
        pytest.param([], {}, 3, [], [], id="nothing"),
        pytest.param([("a", 1.0)], {"a": X}, 0, [], [], id="zero limit"),
        pytest.param(
            [("a", 1.0), ("b", 0.9), ("c", 0.8)],
            {"a": X, "b": Y, "c": Z},
            3,
            [],
            ["a", "b", "c"],
            id="orthogonal keeps relevance order",
        ),
        pytest.param(
            [("a", 1.0), ("dup", 0.99), ("c", 0.5)],
            {"a": X, "dup": NEAR_X, "c": Y},
            3,
            [],
            ["a", "c"],
            id="near-duplicate dropped",
        ),
        pytest.param(
            [("a", 1.0), ("similar", 0.9), ("other", 0.8)],
            {"a": X, "similar": HALF_X, "other": Y},
            2,
            [],
            ["a", "other"],
            id="diverse beats similar of close relevance",
        ),
        pytest.param(
            [("a", 1.0), ("b", 0.9)],
            {"a": X, "b": Y, "pin": NEAR_X},
            2,
            ["pin"],
            ["b"],
            id="duplicate of a pinned fact dropped",
        ),
        pytest.param(
            [("a", 1.0), ("novec", 0.9), ("b", 0.1)],
            {"a": X, "b": Y},
            2,
            [],
            ["a", "novec"],
            id="unindexed fact judged on relevance",
        ),
    ],
)
def test_mmr(
    scored: list[tuple[str, float]],
    vectors: dict[str, Vector],
    limit: int,
    selected: list[str],
    expected: list[str],
) -> None:
    assert mmr(scored, vectors, limit=limit, selected=selected) == expected


def test_mmr_with_lambda_one_is_plain_relevance_order() -> None:
    scored = [("a", 1.0), ("similar", 0.9), ("other", 0.8)]
    vectors = {"a": X, "similar": HALF_X, "other": Y}
    assert mmr(scored, vectors, limit=3, lam=1.0) == ["a", "similar", "other"]


@pytest.mark.parametrize(
    ("scores", "profile", "expected"),
    [
        ([], BudgetProfile(2, 3, 10), []),
        ([1.0, 0.9, 0.8, 0.7], BudgetProfile(2, 3, 10), [0, 1, 2]),  # max
        ([1.0, 0.1, 0.05], BudgetProfile(2, 3, 10), [0, 1]),  # min beats the floor
        ([1.0, 0.9, 0.1, 0.6], BudgetProfile(1, 4, 10), [0, 1, 3]),  # floor skips, not stops
        ([1.0], BudgetProfile(5, 7, 10), [0]),  # fewer than min: all there is
    ],
)
def test_within_budget(scores: list[float], profile: BudgetProfile, expected: list[int]) -> None:
    assert within_budget(list(enumerate(scores)), profile) == expected


@pytest.mark.parametrize(
    ("budget", "low", "high"),
    [(Budget.LEAN, 2, 3), (Budget.BALANCED, 5, 7), (Budget.DEEP, 10, 15)],
)
def test_budget_profiles(budget: Budget, low: int, high: int) -> None:
    profile = PROFILES[budget]
    assert (profile.min_facts, profile.max_facts) == (low, high)
    assert profile.pool >= 3 * profile.max_facts


def test_cosine_of_a_zero_vector_is_zero() -> None:
    assert cosine(np.zeros(3, dtype=np.float32), X) == 0.0
