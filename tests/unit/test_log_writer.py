"""The log writer on a fake Kafka consumer and the in-memory event log: every outage kind is
retried until it passes, the process says it is degraded meanwhile, and a dead letter is
sent once however often its batch is read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
from kafka.errors import CommitFailedError
from prometheus_client import CollectorRegistry

from consumers.batching import TopicPartition
from consumers.errors import DeadLetterError
from consumers.log_writer import LogWriter
from consumers.metrics import PipelineMetrics
from domain.model import KafkaCoordinates
from domain.ports import Appended
from domain.retry import Backoff
from producers.contract import ContextEvent
from store.errors import DatabaseUnavailable, StoreError
from store.inmemory.database import InMemoryDatabase
from store.inmemory.logs import InMemoryEventLog
from tests.support.builders import make_event
from tests.support.fakes import FakeConsumer, ListDeadLetters

TOPIC = "events"
FAST = Backoff(base_s=0.001, max_s=0.01)


class FlakyEventLog:
    """The in-memory event log, failing its first `failures` appends with `error`."""

    def __init__(self, error: Exception | None = None, failures: int = 0) -> None:
        self.inner = InMemoryEventLog(InMemoryDatabase(), str)
        self.error = error
        self.failures = failures
        self.calls = 0

    def append(self, events: Sequence[tuple[ContextEvent, KafkaCoordinates | None]]) -> Appended:
        self.calls += 1
        if self.error is not None and self.failures:
            self.failures -= 1
            raise self.error
        return self.inner.append(events)

    def logged(self) -> int:
        return len(self.inner._events)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class FlakyCommits(FakeConsumer):
    """A consumer whose next `fail` commits raise as in a rebalance."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.fail = 0

    def commit(self, offsets: Mapping[Any, Any]) -> None:
        if self.fail:
            self.fail -= 1
            raise CommitFailedError("the group is rebalancing")
        super().commit(offsets)


def writer(
    consumer: FakeConsumer, events: FlakyEventLog, letters: ListDeadLetters
) -> tuple[LogWriter, CollectorRegistry]:
    registry = CollectorRegistry()
    w = LogWriter(consumer, TOPIC, events, letters, PipelineMetrics(registry), backoff=FAST)
    return w, registry


def produce(consumer: FakeConsumer, n: int, bad: int = 1) -> list[ContextEvent]:
    events = [make_event("ada", f"fact {i}") for i in range(n)]
    for e in events:
        consumer.produce(0, e.to_bytes(), e.kafka_key)
    for i in range(bad):
        consumer.produce(0, f"not json {i}".encode())
    return events


