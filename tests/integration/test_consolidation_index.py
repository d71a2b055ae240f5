"""Chroma going down in the middle of a consolidation: Postgres stays the truth.

A `chroma run` server of the test's own is stopped while the backend is thinking. The run
still commits, its facts wait with indexed_at NULL, the read path answers degraded and never
shows the fact the run contradicted. With Chroma back (and still believing that fact active),
the read path filters it by its Postgres status; the drain then indexes every pending fact
exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from domain.model import Fact, LedgerEntry
from memoryd import wiring
from memoryd.dev import LocalChroma, free_port
from memoryd.jobs import INDEX_DRAIN_LOCK, _drain_job, drain_index_once
from memoryd.settings import ChromaSettings
from processors.cost import embedding_entry
from processors.schema import ConsolidationRequest
from producers.contract import EventType
from store.chroma import close_client, http_client
from tests.support.builders import key_of, make_event, make_fact
from tests.support.deployment import Deployment, seed_core
from tests.support.fakes import FlakyBackend
from tests.support.services import started

pytestmark = pytest.mark.integration

QUERY = "Which team does the user work in?"


@pytest.fixture
def chroma(tmp_path: Path) -> Iterator[LocalChroma]:
    with started(
        lambda: LocalChroma(tmp_path / "chroma-server", free_port(), stop_on_exit=True), 60.0
    ) as server:
        yield server


@pytest.fixture
def over_http(deployment: Deployment, chroma: LocalChroma) -> Deployment:
    settings = deployment.settings.model_copy(
        update={"chroma": ChromaSettings(mode="http", url=chroma.url)}
    )
    return Deployment(settings, deployment.dsn)


class StopsChromaWhileThinking(FlakyBackend):
    """The offline backend, except that Chroma dies while it works on the batch."""

    def __init__(self, chroma: LocalChroma) -> None:
        super().__init__()
        self._chroma = chroma

    def before(self, request: ConsolidationRequest) -> None:
        self._chroma.stop()


def chroma_contents(url: str, collection: str) -> dict[str, dict[str, Any]]:
    """Every record of the collection: id -> metadata, read straight from the server."""
    client = http_client(url)
    try:
        got = client.get_collection(collection, embedding_function=None).get(include=["metadatas"])
    finally:
        close_client(client)
    assert len(got["ids"]) == len(set(got["ids"]))
    return {i: dict(m or {}) for i, m in zip(got["ids"], got["metadatas"] or [], strict=True)}


def facts_by_content(deployment: Deployment) -> dict[str, tuple[Any, ...]]:
    rows = deployment.query("SELECT content, fact_id, status, indexed_at FROM memory_facts")
    return {r[0]: r[1:] for r in rows}


def test_chroma_down_mid_run_then_back(over_http: Deployment, chroma: LocalChroma) -> None:
    d = over_http
    collection = d.settings.chroma.collection
    d.publish(
        [make_event("ada", "I work in engineering", minutes=0),
         make_event("ada", "I prefer short answers", EventType.PREFERENCE, minutes=1)]
    )  # fmt: skip
    d.run_processor()
    first = facts_by_content(d)
    assert len(first) == 2
    assert all(indexed is not None for _, _, indexed in first.values())
    [(engineering_id, *_)] = [v for k, v in first.items() if "engineering" in k]

    d.publish(
        [make_event("ada", "Actually I moved to design", EventType.CORRECTION, minutes=60),
         make_event("ada", "I live in Lisbon", minutes=61)]
    )  # fmt: skip
    d.run_processor(StopsChromaWhileThinking(chroma))

    # Consolidated all the same: memory moved on, the changed facts wait for the index.
    assert [r[0] for r in d.query("SELECT status FROM consolidation_runs ORDER BY seq")] == [
        "succeeded",
        "succeeded",
    ]
    facts = facts_by_content(d)
    pending = {k for k, (_, _, indexed) in facts.items() if indexed is None}
    assert pending == {k for k in facts if "engineering" in k or "design" in k or "Lisbon" in k}
    assert facts[next(k for k in facts if "engineering" in k)][1] == "contradicted"

    # One process through the outage and after it: the index reconnects by itself.
    with wiring.core(d.settings) as c, wiring.read_path(c) as service:
        down = service.assemble(key_of("ada"), QUERY)
        assert down.degraded
        assert "design" in down.working_memory
        assert not any("engineering" in r.fact.content for r in down.facts)

        chroma.start(timeout=60)
        # Chroma is back but behind: it still holds the engineering fact as active.
        assert chroma_contents(chroma.url, collection)[str(engineering_id)]["status"] == "active"
        behind = service.assemble(key_of("ada"), QUERY)
        assert not behind.degraded
        assert not any("engineering" in r.fact.content for r in behind.facts)

        assert drain_index_once(c) == len(pending)
        assert drain_index_once(c) == 0
        caught_up = service.assemble(key_of("ada"), QUERY)
        assert any("design" in r.fact.content for r in caught_up.facts)
        assert not any("engineering" in r.fact.content for r in caught_up.facts)

    contents = chroma_contents(chroma.url, collection)
    in_postgres = {str(r[0]): r[1] for r in d.query("SELECT fact_id, status FROM memory_facts")}
    assert {i: m["status"] for i, m in contents.items()} == in_postgres
    assert d.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL") == [(0,)]


def test_two_indexers_marking_the_same_pending_facts_book_them_once(
    over_http: Deployment, chroma: LocalChroma
) -> None:
    d = over_http
    d.publish([make_event("ada", "I live in Lisbon", minutes=0)])
    d.run_processor(StopsChromaWhileThinking(chroma))
    [(fact_id,)] = d.query("SELECT fact_id FROM memory_facts WHERE indexed_at IS NULL")

    def race(c: wiring.Core) -> tuple[list[int], list[int]]:
        # Both read the pending facts before either marks them: the flush path of one
        # instance and the scheduled drain of another, say.
        facts = c.memory.pending_index()
        priced: list[int] = []

        def ledger_for(marked: Sequence[Fact]) -> list[LedgerEntry]:
            priced.append(len(marked))
            return [
                embedding_entry(
                    c.prices, run_id=f.created_by_run, batch_key=f"{f.fact_id}:{f.version}",
                    key=f.key, model="m", texts=1,
                    at=c.clock(),
                )
                for f in marked
            ]  # fmt: skip

        marked = [len(c.memory.mark_indexed(facts, c.clock(), ledger_for)) for _ in range(2)]
        return marked, priced

    assert d.with_core(race) == ([1, 0], [1, 0])
    assert d.query(
        "SELECT count(*), sum(units) FROM credit_ledger WHERE operation = 'embedding'"
    ) == [(1, 1)]
    indexed = d.query("SELECT indexed_at IS NOT NULL FROM memory_facts WHERE fact_id = %s",
                      (fact_id,))  # fmt: skip
    assert indexed == [(True,)]


def test_a_processor_that_does_not_drain_still_sets_the_pending_gauge(
    deployment: Deployment,
) -> None:
    def check(c: wiring.Core) -> tuple[float | None, int]:
        seed_core(c, "ada", [make_fact("ada", "Ada lives in Porto")], index=False)
        with c.pool.connection() as holder:  # another processor is draining
            holder.execute("SELECT pg_advisory_lock(%s)", (INDEX_DRAIN_LOCK,))
            _drain_job(c)
            holder.execute("SELECT pg_advisory_unlock(%s)", (INDEX_DRAIN_LOCK,))
        return c.registry.get_sample_value("memoryd_facts_pending_index"), c.index.count()

    assert deployment.with_core(check) == (1.0, 0)
