"""`memoryd index-verify` on Postgres and Chroma: a collection that lost vectors, holds one
with a stale status and one of a fact no row holds is reported by a dry run (exit 1) and
repaired by a run (exit 0); a memory's cached entry built while a vector was lost scores it
again at its next version, and the repair books nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from consumers.index_check import IndexCheck, IndexChecker
from domain.codec import fact_metadata
from domain.model import Fact, FactStatus
from domain.ports import StoredFact
from domain.reads import MemoryStamp, Scope
from memoryd import wiring
from memoryd.cli import build_parser
from memoryd.ops.config import MaintenanceSettings
from memoryd.ops.maintenance import INDEX_RULES, MaintenanceRunner
from memoryd.ops.metrics import MaintenanceMetrics
from store.read.dense import DenseSearch
from store.read.dense_reads import DenseReads
from store.read.memory_entry import DenseCache
from store.write.indexed_facts import PostgresIndexedFacts
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

OMAR = key_of("omar")


def verify(deployment: Deployment, capsys: pytest.CaptureFixture[str], *argv: str) -> int:
    args = build_parser().parse_args(["index-verify", *argv])
    capsys.readouterr()
    code: int = args.fn(deployment.settings, args)
    return code


def test_a_damaged_collection_is_reported_then_repaired_and_entries_score_it_again(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = [
        make_fact("omar", text, org=org)
        for org in ("org-a", "org-b")
        for text in (
            "omar rows on the river every Sunday",
            "omar is allergic to peanuts",
            "omar's daughter is called Ines",
        )
    ]
    lost, stale = facts[1], facts[5]  # one of each organization's omar
    ghost = make_fact("omar", "omar's erased address", org="org-c")

    # Shared by the two processes' reads below, as a process's entries outlive a connection.
    cache = DenseCache(2**26)

    def dense(c: wiring.Core) -> DenseSearch:
        return DenseSearch(DenseReads(c.pool), c.index, c.embedder, cache)

    def damage(c: wiring.Core) -> int:
        c.memory.insert_facts(facts)
        assert wiring.indexer(c).drain_pending() == len(facts)
        c.index.delete([lost.fact_id])
        c.index.upsert([replace(stale, status=FactStatus.ARCHIVED), ghost])
        entry = dense(c).memory(OMAR, MemoryStamp(None, 1))
        assert not entry.vectored[entry.row_of[lost.fact_id]]
        return int(entry.vectored.sum())

    vectored = deployment.with_core(damage)
    ledger = deployment.query("SELECT count(*) FROM credit_ledger")

    assert verify(deployment, capsys, "--dry-run") == 1
    out = capsys.readouterr().out
    assert "6 fact(s) marked indexed: 1 absent from the index, 1 held with another" in out
    assert "6 id(s) in the index: 1 of facts no row holds, 0 deleted" in out

    assert verify(deployment, capsys) == 0
    out = capsys.readouterr().out
    assert "1 held with another text or metadata, 2 written again" in out
    assert "7 id(s) in the index: 1 of facts no row holds, 1 deleted" in out
    assert verify(deployment, capsys, "--dry-run") == 0
    assert deployment.query("SELECT count(*) FROM credit_ledger") == ledger

    def repaired(c: wiring.Core) -> None:
        rows = c.memory.facts_by_id([f.fact_id for f in facts])
        assert c.index.stored([f.fact_id for f in [*facts, ghost]]) == {
            f.fact_id: StoredFact(f.content, fact_metadata(f)) for f in rows
        }
        # The entry built while the vector was lost takes it up at the memory's next version.
        assert dense(c).memory(OMAR, MemoryStamp(None, 1)).vectored.sum() == vectored
        entry = dense(c).memory(OMAR, MemoryStamp(None, 2))
        assert entry.vectored.sum() == vectored + 1
        (query,) = c.embedder.embed([lost.content])
        scope = Scope(OMAR)
        best = DenseSearch.nearest(entry, scope, query, 1)
        assert [h.fact_id for h in best] == [lost.fact_id]
        assert np.isclose(best[0].similarity, 1.0, atol=1e-5)

    deployment.with_core(repaired)


class NewVersionMeanwhile(PostgresIndexedFacts):
    """A run writes a new version of the facts between the check's read and its repair."""

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        with self._pool.connection() as conn:
            conn.execute(
                "UPDATE memory_facts SET version = version + 1, indexed_at = NULL"
                " WHERE fact_id = ANY(%s)",
                (list(fact_ids),),
            )
        return super().repair(fact_ids, write)


