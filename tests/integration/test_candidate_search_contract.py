"""`FactSearch` contract: the live search (Postgres + Chroma) and the in-memory one (shadow
replays) find the same kind of facts for a batch, within the same scope."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from domain.ports import FactQuery, FactSearch, Vector, VectorHit, VectorIndex
from domain.reads import Scope
from memoryd import wiring
from memoryd.dev import free_port
from memoryd.erasure import ErasureRequest
from store.chroma import ReconnectingIndex, http_client
from store.errors import EmbeddingModelError
from store.inmemory import InMemoryFactSearch
from store.read import candidate_search
from store.read.candidate_search import HybridFactSearch
from store.read.fact_queries import PostgresReadModel
from tests.support.builders import make_fact
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
USER, ORG = "ada", "org-a"
KEY = MemoryKey(ORG, USER)


def fact(
    content: str,
    *,
    user: str = USER,
    org: str = ORG,
    connection: str | None = None,
    status: FactStatus = FactStatus.ACTIVE,
    pinned: bool = False,
    days: int = 0,
) -> Fact:
    at = T0 - timedelta(days=days)
    return make_fact(
        user, content, org=org, connection_id=connection, at=at, status=status, pinned=pinned
    )


DENTIST = fact("The user's dentist is Dr. Alvarez in Porto.", days=700)
BEES = fact("The user keeps two beehives on the roof.")
MAIL = fact("Invoices from Acme go to finance by mail.", connection="mail")
HELD = fact("The user might be moving to Oslo next spring.", status=FactStatus.HELD)
GONE = fact("The user's dentist was Dr. Costa.", status=FactStatus.CONTRADICTED)
PINNED = fact("The user is vegetarian.", pinned=True)
OTHER_ORG = fact("The user's dentist is Dr. Okafor in Lagos.", org="org-b")
OTHER_USER = fact("The user's dentist is Dr. Kim.", user="bo")
FILLER = [
    fact(text)
    for text in (
        "The user runs every Sunday morning.",
        "The user prefers short answers.",
        "The user works on the billing team.",
        "The user is learning the cello.",
        "The user drinks green tea, never coffee.",
    )
]
FACTS = [DENTIST, BEES, MAIL, HELD, GONE, PINNED, OTHER_ORG, OTHER_USER, *FILLER]


@pytest.fixture(params=["hybrid", "in_memory"])
def search(request: pytest.FixtureRequest, deployment: Deployment) -> Iterator[FactSearch]:
    with wiring.core(deployment.settings) as c:
        if request.param == "in_memory":
            yield InMemoryFactSearch.over(FACTS, c.embedder)
            return
        assert c.memory.insert_facts(FACTS) == len(FACTS)
        wiring.indexer(c).drain_pending()
        yield wiring.candidate_search(c)


def ids(facts: Sequence[Fact]) -> list[uuid.UUID]:
    return [f.fact_id for f in facts]


def test_the_fact_a_correction_is_about_comes_first(search: FactSearch) -> None:
    queries = [
        FactQuery("Correction: my dentist is Dr. Okafor now"),
        FactQuery("I started a third beehive"),
    ]
    dentist, bees = search.related(KEY, queries, limit=3).ranked
    assert dentist[0].fact_id == DENTIST.fact_id
    assert bees[0].fact_id == BEES.fact_id
    assert len(dentist) <= 3


def test_only_the_tenants_current_facts_in_the_querys_scope(search: FactSearch) -> None:
    everything = [
        FactQuery("dentist invoices Acme mail Oslo vegetarian", c) for c in (None, "mail")
    ]
    plain, in_mail = (set(ids(r)) for r in search.related(KEY, everything, limit=20).ranked)
    allowed = set(ids([DENTIST, BEES, HELD, PINNED, *FILLER]))
    assert plain <= allowed
    assert in_mail <= allowed | {MAIL.fact_id}
    assert MAIL.fact_id in in_mail
    assert HELD.fact_id in plain  # held facts count: observing one again is what activates it
    assert not set(ids([GONE, OTHER_ORG, OTHER_USER])) & (plain | in_mail)


def test_lookups_are_scoped_by_organization_and_user(search: FactSearch) -> None:
    assert ids(search.pinned(KEY)) == [PINNED.fact_id]
    assert search.count(KEY) == len(FACTS) - 3  # not contradicted, not another tenant's
    assert search.count(MemoryKey("org-b", USER)) == 1
    wanted = [DENTIST.fact_id, OTHER_ORG.fact_id, GONE.fact_id, MAIL.fact_id]
    assert ids(search.by_ids(KEY, wanted)) == sorted([DENTIST.fact_id, MAIL.fact_id], key=str)
    assert search.related(KEY, [], limit=3).ranked == ()


def test_with_chroma_down_the_keyword_side_still_answers(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        # The index the process builds, on an address where no Chroma answers.
        down = ReconnectingIndex(
            lambda: http_client(f"http://127.0.0.1:{free_port()}"),
            c.embedder,
            c.settings.chroma.collection,
        )
        try:
            search = HybridFactSearch(
                c.pool, PostgresReadModel(c.pool, c.subjects), down, c.embedder
            )
            found = search.related(KEY, [FactQuery("my dentist Dr. Alvarez")], limit=3)
        finally:
            down.close()
        assert found.degraded is not None
        assert "unavailable" in found.degraded
        assert found.ranked[0][0].fact_id == DENTIST.fact_id

    deployment.with_core(check)


class HeldVectors:
    """The process's vectors by text, as the embedding cache holds them."""

    def __init__(self, held: dict[str, Vector] | None = None) -> None:
        self.held = held or {}
        self.remembered: dict[str, Vector] = {}

    def known(self, texts: Sequence[str]) -> dict[str, Vector]:
        return {t: self.held[t] for t in texts if t in self.held}

    def remember(self, vectors: Mapping[str, Vector]) -> None:
        self.remembered.update(vectors)


