"""Which existing facts a batch is shown: related ones in rounds, pinned apart, within budgets."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import FactQuery, RelatedFacts
from processors.candidates import CandidatePolicy, queries_for, select_candidates, shown_cost
from producers.contract import ContextEvent, EventType, FactRetraction, Source
from store.inmemory import InMemoryFactSearch
from tests.support.builders import make_event, make_fact
from tests.support.fakes import BagOfWordsEmbedder

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
USER, ORG = "ada", "org-a"
KEY = MemoryKey(ORG, USER)


def fact(
    content: str, *, pinned: bool = False, connection: str | None = None, days: int = 0
) -> Fact:
    at = T0 - timedelta(days=days)
    return make_fact(USER, content, org=ORG, connection_id=connection, at=at, pinned=pinned)


@dataclass
class ScriptedSearch:
    """Answers `related` with given rankings per query text; records what it was asked."""

    ranked: dict[str, list[Fact]] = field(default_factory=dict)
    pins: list[Fact] = field(default_factory=list)
    stored: list[Fact] = field(default_factory=list)
    degraded: str | None = None
    known: int = 5_000
    asked: list[FactQuery] = field(default_factory=list)

    def related(self, key: MemoryKey, queries: Sequence[FactQuery], limit: int) -> RelatedFacts:
        self.asked += queries
        ranked = tuple(tuple(self.ranked.get(q.text, [])[:limit]) for q in queries)
        return RelatedFacts(ranked, self.degraded)

    def pinned(self, key: MemoryKey) -> list[Fact]:
        return list(self.pins)

    def by_ids(self, key: MemoryKey, fact_ids: Sequence[uuid.UUID]) -> list[Fact]:
        return [f for f in self.stored if f.fact_id in set(fact_ids)]

    def count(self, key: MemoryKey) -> int:
        return self.known


def events(*texts: str, connection: str | None = None) -> list[ContextEvent]:
    return [make_event(USER, t, minutes=i, connection_id=connection) for i, t in enumerate(texts)]


A = [fact(f"The user likes apples, variety {i}.") for i in range(4)]
B = [fact(f"The user owns bikes, model {i}.") for i in range(4)]


def test_related_facts_come_in_rounds_each_once() -> None:
    shared = A[0]
    search = ScriptedSearch(ranked={"apples": [*A[:3]], "bikes": [B[0], shared, B[1]]})
    chosen = select_candidates(KEY, events("apples", "bikes"), search)
    # Round one: each observation's best; round two: each one's second (A[0] already shown).
    assert chosen.facts == (A[0], B[0], A[1], A[2], B[1])
    assert chosen.known == 5_000


@pytest.mark.parametrize("budget_facts", [0, 1, 3, 5])
def test_the_budget_cuts_the_last_rounds_first(budget_facts: int) -> None:
    search = ScriptedSearch(ranked={"apples": A, "bikes": B})
    order = [A[0], B[0], A[1], B[1], A[2], B[2]]
    budget = sum(shown_cost(f) for f in order[:budget_facts])
    policy = CandidatePolicy(per_observation=3, max_tokens=budget)
    chosen = select_candidates(KEY, events("apples", "bikes"), search, policy)
    assert chosen.facts == tuple(order[:budget_facts])


def test_a_fact_too_long_for_what_is_left_gives_way_to_shorter_ones() -> None:
    long = fact("The user keeps a very long note about apples " + "and pears " * 30)
    search = ScriptedSearch(ranked={"apples": [A[0], long, A[1]]})
    policy = CandidatePolicy(max_tokens=shown_cost(A[0]) * 2 + 1)
    assert select_candidates(KEY, events("apples"), search, policy).facts == (A[0], A[1])


def test_pinned_facts_have_their_own_budget_related_and_newest_first() -> None:
    old, new, related = (
        fact("The user is vegetarian.", pinned=True, days=300),
        fact("The user's name is Ada Lovelace.", pinned=True, days=1),
        fact("The user is allergic to apples.", pinned=True, days=500),
    )
    elsewhere = fact("Acme's VAT id is PT123.", pinned=True, connection="mail")
    search = ScriptedSearch(ranked={"apples": [related, A[0]]}, pins=[old, new, related, elsewhere])
    room = shown_cost(related) + shown_cost(new)
    policy = CandidatePolicy(pinned_tokens=room, max_tokens=shown_cost(A[0]))
    chosen = select_candidates(KEY, events("apples"), search, policy)
    # The pinned fact the search found first, then the newest; one of another connection's
    # scope never (the batch has no observation in it); related facts keep their own budget.
    assert chosen.facts == (related, new, A[0])


def test_each_observation_searches_its_own_scope() -> None:
    search = ScriptedSearch()
    mail = make_event(USER, "Acme pays in EUR", minutes=5, connection_id="mail")
    batch = [mail, *events("I like apples")]
    select_candidates(KEY, batch, search)
    assert search.asked == [FactQuery("I like apples", None), FactQuery("Acme pays in EUR", "mail")]


def test_queries_follow_the_observation_labels_and_skip_retractions() -> None:
    later = make_event(USER, "second", minutes=5)
    earlier = make_event(USER, "first", minutes=1)
    scaffold = make_event(
        USER, '"Designer"', EventType.SCAFFOLD_UPDATE, minutes=3, scaffold_key="Title",
        source=Source.AUTONOMOUS,
    )  # fmt: skip
    retraction = make_event(
        USER, FactRetraction(fact_id=A[0].fact_id).model_dump_json(),
        EventType.FACT_RETRACTION, minutes=2,
    )  # fmt: skip
    long = make_event(USER, "x" * 2_000, minutes=6)
    texts = [
        q.text for q in queries_for([later, long, scaffold, retraction, earlier], CandidatePolicy())
    ]
    assert texts == ["first", 'Title: "Designer"', "second", "x" * 500]


def test_a_retracted_fact_is_always_in_even_beyond_the_budget() -> None:
    retraction = make_event(
        USER, FactRetraction(fact_id=B[3].fact_id).model_dump_json(), EventType.FACT_RETRACTION
    )
    search = ScriptedSearch(ranked={"apples": A}, stored=[B[3]])
    policy = CandidatePolicy(max_tokens=0, pinned_tokens=0)
    chosen = select_candidates(KEY, [*events("apples"), retraction], search, policy)
    assert chosen.facts == (B[3],)


def test_a_degraded_search_is_reported() -> None:
    search = ScriptedSearch(ranked={"apples": A}, degraded="vector index unavailable")
    assert select_candidates(KEY, events("apples"), search).degraded == ("vector index unavailable")


def test_in_memory_search_scopes_by_tenant_connection_and_status() -> None:
    mine = fact("The user rides a green bike to work.")
    scoped = fact("The user's bike invoice came by mail.", connection="mail")
    other_org = replace(mine, organization_id="org-b", fact_id=uuid.uuid4())
    gone = replace(fact("The user rides a red bike."), status=FactStatus.CONTRADICTED)
    search = InMemoryFactSearch.over([mine, scoped, other_org, gone], BagOfWordsEmbedder())

    plain, in_mail = search.related(
        KEY, [FactQuery("bike", None), FactQuery("bike", "mail")], limit=5
    ).ranked
    assert plain == (mine,)
    assert set(in_mail) == {mine, scoped}
    assert search.count(KEY) == 2
    assert search.count(MemoryKey("org-b", USER)) == 1


def test_an_empty_memory_is_not_searched() -> None:
    # Counted as empty, so a retraction's target cannot be among its facts either.
    retraction = make_event(
        USER, FactRetraction(fact_id=A[0].fact_id).model_dump_json(), EventType.FACT_RETRACTION
    )
    search = ScriptedSearch(ranked={"apples": [A[0]]}, pins=[B[0]], stored=[A[0]], known=0)
    chosen = select_candidates(KEY, [*events("apples"), retraction], search)
    assert chosen.facts == ()
    assert chosen.known == 0
    assert search.asked == []


def test_a_count_read_already_is_not_asked_again() -> None:
    """A flush counts the memory's facts under its lock: the search is not asked to count."""
    search = ScriptedSearch(ranked={"apples": [A[0]]}, known=1)
    first = select_candidates(KEY, events("apples"), search, known=0)
    assert (first.facts, first.known, search.asked) == ((), 0, [])
    search.known = 0  # the search would say empty; the caller's count says otherwise
    returning = select_candidates(KEY, events("apples"), search, known=7)
    assert (returning.facts, returning.known) == ((A[0],), 7)


def test_selection_is_deterministic() -> None:
    facts = [*A, *B, fact("The user bikes to the apple market.")]
    batch = events("apples and bikes", "the market")
    search = InMemoryFactSearch.over(facts, BagOfWordsEmbedder())
    picks = {select_candidates(KEY, batch, search).facts for _ in range(3)}
    assert len(picks) == 1
