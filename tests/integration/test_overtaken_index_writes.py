"""Two indexers over two versions of one fact, on real Postgres and Chroma.

An indexer that read a fact's version before a run wrote the next one writes the older text
to the index after the other indexer wrote the newer one. Whichever of the two marks first,
the index must end up holding the current version, and that version is booked once.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from memoryd import wiring
from tests.support.builders import BASE_TIME, make_fact, seed
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

LATER = BASE_TIME + timedelta(minutes=5)


@pytest.mark.parametrize("fast_marks", ["before the slow one writes", "after it"])
def test_an_indexer_that_read_an_older_version_leaves_the_current_one_indexed(
    deployment: Deployment, fast_marks: str
) -> None:
    fact = make_fact("ada", "Ada lives in Lisbon")

    def race(c: wiring.Core) -> tuple[str, int, bool]:
        seed(c.memory, "ada", [fact])
        indexer = wiring.indexer(c)
        older = c.memory.facts_by_id([fact.fact_id])  # the slow indexer's read
        moved = replace(fact, content="Ada lives in Porto", updated_at=LATER)
        seed(c.memory, "ada", [moved], at=LATER)
        if fast_marks == "after it":
            newer = c.memory.facts_by_id([fact.fact_id])
            c.index.upsert(newer)
            indexer._index_facts(older)
            assert indexer.store.mark_indexed(newer, c.clock(), lambda marked: []) == newer
        else:
            assert indexer.index_ids([fact.fact_id]) == 1
            assert indexer._index_facts(older) == 0
        (row,) = c.memory.facts_by_id([fact.fact_id])
        return (
            c.index.stored([fact.fact_id])[fact.fact_id].document,
            row.version,
            (row.indexed_at is not None),
        )

    assert deployment.with_core(race) == ("Ada lives in Porto", 2, True)
    # The older version never got marked, so it was never booked; nor was the rewrite.
    booked = deployment.query(
        "SELECT coalesce(sum(units), 0) FROM credit_ledger WHERE operation = 'embedding'"
    )
    assert booked == [(1 if fast_marks == "before the slow one writes" else 0,)]
