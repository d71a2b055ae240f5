"""Keeping Chroma in step with `memory_facts`, which stays the system of record.

A fact version is written to the index, then marked `indexed_at` in Postgres with its
embedding cost booked in the same transaction. Chroma upserts are idempotent on the fact id,
so a crash between the two only repeats the upsert; the ledger entry id is derived from the
fact versions, so the cost is booked once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from itertools import groupby

from consumers.metrics import PipelineMetrics
from processors.cost import PriceTable, embedding_entry
from store.memory_store import PostgresMemoryStore
from store.records import Fact, MemoryUpdate
from store.vector_index import VectorIndex

log = logging.getLogger(__name__)


class FactIndexer:
    def __init__(
        self,
        store: PostgresMemoryStore,
        index: VectorIndex,
        prices: PriceTable,
        embedding_model: str,
        metrics: PipelineMetrics,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._index = index
        self._prices = prices
        self._model = embedding_model
        self._metrics = metrics
        self._clock = clock

    def index_changes(self, update: MemoryUpdate) -> int:
        """Index what one run changed; reads the rows back so the versions are the stored ones."""
        ids = [c.after.fact_id for c in update.fact_changes]
        facts = [f for f in self._store.facts_by_id(ids) if f.indexed_at is None]
        return self._index_facts(facts)

    def drain_pending(self, batch: int = 256) -> int:
        """Index every pending fact (the outbox); returns how many were indexed."""
        total = 0
        while True:
            facts = self._store.pending_index(limit=batch)
            if not facts:
                break
            done = self._index_facts(facts)
            total += done
            if done == 0:
                break
        self._metrics.pending_index.set(len(self._store.pending_index(limit=10_000)))
        return total

    def _index_facts(self, facts: Sequence[Fact]) -> int:
        if not facts:
            return 0
        embedded = self._index.upsert(facts)
        now = self._clock()
        entries = []
        # One ledger entry per (user, run that created the facts) in the batch; its id is
        # derived from the exact fact versions, so re-indexing the same versions books nothing.
        ordered = sorted(facts, key=_group_key)
        for (user_id, run_id), group in groupby(ordered, key=_group_key):
            members = list(group)
            key = ",".join(f"{f.fact_id}:{f.version}:{f.updated_at.isoformat()}" for f in members)
            entries.append(
                embedding_entry(
                    self._prices,
                    run_id=uuid.UUID(run_id),
                    batch_key=key,
                    user_id=user_id,
                    organization_id=members[0].organization_id,
                    model=self._model,
                    texts=len(members),
                    at=now,
                )
            )
        marked = self._store.mark_indexed(facts, now, entries)
        self._metrics.facts_indexed.inc(embedded)
        self._metrics.cost.labels("embedding").inc(sum(e.cost_micro_usd for e in entries))
        return marked


def _group_key(fact: Fact) -> tuple[str, str]:
    return (fact.user_id, str(fact.created_by_run))
