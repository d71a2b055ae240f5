"""A run over a topic that stopped growing ends once it has read everything there was,
without waiting out its idle time (`consumers.kafka_client.until_idle`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from consumers.kafka_client import CAUGHT_UP_QUIET_S, caught_up, until_idle
from consumers.metrics import PipelineMetrics
from consumers.processor import MemoryProcessor
from tests.support.builders import make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, TOPIC, InMemoryMemoryd


def test_caught_up_once_every_partition_is_read_to_its_last_fetched_end() -> None:
    consumer = FakeConsumer(TOPIC, partitions=2, max_records=2)
    for i in range(3):
        consumer.produce(0, f"r{i}".encode())
    assert not caught_up(consumer)  # nothing assigned yet
    consumer.poll(0)  # two of partition 0's three records
    assert not caught_up(consumer)
    consumer.poll(0)
    assert caught_up(consumer)
    consumer.pause(consumer.tp(1))
    consumer.produce(1, b"late")
    consumer.poll(0)  # partition 1 paused: its end as the last fetch saw it
    assert caught_up(consumer)
    consumer.resume(consumer.tp(1))
    consumer.poll(0)
    assert caught_up(consumer)
    consumer.produce(0, b"r3")
    consumer.max_records = 0
    consumer.poll(0)  # fetched nothing, but learnt the new end
    assert not caught_up(consumer)


def test_until_idle_waits_the_idle_time_unless_caught_up() -> None:
    consumer = FakeConsumer(TOPIC)
    consumer.produce(0, b"r0")
    consumer.poll(0)
    assert caught_up(consumer)
    assert not until_idle(consumer, CAUGHT_UP_QUIET_S / 2, idle_s=30.0)
    assert until_idle(consumer, CAUGHT_UP_QUIET_S, idle_s=30.0)
    consumer.produce(0, b"r1")
    consumer.max_records = 0
    consumer.poll(0)
    assert not until_idle(consumer, 29.0, idle_s=30.0)
    assert until_idle(consumer, 30.0, idle_s=30.0)


class Clocked(FakeConsumer):
    """Every poll takes a second of the processor's clock (and a little real time, for the
    flush to finish in); `settled_at` is the poll that committed past every record."""

    def __init__(self) -> None:
        super().__init__(TOPIC)
        self.now = 0.0
        self.polls = 0
        self.settled_at: int | None = None

    def clock(self) -> float:
        return self.now

    def poll(self, timeout_ms: int) -> Any:
        self.now += 1.0
        self.polls += 1
        time.sleep(0.005)
        return super().poll(timeout_ms)

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        super().commit(offsets)
        if self.settled_at is None and self.committed.get(0) == len(self.log[0]):
            self.settled_at = self.polls


def test_run_until_idle_stops_once_it_read_and_consolidated_everything() -> None:
    m, letters = InMemoryMemoryd(), ListDeadLetters()
    consumer = Clocked()
    ada = [make_event("ada", "I live in Lisbon"), make_event("ada", "I bike to work", minutes=1)]
    for e in ada:
        consumer.produce(0, e.to_bytes(), e.kafka_key)
    flusher = m.flusher(FlakyBackend(), FAST.budget_policy)
    metrics = PipelineMetrics(CollectorRegistry())
    processor = MemoryProcessor(
        consumer, TOPIC, flusher, letters, metrics, FAST, monotonic=consumer.clock
    )

    processor.run_until_idle(idle_s=60.0, deadline_s=100_000.0)

    assert consumer.settled_at is not None  # both consolidated and committed while it ran
    # A poll or two after that, not the 60 (60 s) of waiting out idle_s.
    assert consumer.polls - consumer.settled_at < 5
