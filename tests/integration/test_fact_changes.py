"""The rows of a memory written since a snapshot, as Postgres gives them to the dense stage:
every writer is seen (a trigger stamps the row), including a transaction that was in flight
when the snapshot was taken and committed after it."""

from __future__ import annotations

import pytest

from memoryd import wiring
from store.read.dense_reads import DenseReads
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

OMAR = key_of("omar")


def test_changes_since_a_snapshot_include_a_write_in_flight_when_it_was_taken(
    deployment: Deployment,
) -> None:
    facts = [make_fact("omar", f"omar fact {i}") for i in range(5)]
    neighbour = make_fact("omar", "a fact of another organization", org="org-b")

    def check(c: wiring.Core) -> None:
        reads = DenseReads(c.pool)
        c.memory.insert_facts(facts)
        first = reads.rows(OMAR)
        assert [r.fact_id for r in first.rows] == sorted((f.fact_id for f in facts), key=str)
        assert reads.changes(OMAR, first.snapshot).rows == []

        with c.pool.connection() as writer:
            writer.execute(
                "UPDATE memory_facts SET version = version + 1 WHERE fact_id = %s",
                (facts[2].fact_id,),
            )
            during = reads.changes(OMAR, first.snapshot)  # the update is not committed
            writer.commit()
        assert during.rows == []
        assert during.total == 5
        after = reads.changes(OMAR, during.snapshot)
        assert [(r.fact_id, r.version) for r in after.rows] == [(facts[2].fact_id, 2)]

        newer = make_fact("omar", "omar fact 5")
        c.memory.insert_facts([newer, neighbour])
        c.memory.mark_indexed([facts[0]], c.clock(), lambda marked: [])
        latest = reads.changes(OMAR, after.snapshot)
        assert {r.fact_id for r in latest.rows} == {newer.fact_id, facts[0].fact_id}
        assert latest.rows == sorted(latest.rows, key=lambda r: str(r.fact_id))
        assert latest.total == 6
        assert next(r for r in latest.rows if r.fact_id == facts[0].fact_id).indexed

    deployment.with_core(check)