class FetchCountingIndex:
    def __init__(self, index: VectorIndex) -> None:
        self._index = index
        self.fetched: list[uuid.UUID] = []

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        self.fetched += fact_ids
        return self._index.embeddings(fact_ids)

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        return self._index.query(scope, text, n)


QUERIES = [FactQuery("my dentist and my beehives"), FactQuery("Acme invoices", "mail")]


def test_the_found_facts_stored_vectors_are_remembered_by_text(deployment: Deployment) -> None:
    """The gate compares proposals with the facts found: their vectors come from the index."""

    new_bees = "The user keeps two beehives and a wasp nest on the roof."

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        with c.pool.connection() as conn:  # a run's new version, as the fact upsert writes it
            conn.execute(
                "UPDATE memory_facts SET content = %s, indexed_at = NULL, version = version + 1"
                " WHERE fact_id = %s",
                (new_bees, BEES.fact_id),
            )
        held = HeldVectors()
        search = HybridFactSearch(
            c.pool, PostgresReadModel(c.pool, c.subjects), c.index, c.embedder, vectors=held
        )
        found = {f.content for r in search.related(KEY, QUERIES, limit=3).ranked for f in r}
        assert {DENTIST.content, MAIL.content, new_bees} <= found
        # Chroma still holds the old text's vector: the new text is not remembered with it.
        assert set(held.remembered) == found - {new_bees}
        for text, vector in held.remembered.items():
            assert np.allclose(vector, c.embedder.embed([text])[0], atol=1e-6)

    deployment.with_core(check)


def test_a_stored_fact_whose_text_the_process_holds_is_not_fetched(
    deployment: Deployment,
) -> None:
    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()

        def search(held: HeldVectors) -> tuple[list[list[uuid.UUID]], list[uuid.UUID]]:
            index = FetchCountingIndex(c.index)
            hybrid = HybridFactSearch(
                c.pool, PostgresReadModel(c.pool, c.subjects), index, c.embedder, vectors=held
            )
            ranked = [ids(r) for r in hybrid.related(KEY, QUERIES, limit=3).ranked]
            return ranked, index.fetched

        everything, fetched = search(HeldVectors())
        assert DENTIST.fact_id in fetched
        held = HeldVectors({DENTIST.content: c.embedder.embed([DENTIST.content])[0]})
        ranked, fetched_again = search(held)
        assert ranked == everything
        assert set(fetched_again) == set(fetched) - {DENTIST.fact_id}

    deployment.with_core(check)