def test_a_version_written_after_the_read_is_left_to_the_indexer(deployment: Deployment) -> None:
    facts = [make_fact("omar", f"omar visited {city}") for city in ("Lima", "Quito", "Cusco")]

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(facts)
        wiring.indexer(c).drain_pending()
        c.index.delete([facts[0].fact_id])
        result = IndexChecker(NewVersionMeanwhile(c.pool), c.index).check(repair=True)
        assert (result.absent, result.repaired) == (1, 0)
        assert c.index.stored([facts[0].fact_id]) == {}
        assert c.memory.pending_backlog().count == 1

    deployment.with_core(check)


def test_a_fact_being_written_is_skipped_not_waited_for(deployment: Deployment) -> None:
    facts = [make_fact("omar", f"omar flew to {city}") for city in ("Oslo", "Bergen")]
    first, second = sorted(facts, key=lambda f: f.fact_id)

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(facts)
        wiring.indexer(c).drain_pending()
        c.index.delete([first.fact_id, second.fact_id])
        repaired: list[list[Fact]] = []
        with psycopg.connect(deployment.dsn) as writer:
            # Another transaction holds the first row as a flush writing it would.
            writer.execute(
                "SELECT 1 FROM memory_facts WHERE fact_id = %s FOR UPDATE", (first.fact_id,)
            )
            repair = threading.Thread(
                target=lambda: repaired.append(
                    PostgresIndexedFacts(c.pool).repair(
                        [first.fact_id, second.fact_id], c.index.upsert
                    )
                )
            )
            repair.start()
            repair.join(timeout=15)
            waited = repair.is_alive()
            writer.rollback()
        repair.join(timeout=15)
        assert not waited, "the repair waited for a row another transaction holds"
        assert [[f.fact_id for f in batch] for batch in repaired] == [[second.fact_id]]
        assert set(c.index.stored([first.fact_id, second.fact_id])) == {second.fact_id}

    deployment.with_core(check)


@pytest.mark.parametrize("id_page", [3, 4, 8])
def test_the_listing_by_pages_finds_every_id_of_the_collection(
    deployment: Deployment, id_page: int
) -> None:
    facts = [make_fact("omar", f"omar visited {n} museums in May") for n in range(7)]
    ghost = make_fact("omar", "omar's erased passport number", org="org-c")

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(facts)
        wiring.indexer(c).drain_pending()
        c.index.upsert([ghost])  # 8 ids: pages of 3 end short, of 4 and 8 end full
        checker = IndexChecker(PostgresIndexedFacts(c.pool), c.index, page=2, id_page=id_page)
        assert checker.check(repair=True) == IndexCheck(indexed=7, held=8, orphans=1, removed=1)
        assert checker.check(repair=False) == IndexCheck(indexed=7, held=7)

    deployment.with_core(check)


def test_the_index_maintenance_job_repairs_and_counts_what_it_found(
    deployment: Deployment,
) -> None:
    facts = [make_fact("omar", f"omar speaks {lang}") for lang in ("Urdu", "Dutch", "Basque")]
    ghost = make_fact("omar", "omar's erased phone number", org="org-c")

    def check(c: wiring.Core) -> None:
        c.memory.insert_facts(facts)
        wiring.indexer(c).drain_pending()
        c.index.delete([facts[2].fact_id])
        c.index.upsert([ghost])
        registry = CollectorRegistry()
        metrics = MaintenanceMetrics(registry)
        runner = MaintenanceRunner(c, MaintenanceSettings(), metrics)
        first = runner.run("index")
        assert first.changes == {"vectors_absent": 1, "vectors_orphaned": 1}
        assert c.index.stored([facts[2].fact_id, ghost.fact_id]).keys() == {facts[2].fact_id}
        assert runner.run("index").changes == {}
        counts = {
            rule: registry.get_sample_value(
                "memoryd_maintenance_changes_total", {"cluster_job": "index", "rule": rule}
            )
            for rule in INDEX_RULES
        }
        assert counts == {"vectors_absent": 1, "vectors_differing": 0, "vectors_orphaned": 1}

    deployment.with_core(check)
    runs = deployment.query("SELECT job, outcome, changes FROM maintenance_runs ORDER BY seq")
    assert runs == [
        ("index", "succeeded", {"vectors_absent": 1, "vectors_orphaned": 1}),
        ("index", "succeeded", {}),
    ]
