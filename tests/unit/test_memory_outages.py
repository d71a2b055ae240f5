"""A flush kept from the database is one memory's outage: another memory flushing does not end
it, its retries back off on their own, and the consumer stays degraded while it lasts. It ends
with the memory's own success, or when its batch leaves the processor."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from prometheus_client import CollectorRegistry

from consumers.batching import TopicPartition
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.processor import MemoryProcessor
from domain.model import MemoryUpdate
from domain.retry import Backoff
from producers.contract import ContextEvent, MemoryTombstone
from store.errors import DatabaseUnavailable
from tests.support.builders import BASE_TIME, key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters, MonotonicClock
from tests.support.inmemory import FAST, TOPIC, InMemoryMemoryd, step_until

STEADY = Backoff(base_s=1.0, max_s=60.0, jitter=0.0)
LOCK_TIMEOUT = "canceling statement due to lock timeout"


def test_a_memory_failing_backs_off_on_its_own_while_another_recovers() -> None:
    registry = CollectorRegistry()
    o = Outage("processor", PipelineMetrics(registry), STEADY)
    ada, bob = key_of("ada"), key_of("bob")
    waits = []
    for _ in range(4):
        waits.append(o.failed(DatabaseUnavailable(LOCK_TIMEOUT), "a flush", ada))
        o.failed(DatabaseUnavailable(LOCK_TIMEOUT), "a flush", bob)
        o.recovered("a flush", bob)
        assert registry.get_sample_value("memoryd_consumer_degraded", {"consumer": "processor"})
    assert waits == [1.0, 2.0, 4.0, 8.0]
    assert o.failures == 4
    o.recovered("a flush", ada)
    assert registry.get_sample_value("memoryd_consumer_degraded", {"consumer": "processor"}) == 0


class AdasRowsLocked:
    """The store's apply, refusing every write to ada's memory (a lock timeout on her rows)
    while the others go through; it notes the time of each of ada's tries."""

    def __init__(self, m: InMemoryMemoryd, clock: MonotonicClock) -> None:
        self._apply, self._clock = m.memory.apply, clock
        self.locked = True
        self.tries: list[float] = []
        m.memory.apply = self  # type: ignore[method-assign]

    def __call__(self, update: MemoryUpdate) -> None:
        if update.run.key == key_of("ada"):
            self.tries.append(self._clock.now)
            if self.locked:
                raise DatabaseUnavailable(LOCK_TIMEOUT)
        self._apply(update)


def degraded(processor: MemoryProcessor) -> float:
    metrics: Any = processor._metrics
    return float(metrics.degraded.labels("processor")._value.get())


def in_flight(processor: MemoryProcessor) -> float:
    metrics: Any = processor._metrics
    return float(metrics.in_flight._value.get())


def publish(consumer: FakeConsumer, *events: ContextEvent, partition: int = 0) -> None:
    for e in events:
        consumer.produce(partition, e.to_bytes(), e.kafka_key)


def read_then_tick(processor: MemoryProcessor, clock: MonotonicClock) -> None:
    """One step reads what was published; the clock then moves on, to launch it."""
    processor.step()
    clock.now += 0.5


def processor_at(
    m: InMemoryMemoryd, consumer: FakeConsumer, clock: MonotonicClock, backend: FlakyBackend
) -> MemoryProcessor:
    slow = FAST.model_copy(update={"backoff_base_s": 1.0, "backoff_max_s": 1000.0})
    metrics = PipelineMetrics(CollectorRegistry())
    flusher = m.flusher(backend, slow.budget_policy)
    return MemoryProcessor(
        consumer, TOPIC, flusher, ListDeadLetters(), metrics, slow, monotonic=clock
    )


def test_a_memory_whose_writes_time_out_stays_degraded_while_another_flushes() -> None:
    m, consumer, clock = InMemoryMemoryd(), FakeConsumer(TOPIC), MonotonicClock()
    adas_rows = AdasRowsLocked(m, clock)
    processor = processor_at(m, consumer, clock, FlakyBackend())
    publish(consumer, make_event("ada", "I live in Lisbon"))
    processor.start()
    bobs: list[ContextEvent] = []
    # Bob flushes at every tick of the clock, ada's retries fall in between.
    while len(adas_rows.tries) < 5:
        assert len(bobs) < 100, f"ada tried at {adas_rows.tries} only"
        bobs.append(make_event("bob", f"I like topic {len(bobs)}"))
        publish(consumer, bobs[-1])
        read_then_tick(processor, clock)
        step_until(
            processor,
            lambda: (
                bool(m.memory.already_consolidated(key_of("bob"), [bobs[-1].event_id]))
                and in_flight(processor) == 0
            ),
        )
        if adas_rows.tries:
            assert degraded(processor) == 1
    gaps = [b - a for a, b in zip(adas_rows.tries, adas_rows.tries[1:], strict=False)]
    assert gaps == sorted(gaps)
    assert len(set(gaps)) == len(gaps), gaps  # 1, 2, 4, 8 s (± jitter): not 1 s forever

    adas_rows.locked = False
    clock.now += 1000
    step_until(processor, lambda: consumer.committed.get(0) == len(bobs) + 1)
    assert degraded(processor) == 0
    assert processor.outage.failures == 0
    processor.shutdown()


def test_a_tombstone_dropping_a_memory_in_an_outage_ends_it() -> None:
    m, consumer, clock = InMemoryMemoryd(), FakeConsumer(TOPIC), MonotonicClock()
    AdasRowsLocked(m, clock)
    processor = processor_at(m, consumer, clock, FlakyBackend())
    publish(consumer, make_event("ada", "I live in Lisbon"))
    processor.start()
    read_then_tick(processor, clock)
    step_until(processor, lambda: degraded(processor) == 1)
    tombstone = MemoryTombstone(
        organization_id="org-a", user_id="ada", erasure_id=uuid.uuid4(), forgotten_at=BASE_TIME
    )
    consumer.produce(0, tombstone.to_bytes(), tombstone.kafka_key)
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    assert processor.held_events() == []
    assert degraded(processor) == 0
    assert processor.outage.failures == 0
    processor.shutdown()


class HoldsBob(FlakyBackend):
    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def before(self, request: Any) -> None:
        if request.key == key_of("bob"):
            self.entered.set()
            self.release.wait(20)


def test_a_memory_in_an_outage_revoked_ends_it_while_another_flush_runs() -> None:
    m, consumer, clock = InMemoryMemoryd(), FakeConsumer(TOPIC, partitions=2), MonotonicClock()
    adas_rows = AdasRowsLocked(m, clock)
    backend = HoldsBob()
    processor = processor_at(m, consumer, clock, backend)
    publish(consumer, make_event("ada", "I live in Lisbon"), partition=0)
    publish(consumer, make_event("bob", "I like tea"), partition=1)
    processor.start()
    read_then_tick(processor, clock)
    step_until(processor, lambda: degraded(processor) == 1 and backend.entered.is_set())
    assert len(adas_rows.tries) == 1
    consumer.rebalance({0}, set())
    bobs = {TopicPartition(TOPIC, 1)}  # his flush still runs
    step_until(processor, lambda: processor.assignment() == bobs)
    assert degraded(processor) == 0
    assert processor.outage.failures == 0
    backend.release.set()
    step_until(processor, lambda: consumer.committed.get(1) == 1)
    processor.shutdown()