class BrokenModel:
    model_name = "broken"
    dimension = 384

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        raise EmbeddingModelError("cannot read the model file")


def test_a_model_failure_while_postgres_answers_is_raised(deployment: Deployment) -> None:
    # The queries are embedded on a thread of their own: its error must not be lost there.
    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        search = HybridFactSearch(
            c.pool, PostgresReadModel(c.pool, c.subjects), c.index, BrokenModel()
        )
        with pytest.raises(EmbeddingModelError, match="cannot read the model file"):
            search.related(KEY, [FactQuery("my dentist Dr. Alvarez")], limit=3)

    deployment.with_core(check)


def test_exact_and_ann_dense_paths_agree(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    def top(c: wiring.Core) -> Callable[[], list[uuid.UUID]]:
        search = wiring.candidate_search(c)
        query = [FactQuery("beekeeping and honey"), FactQuery("tea or coffee")]
        return lambda: [r[0].fact_id for r in search.related(KEY, query, limit=2).ranked]

    with wiring.core(deployment.settings) as c:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        exact = top(c)()
        monkeypatch.setattr(candidate_search, "EXACT_SEARCH_MAX_FACTS", 0)
        ann = top(c)()
    assert exact == ann == [BEES.fact_id, FILLER[4].fact_id]


def test_a_fact_closed_since_chroma_heard_of_it_takes_no_place(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chroma's status metadata follows Postgres a moment later: a fact a run has just closed
    # still matches there, and must not cost the batch one of the facts it asked for.
    query = [FactQuery("beekeeping and honey")]  # no fact has these words: dense alone answers
    with wiring.core(deployment.settings) as c:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        scope = Scope(key=KEY, statuses=(FactStatus.ACTIVE, FactStatus.HELD))
        assert BEES.fact_id in [h.fact_id for h in c.index.query(scope, "beekeeping and honey", 3)]
        with c.pool.connection() as conn:
            conn.execute(
                "UPDATE memory_facts SET status = 'contradicted' WHERE fact_id = %s",
                (BEES.fact_id,),
            )
        exact = ids(wiring.candidate_search(c).related(KEY, query, limit=3).ranked[0])
        monkeypatch.setattr(candidate_search, "EXACT_SEARCH_MAX_FACTS", 0)
        ann = ids(wiring.candidate_search(c).related(KEY, query, limit=3).ranked[0])
    assert len(ann) == 3
    assert BEES.fact_id not in ann
    assert ann == exact


class CountingIndex:
    """The real index, counting the filtered queries asked of it."""

    def __init__(self, index: VectorIndex) -> None:
        self._index, self.queries = index, 0

    def query(self, scope: Scope, text: str, n: int) -> list[VectorHit]:
        self.queries += 1
        return self._index.query(scope, text, n)

    def __getattr__(self, name: str) -> object:
        return getattr(self._index, name)


def test_chroma_is_asked_again_a_bounded_number_of_times_for_stale_answers(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(candidate_search, "EXACT_SEARCH_MAX_FACTS", 0)
    monkeypatch.setattr(candidate_search, "MAX_ASKED_GROWTH", 2)
    # Facts gone from Postgres that Chroma still holds, nearer the query than any other.
    gone = [fact(f"The user keeps bees for their honey, hive number {i}.") for i in range(12)]
    with wiring.core(deployment.settings) as c:
        c.memory.insert_facts([*FACTS, *gone])
        wiring.indexer(c).drain_pending()
        with c.pool.connection() as conn:
            conn.execute(
                "DELETE FROM memory_facts WHERE fact_id = ANY(%s)", ([f.fact_id for f in gone],)
            )
        index = CountingIndex(c.index)
        search = HybridFactSearch(c.pool, PostgresReadModel(c.pool, c.subjects), index, c.embedder)  # type: ignore[arg-type]
        found = search.related(KEY, [FactQuery("beekeeping and honey")], limit=1)
    assert index.queries == 2  # for 1, then 2; not on until Chroma runs out
    assert not set(ids(found.ranked[0])) & {f.fact_id for f in gone}


def test_an_unindexed_fact_is_found_by_keyword(deployment: Deployment) -> None:
    late = replace(fact("The user's passport expires in March."), created_by_run=uuid.uuid4())

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(FACTS)
        wiring.indexer(c).drain_pending()
        c.memory.insert_facts([late])  # written by a run, not indexed yet
        found = wiring.candidate_search(c).related(KEY, [FactQuery("renew my passport")], limit=3)
        # Keyword-only, it ties with the dense side's best; found either way.
        assert late.fact_id in ids(found.ranked[0])

    deployment.with_core(check)


ENTRY_QUERIES = [
    *QUERIES,
    FactQuery("beekeeping and honey"),
    FactQuery("tea or coffee"),
    FactQuery("my dentist Dr. Alvarez"),
    FactQuery("moving to Oslo", "mail"),
    FactQuery("renew my passport"),
]


def ranked_ids(search: FactSearch) -> list[list[uuid.UUID]]:
    return [ids(r) for r in search.related(KEY, ENTRY_QUERIES, limit=3).ranked]


def test_a_memorys_entry_answers_as_the_exact_and_ann_paths(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    with wiring.core(deployment.settings) as c:
        c.memory.insert_facts(FACTS)
        with c.pool.connection() as conn:  # the memory's row, which a run would have written
            conn.execute(
                "INSERT INTO user_memory (organization_id, user_id) VALUES (%s, %s)", (ORG, USER)
            )
        wiring.indexer(c).drain_pending()
        late = replace(fact("The user's passport expires in March."), created_by_run=uuid.uuid4())
        c.memory.insert_facts([late])  # written by a run, not indexed yet: keyword only
        exact = ranked_ids(wiring.candidate_search(c))
        assert len(c.dense_cache) == 0
        monkeypatch.setattr(candidate_search, "EXACT_SEARCH_MAX_FACTS", 0)
        ann = ranked_ids(
            HybridFactSearch(c.pool, PostgresReadModel(c.pool, c.subjects), c.index, c.embedder)
        )
        held = ranked_ids(wiring.candidate_search(c))
        assert c.dense_cache.get(KEY) is not None  # the entry answered
    assert exact == ann == held
    assert DENTIST.fact_id in held[0]
    assert held[1][0] == MAIL.fact_id
    assert late.fact_id in held[-1]


def test_the_processors_sweep_drops_an_erased_memorys_entry_and_keeps_an_older_one(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(candidate_search, "EXACT_SEARCH_MAX_FACTS", 0)
    bo = MemoryKey(ORG, "bo")
    with wiring.core(deployment.settings) as c:
        c.memory.insert_facts(FACTS)
        with c.pool.connection() as conn:
            for key in (KEY, bo):
                conn.execute(
                    "INSERT INTO user_memory (organization_id, user_id) VALUES (%s, %s)",
                    (key.organization_id, key.user_id),
                )
        wiring.indexer(c).drain_pending()
        search = wiring.candidate_search(c)
        for key in (KEY, bo):
            search.related(key, [FactQuery("my dentist")], limit=3)
        assert c.dense_cache.get(KEY) is not None
        assert c.dense_cache.get(bo) is not None
        with c.pool.connection() as conn:  # a run of bo's
            conn.execute(
                "UPDATE user_memory SET version = version + 1"
                " WHERE organization_id = %s AND user_id = %s",
                (ORG, bo.user_id),
            )
        pub = wiring.publisher(deployment.settings)
        try:
            request = ErasureRequest("dpo@example.com", "GDPR art. 17", "ticket-18")
            wiring.eraser(c, pub).forget(KEY, request)
        finally:
            pub.close()
        assert wiring.sweep_candidate_entries(c) == 1
        assert c.dense_cache.get(KEY) is None
        assert c.dense_cache.get(bo) is not None
