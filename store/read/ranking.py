"""Ranking for the read path, as pure functions over plain values.

Candidates come from two retrievers, dense (Chroma) and keyword (Postgres full text). They
are fused by reciprocal rank fusion, which needs no score calibration between the two;
re-ranked by recency, salience and confidence; then picked by maximal marginal relevance so
that near-duplicates do not crowd out the rest; then cut to the budget.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from domain.model import Fact, FactType
from domain.ports import Vector

K = TypeVar("K", bound=Hashable)

RRF_K = 60
RECENCY_HALF_LIFE_DAYS = 30.0
# Above this cosine similarity two facts say the same thing: the second is dropped outright.
DUPLICATE_SIMILARITY = 0.92


class Budget(StrEnum):
    LEAN = "lean"
    BALANCED = "balanced"
    DEEP = "deep"


@dataclass(frozen=True)
class BudgetProfile:
    """How many facts a turn gets (pinned facts come on top) and how hard we look for them.

    Between `min_facts` and `max_facts`, a fact must score at least `floor` × the best
    score: a turn with one clearly relevant fact does not get padded with noise.
    """

    min_facts: int
    max_facts: int
    pool: int  # candidates asked of each retriever
    floor: float = 0.35
    mmr_lambda: float = 0.7
    # The prompt space the facts may take, in characters of fact text: filled in rank order,
    # so short facts buy room for more evidence. None: only the fact count limits.
    max_chars: int | None = None


PROFILES: Mapping[Budget, BudgetProfile] = {
    Budget.LEAN: BudgetProfile(min_facts=2, max_facts=6, pool=16, max_chars=600),
    Budget.BALANCED: BudgetProfile(min_facts=5, max_facts=14, pool=32, max_chars=1_200),
    # Deep asks each retriever for four times the facts it may return: a fact far down one
    # ranking but high in the other is fused only if both pools hold it. On the LoCoMo dev
    # split (users of ~270 facts) 64 → 128 raised hit@2000ch 77.8 → 80.2 % and hit@10
    # 77.0 → 79.6 %; 96 and 160 gave 79.4 and 79.9 % (BENCHMARKS.md).
    Budget.DEEP: BudgetProfile(min_facts=10, max_facts=32, pool=128, max_chars=2_400),
}


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[K]],
    k: int = RRF_K,
    strengths: Sequence[Mapping[K, float] | None] = (),
) -> dict[K, float]:
    """Σ 1/(k + rank) over the rankings an item appears in (rank 1 = best), scaled to [0, 1].

    1.0 means first in every ranking. Scaling by the best possible sum keeps the score
    comparable whatever the number of retrievers that answered (one, when Chroma is down).

    `strengths[i]`, when given, scales ranking i's term of each item by its score relative to
    that ranking's best (clipped to [0, 1]). With k = 60 ranks 1 and 4 differ by 5 %, so
    without it a fact the query barely touches (cosine 0.004) is "as relevant" as the one it
    is about (cosine 0.47) and salience alone decides between them.
    """
    if not rankings:
        return {}
    best = len(rankings) / (k + 1)
    fused: dict[K, float] = {}
    for i, ranking in enumerate(rankings):
        scores = strengths[i] if i < len(strengths) else None
        top = max((scores.get(key, 0.0) for key in ranking), default=0.0) if scores else 0.0
        for rank, key in enumerate(dict.fromkeys(ranking), start=1):
            term = 1.0 / (k + rank)
            if scores is not None and top > 0:
                term *= min(1.0, max(0.0, scores.get(key, 0.0) / top))
            fused[key] = fused.get(key, 0.0) + term
    return {key: score / best for key, score in fused.items()}


def recency(updated_at: datetime, now: datetime, half_life_days: float) -> float:
    """1.0 for a fact changed now, 0.5 one half-life ago; never above 1 for future stamps."""
    age_days = max(0.0, (now - updated_at).total_seconds() / 86_400)
    return float(0.5 ** (age_days / half_life_days))


def rerank(
    fused: float,
    *,
    updated_at: datetime,
    salience: float,
    confidence: float,
    now: datetime,
    half_life_days: float = RECENCY_HALF_LIFE_DAYS,
) -> float:
    """fused relevance × recency decay × weight of salience and confidence.

    The factors are damped (an old or low-salience fact loses at most 30 % and 50 %) so they
    reorder facts of similar relevance without burying the one fact the turn is about.
    """
    decay = 0.7 + 0.3 * recency(updated_at, now, half_life_days)
    weight = 0.5 + 0.5 * salience * confidence
    return float(fused * decay * weight)


def cosine(a: Vector, b: Vector) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.dot(a, b) / norm) if norm else 0.0


def mmr(
    scored: Sequence[tuple[K, float]],
    vectors: Mapping[K, Vector],
    *,
    limit: int,
    lam: float = 0.7,
    selected: Sequence[K] = (),
    duplicate: float = DUPLICATE_SIMILARITY,
) -> list[K]:
    """Maximal marginal relevance: greedily take argmax λ·rel − (1−λ)·max sim to the taken.

    `scored` are (key, relevance); relevance is scaled to [0, 1] by the best one. `selected`
    are already in (the pinned facts): new picks are diverse from them too, but they are not
    returned. A candidate within `duplicate` cosine of a taken one is dropped; a candidate
    without a vector (not indexed yet) is only judged on relevance. Ties keep input order.
    """
    if limit <= 0 or not scored:
        return []
    top = max(score for _, score in scored) or 1.0
    keys = [key for key, _ in scored]
    relevance = np.array([score / top for _, score in scored], dtype=np.float64)
    has_vector = np.array([k in vectors for k in keys])
    dimension = next((len(v) for v in vectors.values()), 0)
    matrix = np.zeros((len(keys), dimension), dtype=np.float64)
    if has_vector.any():
        # One stack and one norm for all rows: a norm per row in Python was a tenth of an API
        # worker's time at concurrency 16 (BENCHMARKS.md).
        matrix[has_vector] = _unit_rows([vectors[k] for k in keys if k in vectors])
    # Highest similarity of each candidate to anything taken so far, updated per pick; to the
    # pinned facts in one product (a user pins a hundred: a product each was most of MMR).
    closest = np.zeros(len(keys), dtype=np.float64)
    taken = [vectors[key] for key in selected if key in vectors]
    if taken and dimension:
        closest = np.maximum(closest, (matrix @ _unit_rows(taken).T).max(axis=1))
    open_ = np.ones(len(keys), dtype=bool)
    out: list[K] = []
    while len(out) < limit:
        open_ &= ~(has_vector & (closest >= duplicate))
        if not open_.any():
            break
        value = np.where(open_, lam * relevance - (1 - lam) * closest, -np.inf)
        pick = int(value.argmax())  # the first of equal values: input order breaks ties
        out.append(keys[pick])
        open_[pick] = False
        if has_vector[pick]:
            closest = np.maximum(closest, matrix @ matrix[pick])
    return out


def _unit_rows(rows: Sequence[Vector]) -> npt.NDArray[np.float64]:
    matrix = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit: npt.NDArray[np.float64] = np.divide(
        matrix, norms, out=np.zeros_like(matrix), where=norms > 0
    )
    return unit


def top_n(scores: npt.NDArray[np.floating[Any]], n: int) -> npt.NDArray[np.intp]:
    """Positions of the n highest scores, best first, equal scores in position order: what
    a stable argsort of all of them gives, after a partition (when the scores are many for n)
    that leaves only the scores at or above the n-th best to sort."""
    if n <= 0:
        return np.empty(0, dtype=np.intp)
    if scores.size <= _SORT_ALL_FACTOR * n:
        return np.argsort(-scores, kind="stable")[:n]
    nth = np.partition(scores, scores.size - n)[scores.size - n]
    kept = np.flatnonzero(scores >= nth)
    order = kept[np.argsort(-scores[kept], kind="stable")]
    return order[:n]


# Up to this many scores per one wanted a plain sort is cheaper than partitioning first.
_SORT_ALL_FACTOR = 4


def within_budget(
    ordered: Sequence[tuple[K, float]],
    profile: BudgetProfile,
    sizes: Mapping[K, int] | None = None,
) -> list[K]:
    """Cut an ordered selection to the profile: up to `max_facts`, past `min_facts` only
    those scoring at least `floor` × the best score, and, given the `sizes` (characters) of
    the facts, only as many as fit in `max_chars`: a fact too long for what is left is
    skipped, and a shorter one after it may still fit."""
    if not ordered:
        return []
    best = max(score for _, score in ordered)
    room = profile.max_chars if sizes is not None and profile.max_chars is not None else None
    out: list[K] = []
    for key, score in ordered:
        if len(out) >= profile.max_facts:
            break
        if len(out) >= profile.min_facts and score < profile.floor * best:
            continue
        if room is not None and sizes is not None:
            if sizes[key] > room:
                continue
            room -= sizes[key]
        out.append(key)
    return out


# --- query cues -------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Capitalized words that are not names: sentence openers, pronouns, requests, calendar
# words. One let through is read as a name: "He" then named every "Helen" and was found in
# every "the".
_NOT_NAMES: Final = _words(
    "what when where who whom whose which why how did does do is are was were has have had "
    "can could would will should may might i the a an in on at of for to and or but if "
    "he she it we you they me him her us them my your his its our their mine yours hers ours "
    "theirs this that these those there here then so also now yes no not any some all "
    "tell give list name describe explain show find remind summarize summarise please "
    "hi hey hello thanks ok okay "
    "monday tuesday wednesday thursday friday saturday sunday january february march april "
    "may june july august september october november december"
)
_NAME = re.compile(r"\b([A-Z][a-z][\w-]*)(?:['’]s)?\b")
_TEMPORAL = re.compile(
    r"^\s*when\b|\b(?:what|which) (?:date|day|month|year|time|week|weekend)\b|"
    r"\bhow long (?:ago|before|after|since)\b|\bin what (?:year|month)\b|\bwhen did\b|"
    r"\bhow (?:many|much) (?:days|weeks|months|years)\b",
    re.IGNORECASE,
)
# "What is she working on?", "current projects", "busy with": a question about the work in
# hand, which project observations and open loops answer better than a remark that shares
# its words ("works best late") does.
_CURRENT_WORK = re.compile(
    r"\bwork(?:s|ing)? on\b|\bbusy with\b|\bprojects?\b|\bfocus(?:ed|ing)? on\b",
    re.IGNORECASE,
)
PROJECT_CONTEXT = "project_details"  # the event type project observations come as
NAME_BOOST = 1.3
WORK_BOOST = 1.5
MENTION_BOOST = 1.1
DATED_BOOST = 1.25


@dataclass(frozen=True)
class QueryCues:
    """What a question says about the facts it wants, read without an LLM."""

    names: frozenset[str] = frozenset()  # casefolded
    temporal: bool = False
    current_work: bool = False

    def mentioned(self, text: str) -> bool:
        """Whether `text` has a word that is a name or, as `_is_named` reads short forms,
        begins with one of three letters or more ("Mel" in "Melanie's", not "Jo" in "Joke"
        nor "Ann" in "annual")."""
        return self._mention is not None and self._mention.search(text) is not None

    @cached_property
    def _mention(self) -> re.Pattern[str] | None:
        if not self.names:
            return None
        # Capitalized as a name is written: "Ann" begins "Annabel", not "annual".
        words = [
            f"{re.escape(n[0].upper())}(?i:{re.escape(n[1:])})" + ("" if len(n) >= 3 else r"\b")
            for n in sorted(self.names)
        ]
        return re.compile(rf"\b(?:{'|'.join(words)})")


def query_cues(text: str) -> QueryCues:
    """Names in the question ("What did Caroline research?"), whether it asks when, and
    whether it asks about the work in hand."""
    names = {
        m.group(1).casefold()
        for m in _NAME.finditer(text)
        if m.group(1).casefold() not in _NOT_NAMES
    }
    return QueryCues(
        frozenset(names),
        temporal=_TEMPORAL.search(text) is not None,
        current_work=_CURRENT_WORK.search(text) is not None,
    )


def _is_named(person: str, names: frozenset[str]) -> bool:
    """ "Mel" names "Melanie": a short form is the start of the name."""
    person = person.casefold()
    return any(person == n or (len(n) >= 3 and person.startswith(n)) for n in names)


def cue_weight(fact: Fact, cues: QueryCues) -> float:
    """How much a fact's subject and date fit the question's cues (1.0 = no cue applies).

    A fact about a person the question names beats one that only mentions them, which beats
    one about someone else; a question asking "when" favours facts that carry a date, one
    about the work in hand facts from project observations and open loops.
    """
    weight = 1.0
    if cues.names:
        if fact.subject is not None and _is_named(fact.subject, cues.names):
            weight *= NAME_BOOST
        elif cues.mentioned(fact.content):
            weight *= MENTION_BOOST
    if cues.temporal and fact.event_date is not None:
        weight *= DATED_BOOST
    if cues.current_work and (
        fact.provenance.context_type == PROJECT_CONTEXT or fact.fact_type is FactType.OPEN_LOOP
    ):
        weight *= WORK_BOOST
    return weight
