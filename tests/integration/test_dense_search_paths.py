"""Dense retrieval: the cached per-memory matrix, the uncached fetch by id and Chroma's
filtered ANN query must agree on what is relevant and respect the same scope. Keyword
retrieval: the in-process BM25 index beside the matrix must rank as the SQL BM25 does.

The read path serves from the cached entry; the others are the references it replaced.
"""

from __future__ import annotations

import random

import pytest

from domain.ids import MemoryKey
from domain.model import FactStatus
from domain.reads import Scope
from memoryd import wiring
from producers.contract import EventType
from store.read.context_service import ContextService
from store.read.dense import DenseSearch
from store.read.dense_reads import DenseReads, MemoryRows
from store.read.memory_entry import DenseCache
from store.read.ranking import Budget
from tests.support.builders import key_of, make_event, make_fact
from tests.support.deployment import Deployment, seed_core

pytestmark = pytest.mark.integration

OBSERVATIONS = [
    ("I keep bees on the roof of my building", EventType.FACT, None),
    ("My daughter Lina starts school in January", EventType.FACT, None),
    ("I drink espresso, never after 2pm", EventType.PREFERENCE, None),
    (
        "I am migrating the settlement ledger from MySQL to Postgres",
        EventType.PROJECT_DETAILS,
        "gh",
    ),
    ("I am allergic to peanuts", EventType.FACT, None),
    ("The hive inspection checklist lives in the repo wiki", EventType.FACT, "gh"),
]
OMAR = key_of("omar")
QUERIES = ["beekeeping honey hives", "what is the user allergic to", "database migration"]


def _search(c: wiring.Core, cache: DenseCache) -> DenseSearch:
    return DenseSearch(DenseReads(c.pool), c.index, c.embedder, cache)


def test_cached_exact_and_ann_dense_searches_agree(deployment: Deployment) -> None:
    events = [
        make_event("omar", text, kind, minutes=i, connection_id=conn)
        for i, (text, kind, conn) in enumerate(OBSERVATIONS)
    ]
    events.append(make_event("other", "I keep bees and sell honey", minutes=9))
    events.append(make_event("omar", "I keep bees too", minutes=9, org="org-b"))
    deployment.publish(events)
    deployment.run_both()

    def compare(c: wiring.Core) -> None:
        search = _search(c, DenseCache(2**20))
        reads = wiring.read_model(c)
        stamp = reads.memory_stamp(OMAR)
        assert stamp is not None
        for connections in [(), ("gh",)]:
            scope = Scope(OMAR, connections)
            ids = reads.indexed_ids(scope, 1_000)
            for query in QUERIES:
                cached, vectors = search.search(scope, stamp, query, 4)
                exact, _ = c.index.score(query, ids, 4)
                ann = c.index.query(scope, query, 4)
                assert [h.fact_id for h in cached] == [h.fact_id for h in exact]
                assert [h.similarity for h in cached] == pytest.approx(
                    [h.similarity for h in exact], abs=1e-5
                )
                assert [h.fact_id for h in cached] == [h.fact_id for h in ann]
                assert {h.fact_id for h in ann} <= set(ids)
                assert all(h.fact_id in vectors for h in cached)
            assert len(ids) == len(search.memory(OMAR, stamp).mask(scope).nonzero()[0])

    deployment.with_core(compare)

    def top_facts(c: wiring.Core) -> list[str]:
        with wiring.read_path(c) as service:
            bundle = service.assemble(OMAR, "beekeeping honey hives", budget=Budget.LEAN)
        assert not bundle.degraded
        # The other user's and the other organization's bee facts are nearer still.
        assert all(r.fact.key == OMAR for r in bundle.facts)
        return [r.fact.content for r in bundle.facts]

    # No keyword matches this query: the dense stage alone must put the bees first.
    assert "bees" in deployment.with_core(top_facts)[0]


