"""A consumer's outages are kept per source: one that succeeds recovers only itself, and the
consumer stays degraded while any other is still failing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from consumers.errors import DeadLetterError
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.processor import MemoryProcessor
from domain.model import LedgerEntry, RunRecord
from domain.retry import Backoff
from processors.errors import BackendError
from store.errors import DatabaseUnavailable, MemoryBeingErased
from tests.support.builders import make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, TOPIC, InMemoryMemoryd, step_until

STEADY = Backoff(base_s=1.0, max_s=60.0, jitter=0.0)


def outage() -> tuple[Outage, CollectorRegistry]:
    registry = CollectorRegistry()
    return Outage("processor", PipelineMetrics(registry), STEADY), registry


def degraded(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("memoryd_consumer_degraded", {"consumer": "processor"})


def test_a_source_that_succeeds_recovers_only_itself() -> None:
    o, registry = outage()
    assert o.failed(DeadLetterError("away"), "dead letters") == 1.0
    o.failed(DatabaseUnavailable("down"), "a flush")
    o.recovered("a flush")
    assert degraded(registry) == 1
    # The topic's retries go on backing off; a flush that committed says nothing of it.
    assert o.failed(DeadLetterError("away"), "dead letters") == 2.0
    assert o.failures == 2
    o.recovered("dead letters")
    assert degraded(registry) == 0
    assert o.failures == 0


def test_a_wait_for_an_erasure_backs_off_apart_and_degrades_nothing() -> None:
    o, registry = outage()
    o.failed(MemoryBeingErased("ada"), "a flush")
    assert degraded(registry) == 0
    assert o.failed(DatabaseUnavailable("down"), "a flush") == 1.0
    assert degraded(registry) == 1
    o.recovered("a flush")
    assert degraded(registry) == 0


def processor_degraded(processor: MemoryProcessor) -> float:
    metrics: Any = processor._metrics
    return float(metrics.degraded.labels("processor")._value.get())


def consolidated_flushes(processor: MemoryProcessor) -> float:
    metrics: Any = processor._metrics
    return float(metrics.flushes.labels("consolidated")._value.get())


def test_a_dead_letter_topic_away_keeps_the_processor_degraded_while_flushes_commit() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 3
    consumer.produce(0, b"not json")
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    slow = FAST.model_copy(update={"backoff_base_s": 0.5, "backoff_max_s": 0.5})
    processor = m.processor(consumer, FlakyBackend(), letters, slow)
    processor.start()
    step_until(processor, lambda: consolidated_flushes(processor) == 1)
    assert processor_degraded(processor) == 1
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()
    assert processor_degraded(processor) == 0


def test_letters_left_to_a_partitions_next_owner_end_their_outage() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 10**9
    consumer.produce(0, b"not json")
    processor = m.processor(consumer, FlakyBackend(), letters)
    processor.start()
    step_until(processor, lambda: processor_degraded(processor) == 1)
    consumer.rebalance({0}, set())
    step_until(processor, lambda: not processor.assignment())
    assert processor_degraded(processor) == 0
    processor.shutdown()


def test_batches_left_to_a_partitions_next_owner_end_their_outage() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()

    def refusing(run: RunRecord, ledger: Sequence[LedgerEntry] = ()) -> None:
        raise DatabaseUnavailable("server closed the connection")

    m.memory.record_run = refusing  # type: ignore[method-assign]
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    processor = m.processor(consumer, FlakyBackend([BackendError("unparseable")]), letters)
    processor.start()
    step_until(processor, lambda: processor_degraded(processor) == 1)
    consumer.rebalance({0}, set())
    step_until(processor, lambda: not processor.assignment())
    assert processor_degraded(processor) == 0
    processor.shutdown()
