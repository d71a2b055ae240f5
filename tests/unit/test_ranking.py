"""The read path's ranking steps, table-driven: fusion, re-ranking, MMR, budgets."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain.model import Fact, FactType
from domain.ports import Vector
from store.read.ranking import (
    MENTION_BOOST,
    PROFILES,
    Budget,
    BudgetProfile,
    cosine,
    cue_weight,
    mmr,
    query_cues,
    recency,
    reciprocal_rank_fusion,
    rerank,
    top_n,
    within_budget,
)
from tests.support.builders import make_fact

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
    [(Budget.LEAN, 2, 6), (Budget.BALANCED, 5, 14), (Budget.DEEP, 10, 32)],
)
def test_budget_profiles(budget: Budget, low: int, high: int) -> None:
    profile = PROFILES[budget]
    assert (profile.min_facts, profile.max_facts) == (low, high)
    assert profile.pool >= 2 * profile.max_facts
    assert profile.max_chars is not None


def test_deeper_budgets_give_more_room() -> None:
    rooms = [PROFILES[b].max_chars or 0 for b in (Budget.LEAN, Budget.BALANCED, Budget.DEEP)]
    assert rooms == sorted(rooms)
    assert rooms[-1] >= 2_000


@pytest.mark.parametrize(
    ("sizes", "max_chars", "expected"),
    [
        ([100, 100, 100], 250, [0, 1]),  # the third does not fit
        ([100, 300, 50], 250, [0, 2]),  # a long one is skipped, a short one after it fits
        ([300, 10], 250, [1]),  # even the best is skipped when it cannot fit
        ([100, 100], None, [0, 1]),  # no character budget: only the count limits
    ],
)
def test_within_budget_fills_characters_in_rank_order(
    sizes: list[int], max_chars: int | None, expected: list[int]
) -> None:
    profile = BudgetProfile(0, 10, 20, max_chars=max_chars)
    ordered = [(i, 1.0) for i in range(len(sizes))]
    assert within_budget(ordered, profile, dict(enumerate(sizes))) == expected


@pytest.mark.parametrize(
    ("query", "names", "temporal", "current_work"),
    [
        ("What did Caroline research?", {"caroline"}, False, False),
        ("When did Melanie run a charity race?", {"melanie"}, True, False),
        ("What is Jon's dance studio called?", {"jon"}, False, False),
        ("Which year did Maria and John move?", {"maria", "john"}, True, False),
        ("What is the user working on right now?", set(), False, True),
        ("Which projects is Omar busy with?", {"omar"}, False, True),
        ("What does Maya focus on this week?", {"maya"}, False, True),
        ("Where does the user work?", set(), False, False),
        ("How long ago was Caroline's 18th birthday?", {"caroline"}, True, False),
        ("Did they go in May?", set(), False, False),
        ("He said what to Caroline?", {"caroline"}, False, False),
        ("Tell me what my sister likes", set(), False, False),
        ("Please remind me: She and Ann met where?", {"ann"}, False, False),
    ],
)
def test_query_cues(query: str, names: set[str], temporal: bool, current_work: bool) -> None:
    cues = query_cues(query)
    assert (set(cues.names), cues.temporal, cues.current_work) == (names, temporal, current_work)


def test_a_question_about_the_work_in_hand_favours_projects_and_open_loops() -> None:
    cues = query_cues("What is the user working on right now?")
    project = make_fact(
        "u", "The ledger migration is in review", org="o", context_type="project_details"
    )
    loop = make_fact("u", "Send the deck by Friday", org="o", fact_type=FactType.OPEN_LOOP)
    remark = make_fact("u", "The user works best late", org="o")
    assert cue_weight(project, cues) == cue_weight(loop, cues) > cue_weight(remark, cues) == 1.0
    assert cue_weight(project, query_cues("Where does the user live?")) == 1.0


def _fact(content: str, subject: str | None = None, dated: bool = False) -> Fact:
    return make_fact(
        "u",
        content,
        org="o",
        at=NOW,
        confidence=0.8,
        salience=0.6,
        event_date=date(2023, 5, 7) if dated else None,
        subject=subject,
    )


def test_cue_weight_favours_the_named_person_then_a_mention_then_dates() -> None:
    cues = query_cues("When did Mel go camping with Caroline?")
    about_mel = cue_weight(_fact("Melanie went camping", subject="Melanie"), cues)
    mentions = cue_weight(_fact("Jon met Caroline", subject="Jon"), cues)
    unrelated = cue_weight(_fact("Jon went hiking", subject="Jon"), cues)
    dated = cue_weight(_fact("Jon went hiking on 7 May 2023", subject="Jon", dated=True), cues)
    assert about_mel > mentions > unrelated == 1.0
    assert dated > unrelated


@pytest.mark.parametrize(
    ("content", "mentioned"),
    [
        ("Ann left early", True),
        ("Annabel called about Ann's car", True),
        ("The annual fair is in June", False),  # not "Ann"
        ("Joanne planned the trip", False),  # "Jo" is too short to begin another name
        ("Jo planned the trip", True),
    ],
)
def test_a_mention_is_a_name_as_written_not_letters_inside_a_word(
    content: str, mentioned: bool
) -> None:
    cues = query_cues("What did Jo and Ann plan?")
    expected = MENTION_BOOST if mentioned else 1.0
    assert cue_weight(_fact(content, subject="Omar"), cues) == expected


def test_cosine_of_a_zero_vector_is_zero() -> None:
    assert cosine(np.zeros(3, dtype=np.float32), X) == 0.0


def test_fusion_strengths_keep_how_near_a_dense_hit_is() -> None:
    dense = ["about", "noise", "barely"]
    cosine = {"about": 0.47, "noise": 0.30, "barely": 0.004}
    plain = reciprocal_rank_fusion([dense, []])
    weighted = reciprocal_rank_fusion([dense, []], strengths=[cosine, None])
    assert weighted["about"] == pytest.approx(plain["about"])  # the best keeps its score
    assert weighted["barely"] < 0.01 * plain["barely"]
    # Ranks 1 and 3 are 3 % apart by rank alone: a salient fact could overtake the best.
    assert plain["barely"] > 0.95 * plain["about"]
    assert weighted["noise"] < 0.7 * weighted["about"]


def test_fusion_without_strengths_for_a_ranking_is_rank_only() -> None:
    keyword = ["a", "b"]
    assert reciprocal_rank_fusion([keyword], strengths=[None]) == reciprocal_rank_fusion([keyword])


@settings(max_examples=300, deadline=None)
@given(
    scores=st.lists(st.integers(-3, 3).map(float), max_size=40),
    n=st.integers(0, 45),
)
def test_top_n_is_a_stable_argsort_cut_to_n(scores: list[float], n: int) -> None:
    # Few distinct values: ties at the n-th score are the case the partition must keep.
    values = np.array(scores, dtype=np.float32)
    expected = np.argsort(-values, kind="stable")[:n]
    assert top_n(values, n).tolist() == expected.tolist()


def _mmr_by_hand(
    scored: list[tuple[int, float]],
    vectors: dict[int, Vector],
    limit: int,
    selected: list[int],
) -> list[int]:
    """MMR as its docstring states it, one cosine at a time."""
    top = max(score for _, score in scored) or 1.0
    taken = [vectors[k] for k in selected if k in vectors]
    out: list[int] = []
    left = list(scored)
    while len(out) < limit:
        best, best_value = None, -np.inf
        for key, score in left:
            closest = 0.0
            if key in vectors:
                closest = max([0.0, *(cosine(vectors[key], t) for t in taken)])
                if closest >= 0.95:
                    continue
            value = 0.7 * score / top - 0.3 * closest
            if value > best_value:
                best, best_value = key, value
        if best is None:
            break
        out.append(best)
        if best in vectors:
            taken.append(vectors[best])
        left = [(k, s) for k, s in left if k != best]
    return out


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    candidates=st.integers(1, 30),
    pinned=st.integers(0, 12),
    limit=st.integers(1, 12),
)
def test_mmr_matches_a_plain_implementation_with_many_pinned(
    seed: int, candidates: int, pinned: int, limit: int
) -> None:
    rng = np.random.default_rng(seed)
    # Few directions, so near-duplicates of pins and of picks occur.
    basis = rng.normal(size=(4, 8))
    vectors: dict[int, Vector] = {
        k: basis[rng.integers(4)] + rng.normal(scale=0.1, size=8)
        for k in range(candidates + pinned)
        if rng.random() < 0.9
    }
    scored = [(k, float(rng.uniform(0.1, 1.0))) for k in range(candidates)]
    selected = list(range(candidates, candidates + pinned))
    expected = _mmr_by_hand(scored, vectors, limit, selected)
    assert mmr(scored, vectors, limit=limit, selected=selected, duplicate=0.95) == expected