def test_read_path_bundles_unchanged_by_the_cache(deployment: Deployment) -> None:
    events = [
        make_event("omar", text, kind, minutes=i, connection_id=conn)
        for i, (text, kind, conn) in enumerate(OBSERVATIONS)
    ]
    deployment.publish(events)
    deployment.run_both()

    def bundles(c: wiring.Core, service: ContextService) -> list[list[str]]:
        out = []
        for query in QUERIES:
            bundle = service.assemble(OMAR, query, ["gh"], Budget.DEEP)
            assert not bundle.degraded
            out.append([r.fact.content for r in bundle.facts])
        return out

    def both(c: wiring.Core) -> tuple[list[list[str]], list[list[str]]]:
        with wiring.read_path(c) as cached:
            with_cache = bundles(c, cached)
        uncached = ContextService(wiring.read_model(c), c.index, c.clock)
        return with_cache, bundles(c, uncached)

    with_cache, without = deployment.with_core(both)
    assert with_cache == without, (with_cache, without)
    assert all(with_cache)


def test_a_new_version_brings_new_facts_and_drops_closed_ones(deployment: Deployment) -> None:
    deployment.publish([make_event("omar", "I keep bees on the roof of my building")])
    deployment.run_both()
    cache = DenseCache(2**20)

    def top(c: wiring.Core) -> list[str]:
        search = _search(c, cache)
        stamp = wiring.read_model(c).memory_stamp(OMAR)
        assert stamp is not None
        scope = Scope(OMAR, (), (FactStatus.ACTIVE,))
        hits, _ = search.search(scope, stamp, "peanut allergy", 5)
        contents = {f.fact_id: f.content for f in c.memory.facts(OMAR)}
        return [contents[h.fact_id] for h in hits if h.fact_id in contents]

    first = deployment.with_core(top)
    assert len(first) == 1
    deployment.publish([make_event("omar", "I am allergic to peanuts", minutes=5)])
    deployment.run_both()
    second = deployment.with_core(top)
    assert "peanuts" in second[0]
    assert len(second) == 2


WORDS = [
    "bees",
    "roof",
    "honey",
    "hive",
    "school",
    "daughter",
    "espresso",
    "ledger",
    "postgres",
    "migration",
    "peanuts",
    "allergic",
    "wiki",
    "checklist",
    "garden",
    "bicycle",
    "running",
    "marathon",
    "piano",
]
KEYWORD_QUERIES = [
    "bees on the roof",
    "honey honey hive",
    "is the daughter allergic to peanuts",
    "postgres ledger migration checklist",
    "marathon running piano garden bicycle school",
    "volcano",
    "the and of",
]


def test_keyword_index_ranks_as_the_sql_bm25(deployment: Deployment) -> None:
    """Random texts over a small vocabulary: repeated words (tf > 1), texts of every length,
    many equal scores (ties by id), and a scope that cuts the statistics (document count,
    frequencies, mean length) differently from the whole memory."""
    rng = random.Random(11)
    facts = [
        make_fact(
            "omar",
            f"{' '.join(rng.choices(WORDS, k=rng.randint(1, 9)))} note {i}",
            connection_id=rng.choice([None, None, "gh", "mail"]),
            status=rng.choice([FactStatus.ACTIVE] * 3 + [FactStatus.ARCHIVED]),
            context_type=rng.choice(["fact", "fact", "tool_output"]),
        )
        for i in range(300)
    ]
    scopes = [
        Scope(OMAR),
        Scope(OMAR, ("gh",)),
        Scope(OMAR, ("gh", "mail"), (FactStatus.ACTIVE, FactStatus.ARCHIVED)),
        Scope(OMAR, ("mail",), context_types=("tool_output",)),
        Scope(OMAR, statuses=()),
    ]

    def compare(c: wiring.Core) -> int:
        seed_core(c, "omar", facts)
        seed_core(c, "other", [make_fact("other", "bees honey roof hive")])
        search = _search(c, DenseCache(2**24))
        reads = wiring.read_model(c)
        stamp = reads.memory_stamp(OMAR)
        assert stamp is not None
        compared = 0
        for scope in scopes:
            search.search(scope, stamp, "bees", 1)  # the turn's dense stage builds the entry
            for query in KEYWORD_QUERIES:
                for limit in (5, 40, 400):
                    sql = [f.fact_id for f in reads.keyword_search(scope, query, limit)]
                    assert search.keyword(scope, stamp, query, limit) == sql, (scope, query)
                    compared += len(sql)
        return compared

    assert deployment.with_core(compare) > 1_000