def run_until(w: LogWriter, done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """`run` in a thread (as the process runs it) until `done`; it must still be running."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            w.run(stop)
        except BaseException as e:
            errors.append(e)
            raise

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.005)
    alive = thread.is_alive()
    stop.set()
    thread.join(5)
    assert alive, f"the log writer stopped: {errors!r}"
    assert done(), "timed out"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (DatabaseUnavailable("server closed the connection"), "database"),
        (StoreError("event log append failed: permission denied"), "database_refused"),
    ],
)
def test_an_append_that_fails_is_retried_until_it_passes(error: Exception, cause: str) -> None:
    consumer, letters = FakeConsumer(TOPIC), ListDeadLetters()
    events = FlakyEventLog(error, failures=3)
    w, registry = writer(consumer, events, letters)
    produce(consumer, 5)
    run_until(w, lambda: events.logged() == 5 and consumer.committed.get(0) == 6)
    assert sample(registry, "memoryd_outage_retries_total", consumer="log-writer", cause=cause) == 3
    assert sample(registry, "memoryd_consumer_degraded", consumer="log-writer") == 0
    # The bad record's letter went out once, after the append that finally passed.
    assert len(letters.letters) == 1


def test_a_letter_is_not_sent_when_the_append_fails() -> None:
    consumer, letters = FakeConsumer(TOPIC), ListDeadLetters()
    events = FlakyEventLog(DatabaseUnavailable("down"), failures=1)
    w, _ = writer(consumer, events, letters)
    w._subscribe()
    produce(consumer, 3)
    with pytest.raises(DatabaseUnavailable):
        w.step()
    assert letters.letters == []
    assert w.step() == 4
    assert [x.offset for x in letters.letters] == [3]


def test_a_batch_read_again_after_an_outage_is_counted_once() -> None:
    consumer, letters = FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 2
    events = FlakyEventLog(DatabaseUnavailable("down"), failures=3)
    w, registry = writer(consumer, events, letters)
    produce(consumer, 3)
    run_until(w, lambda: consumer.committed.get(0) == 4)
    assert (
        sample(registry, "memoryd_outage_retries_total", consumer="log-writer", cause="database")
        == 3
    )
    assert sample(registry, "memoryd_records_total", consumer="log-writer") == 4


def test_the_dead_letter_topic_away_is_retried_and_each_letter_sent_once() -> None:
    consumer, letters = FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 2
    events = FlakyEventLog()
    w, registry = writer(consumer, events, letters)
    produce(consumer, 4, bad=2)
    run_until(w, lambda: consumer.committed.get(0) == 6)
    assert sorted(x.offset for x in letters.letters) == [4, 5]
    assert events.logged() == 4
    assert (
        sample(
            registry,
            "memoryd_outage_retries_total",
            consumer="log-writer",
            cause="dead_letter_topic",
        )
        == 2
    )


def test_a_failed_commit_in_a_rebalance_does_not_stop_the_writer() -> None:
    consumer, letters = FlakyCommits(TOPIC), ListDeadLetters()
    consumer.fail = 1
    events = FlakyEventLog()
    w, registry = writer(consumer, events, letters)
    w._subscribe()
    produce(consumer, 3, bad=0)
    assert w.step() == 3
    assert consumer.committed == {}
    # The partition comes back from the committed offset (none): the batch is read again.
    consumer.rebalance({0}, set())
    consumer.rebalance(set(), {0})
    assert w.step() == 3
    assert consumer.committed == {0: 3}
    assert events.logged() == 3
    assert sample(registry, "memoryd_commit_failures_total", consumer="log-writer") == 1


def test_a_batch_with_letters_commits_its_offsets_in_the_letters_transaction() -> None:
    # No commit of its own follows the letters: none can fail after they went out, which
    # read the batch again and lettered its bad records twice.
    consumer, letters = FakeConsumer(TOPIC, partitions=2), ListDeadLetters()
    w, _ = writer(consumer, FlakyEventLog(), letters)
    w._subscribe()
    produce(consumer, 3)
    consumer.produce(1, make_event("bob", "fact").to_bytes())
    assert w.step() == 5
    assert letters.consumed == [{TopicPartition(TOPIC, 0): 4, TopicPartition(TOPIC, 1): 1}]
    assert consumer.commits == [{0: 4, 1: 1}]


def test_a_broker_error_from_poll_is_retried() -> None:
    class FailingPoll(FakeConsumer):
        fail = 2

        def poll(self, timeout_ms: int) -> Mapping[Any, Sequence[Any]]:
            if self.fail:
                self.fail -= 1
                raise CommitFailedError("coordinator not available")
            return super().poll(timeout_ms)

    consumer, letters = FailingPoll(TOPIC), ListDeadLetters()
    events = FlakyEventLog()
    w, registry = writer(consumer, events, letters)
    produce(consumer, 2, bad=0)
    run_until(w, lambda: events.logged() == 2)
    assert (
        sample(registry, "memoryd_outage_retries_total", consumer="log-writer", cause="broker") == 2
    )


def test_an_outage_that_lasts_keeps_the_writer_degraded_until_it_ends() -> None:
    consumer, letters = FakeConsumer(TOPIC), ListDeadLetters()
    events = FlakyEventLog(DeadLetterError("broker away"), failures=10**9)
    w, registry = writer(consumer, events, letters)
    produce(consumer, 1, bad=0)
    degraded = lambda: sample(registry, "memoryd_consumer_degraded", consumer="log-writer") == 1  # noqa: E731
    calls_before = 0

    def many_retries() -> bool:
        return degraded() and events.calls > calls_before + 20

    run_until(w, many_retries)
    events.failures = 0
    run_until(w, lambda: events.logged() == 1)
    assert not degraded()
