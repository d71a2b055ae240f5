"""Which of a user's facts a consolidation shows its backend: the ones the batch is about.

After a year a user has thousands of facts, and a batch of observations is about a few of
them. Shown are, for each observation, the facts most related to it (the read path's dense +
keyword search, scoped like the observation: its connection or none), taken in rounds (every
observation's best, then every observation's second best, ...) until a token budget is spent,
and the pinned facts in scope, within a budget of their own (those the search also found
first, then the most recent), so a user who pinned much cannot crowd out what the batch is
about. A prompt's size follows the batch, not the memory, and a correction meets the fact it
corrects however old, unpinned or unremarkable that fact is. Facts a retraction in the batch
names are always in (the retraction is applied to them) and cost nothing: the backend never
sees them.

Both backends and the write gate get the same candidates, so they see the same world.
Deterministic for given search results: observation order, rank and fact id break every tie.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from domain.ids import MemoryKey
from domain.model import Fact
from domain.ports import FactQuery, FactSearch
from processors.heuristics import approx_tokens
from processors.schema import in_request_order
from producers.contract import ContextEvent, EventType

# What a shown fact costs beyond its text: `<fact id="<uuid>" type="...">` and `</fact>`.
FACT_MARKUP_TOKENS = 20


@dataclass(frozen=True)
class CandidatePolicy:
    # How many related facts each observation may bring: its nearest few are what decide
    # between add, reinforce, update and contradict. Every observation's best comes first.
    per_observation: int = 3
    # Budget of the related facts shown, in approximate prompt tokens (text and markup):
    # about 20 facts, one per observation of a full batch (every observation's best comes
    # first), more for smaller batches. A prompt for a user with a large memory then costs
    # under a fifth more than for a user with almost none (BENCHMARKS.md).
    max_tokens: int = 650
    # Budget of the pinned facts shown, on top: about two. Pinned facts unrelated to the
    # batch matter little to it: no run changes a pinned fact (processors.lifecycle).
    pinned_tokens: int = 80
    # Only the start of a long observation (a tool dump) is searched with.
    query_chars: int = 500


@dataclass(frozen=True)
class Candidates:
    facts: tuple[Fact, ...]  # pinned first, then related by round; retracted ones last
    known: int  # the user's active and held facts, shown or not
    degraded: str | None = None  # the search ran without a retriever (see RelatedFacts)


def queries_for(events: Sequence[ContextEvent], policy: CandidatePolicy) -> list[FactQuery]:
    """One query per observation the backend will see (retractions are not shown to it)."""
    return [
        FactQuery(_query_text(e)[: policy.query_chars], e.source_metadata.connection_id)
        for e in in_request_order(events)
        if e.event_type is not EventType.FACT_RETRACTION
    ]


def _query_text(event: ContextEvent) -> str:
    if event.event_type is EventType.SCAFFOLD_UPDATE and event.scaffold_key is not None:
        return f"{event.scaffold_key}: {event.content}"
    return event.content


def select_candidates(
    key: MemoryKey,
    events: Sequence[ContextEvent],
    search: FactSearch,
    policy: CandidatePolicy | None = None,
    *,
    known: int | None = None,
) -> Candidates:
    """`known`: the memory's active and held facts if the caller counted them already (a
    flush reads the count with the memory under its lock); asked of `search` otherwise."""
    policy = policy or CandidatePolicy()
    if known is None:
        known = search.count(key)
    if known == 0:
        # A memory with no active or held fact (a user's first batch) has nothing to search,
        # pin or retract: the search's keyword statements alone cost a flush 3-4 ms.
        return Candidates((), 0)
    queries = queries_for(events, policy)
    scopes = {q.connection_id for q in queries} | {None}
    related = search.related(key, queries, policy.per_observation)
    found = {f.fact_id for r in related.ranked for f in r}
    pinned = sorted(
        (f for f in search.pinned(key) if f.provenance.connection_id in scopes),
        key=lambda f: (f.fact_id not in found, -f.updated_at.timestamp(), str(f.fact_id)),
    )
    chosen = _within_budget([pinned], policy.pinned_tokens)
    chosen += _within_budget(
        _rounds(related.ranked), policy.max_tokens, {f.fact_id for f in chosen}
    )
    named = retraction_targets(events)
    shown = {f.fact_id for f in chosen}
    retracted = search.by_ids(key, [i for i in named if i not in shown])
    facts = (*chosen, *sorted(retracted, key=lambda f: str(f.fact_id)))
    return Candidates(facts, known, related.degraded)


def _rounds(ranked: Sequence[Sequence[Fact]]) -> list[list[Fact]]:
    """Round r holds every query's r-th best fact, in query order."""
    depth = max((len(r) for r in ranked), default=0)
    return [[r[i] for r in ranked if i < len(r)] for i in range(depth)]


def _within_budget(
    groups: Sequence[Sequence[Fact]], max_tokens: int, taken: set[uuid.UUID] | None = None
) -> list[Fact]:
    """Facts in group order, each once and none of `taken`; one that does not fit is
    skipped for smaller ones."""
    chosen: list[Fact] = []
    seen = set(taken or ())
    spent = 0
    for group in groups:
        for fact in group:
            cost = shown_cost(fact)
            if fact.fact_id in seen or spent + cost > max_tokens:
                continue
            seen.add(fact.fact_id)
            chosen.append(fact)
            spent += cost
    return chosen


def retraction_targets(events: Sequence[ContextEvent]) -> list[uuid.UUID]:
    """The facts a batch's retractions name, in the batch's order: a request carries them
    whether or not the search found them, so the retraction can be applied."""
    return [
        e.retraction().fact_id
        for e in in_request_order(events)
        if e.event_type is EventType.FACT_RETRACTION
    ]


def shown_cost(fact: Fact) -> int:
    """Approximate prompt tokens of one fact as the prompt renders it."""
    return approx_tokens(fact.content) + FACT_MARKUP_TOKENS