def test_keyword_index_waits_for_the_dense_stage_entry(deployment: Deployment) -> None:
    """Without an entry at the turn's stamp (Chroma was down when it was to be built) the
    keyword stage says so, and the read path takes the SQL BM25 instead."""

    def check(c: wiring.Core) -> None:
        seed_core(c, "omar", [make_fact("omar", "I keep bees on the roof")])
        search = _search(c, DenseCache(2**20))
        stamp = wiring.read_model(c).memory_stamp(OMAR)
        assert stamp is not None
        assert search.keyword(Scope(OMAR), stamp, "bees", 5) is None
        search.search(Scope(OMAR), stamp, "bees", 5)
        assert search.keyword(Scope(OMAR), stamp, "bees", 5) is not None

    deployment.with_core(check)


def test_a_memorys_rows_come_in_the_text_order_of_their_ids(deployment: Deployment) -> None:
    """An entry's rows are in fact-id order, which ties are broken by as in the SQL searches;
    Postgres sorts a uuid by its bytes, which must be its text form's order."""
    rng = random.Random(3)
    facts = [make_fact("omar", f"fact {rng.random()}") for _ in range(200)]

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(facts)
        ids = [r.fact_id for r in DenseReads(c.pool).rows(OMAR).rows]
        assert len(ids) == len(facts)
        assert ids == sorted(ids, key=str)

    deployment.with_core(check)


def test_an_entry_updated_in_place_ranks_as_one_built_from_nothing(
    deployment: Deployment,
) -> None:
    """Real runs and the real indexer between versions: the entry a process brings up to date
    from the rows written since (`entry_delta`) searches as the entry a fresh process builds
    from all the rows, and as Chroma's query and the SQL BM25 rank."""
    cache = DenseCache(2**24)
    scope = Scope(OMAR, ("gh",))
    full_reads: list[object] = []

    class CountedReads(DenseReads):
        def rows(self, key: MemoryKey) -> MemoryRows:
            full_reads.append(key)
            return super().rows(key)

    def updating(c: wiring.Core) -> DenseSearch:
        return DenseSearch(CountedReads(c.pool), c.index, c.embedder, cache)

    def ranks(c: wiring.Core, search: DenseSearch) -> list[list[object]]:
        reads = wiring.read_model(c)
        stamp = reads.memory_stamp(OMAR)
        assert stamp is not None
        out: list[list[object]] = []
        for query in [*QUERIES, *KEYWORD_QUERIES]:
            hits, _ = search.search(scope, stamp, query, 4)
            out.append([h.fact_id for h in hits])
            out.append(list(search.keyword(scope, stamp, query, 4) or []))
        return out

    for i, (text, kind, conn) in enumerate(OBSERVATIONS):
        deployment.publish([make_event("omar", text, kind, minutes=i, connection_id=conn)])
        deployment.run_both()
        updated = deployment.with_core(lambda c: ranks(c, updating(c)))
        fresh = deployment.with_core(lambda c: ranks(c, _search(c, DenseCache(2**24))))
        assert updated == fresh
    assert len(full_reads) == 1  # the first version; every later one from the changes

    def against_references(c: wiring.Core) -> None:
        search = _search(c, cache)
        reads = wiring.read_model(c)
        stamp = reads.memory_stamp(OMAR)
        assert stamp is not None
        for query in QUERIES:
            hits, _ = search.search(scope, stamp, query, 4)
            assert [h.fact_id for h in hits] == [h.fact_id for h in c.index.query(scope, query, 4)]
        for query in KEYWORD_QUERIES:
            expected = [f.fact_id for f in reads.keyword_search(scope, query, 4)]
            assert search.keyword(scope, stamp, query, 4) == expected

    deployment.with_core(against_references)
