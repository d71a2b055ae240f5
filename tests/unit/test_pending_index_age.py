"""`memoryd_facts_pending_index_oldest_seconds`: how long the oldest fact has waited for the
vector index, published with the pending count, and as the count leaving out the facts held
back for users out of credit (they wait for a top-up, not for Chroma)."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry

from consumers.indexer import FactIndexer
from consumers.metrics import PipelineMetrics
from processors.cost import PriceTable
from tests.support.builders import BASE_TIME, key_of, make_fact, seed
from tests.support.inmemory import InMemoryMemoryd

OLDEST = "memoryd_facts_pending_index_oldest_seconds"
COUNT = "memoryd_facts_pending_index"


def gauges(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    return registry.get_sample_value(COUNT), registry.get_sample_value(OLDEST)


def test_the_oldest_pending_fact_s_age_is_published_with_the_count() -> None:
    m = InMemoryMemoryd()
    seed(m.memory, "ada", [make_fact("ada", "Ada lives in Berlin", at=BASE_TIME)])
    seed(m.memory, "bob", [make_fact("bob", "Bob likes chess", at=BASE_TIME + timedelta(hours=1))])
    m.memory.set_credit(key_of("ada"), 0)  # spent: her fact is held back under SKIP_EMBEDDINGS
    m.now = BASE_TIME + timedelta(hours=2)
    registry = CollectorRegistry()
    indexer = FactIndexer(
        m.memory, m.index, PriceTable({}), m.embedder.model_name, PipelineMetrics(registry), m.clock
    )

    indexer.publish_pending()
    assert gauges(registry) == (2.0, 7200.0)
    indexer.publish_pending(skip_out_of_credit=True)
    assert gauges(registry) == (1.0, 3600.0)  # Ada's older fact waits for a top-up
    assert indexer.drain_pending(skip_out_of_credit=True) == 1
    assert gauges(registry) == (0.0, 0.0)  # nothing waits for the index: not an age
