"""The processor through outages: a failed run that cannot be recorded yet, a dead-letter
topic that is away while undecodable records arrive, and a duplicate event id that carries
different content. The process keeps running and says it is degraded meanwhile."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

from kafka.errors import TopicAuthorizationFailedError

from consumers.batching import Batch, BufferedEvent, Rejection, TopicPartition
from consumers.processor import MemoryProcessor
from domain.model import FactStatus, LedgerEntry, RunRecord
from processors.errors import BackendError
from store.errors import DatabaseUnavailable, StoreError
from tests.support.builders import key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, TOPIC, InMemoryMemoryd, step_until
from tests.support.ops import wait_for


def degraded(processor: MemoryProcessor) -> float:
    metrics: Any = processor._metrics
    return float(metrics.degraded.labels("processor")._value.get())


def test_a_failed_run_that_cannot_be_recorded_yet_is_not_dead_lettered_without_it() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    record_run = m.memory.record_run
    refusals = [StoreError("failed run insert failed: permission denied")] * 3 + [
        DatabaseUnavailable("server closed the connection")
    ]

    def refusing(run: RunRecord, ledger: Sequence[LedgerEntry] = ()) -> None:
        if refusals:
            raise refusals.pop(0)
        record_run(run, ledger)

    m.memory.record_run = refusing  # type: ignore[method-assign]
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    processor = m.processor(consumer, FlakyBackend([BackendError("unparseable")]), letters)
    processor.start()

    step_until(processor, lambda: processor.outage.failures >= 2)
    assert letters.letters == []
    assert degraded(processor) == 1
    assert consumer.committed.get(0, 0) == 0
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()

    (letter,) = letters.letters
    assert letter.reason == "backend error: unparseable"
    (failed,) = [r.run for r in m.runs.runs(key_of("ada"))]
    assert failed.status.value == "failed"
    assert degraded(processor) == 0


def test_a_flush_waiting_for_an_erasure_is_counted_as_such_and_degrades_nothing() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    m.db.erasing.add(key_of("ada"))
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    processor = m.processor(consumer, FlakyBackend(), letters)
    processor.start()
    metrics: Any = processor._metrics
    retries = metrics.outage_retries.labels
    step_until(processor, lambda: retries("processor", "erasure")._value.get() >= 2)
    assert retries("processor", "database")._value.get() == 0
    assert degraded(processor) == 0
    m.db.erasing.discard(key_of("ada"))
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()


def test_the_dead_letter_topic_away_holds_bad_records_not_the_process() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 3
    good = make_event("ada", "I live in Lisbon")
    consumer.produce(0, good.to_bytes(), good.kafka_key)
    consumer.produce(0, b"not json")
    later = make_event("ada", "I like tea")
    consumer.produce(0, later.to_bytes(), later.kafka_key)
    processor = m.processor(consumer, FlakyBackend(), letters)
    processor.start()

    consolidated = m.memory.already_consolidated
    step_until(
        processor, lambda: len(consolidated(key_of("ada"), [good.event_id, later.event_id])) == 2
    )
    # The good events are consolidated; nothing past the letter not yet sent is committed.
    assert consumer.committed.get(0, 0) <= 1
    step_until(processor, lambda: consumer.committed.get(0) == 3)
    processor.shutdown()
    assert [(x.stage, x.offset) for x in letters.letters] == [("decode", 1)]
    assert processor.outage.failures == 0
    assert degraded(processor) == 0


def test_a_duplicate_event_id_in_one_batch_is_consolidated_as_the_log_keeps_it() -> None:
    # The event log keeps the first content under an id (ON CONFLICT DO NOTHING); the
    # processor must consolidate the same one, not the later duplicate's.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    first = make_event("ada", "I live in Lisbon")
    again = first.model_copy(update={"content": "I live in Oslo"})
    for e in (first, again):
        consumer.produce(0, e.to_bytes(), e.kafka_key)
    processor = m.processor(consumer, FlakyBackend(), letters)
    processor.start()
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()

    facts = m.memory.facts(key_of("ada"), tuple(FactStatus))
    text = " ".join(f.content for f in facts)
    assert "Lisbon" in text
    assert "Oslo" not in text
    (run,) = [r.run for r in m.runs.runs(key_of("ada"))]
    assert run.input_event_ids == (first.event_id,)


def test_a_failed_run_is_named_for_its_records_not_for_the_moment() -> None:
    # Read again after a rebalance, a batch given up again records the same failed run; the
    # same event redriven (a new record, a new offset) fails as a run of its own.
    event = make_event("ada", "I live in Lisbon")
    tp = TopicPartition(TOPIC, 0)

    def rejected(offset: int) -> uuid.UUID:
        batch = Batch(key_of("ada"), [BufferedEvent(tp, offset, event)], attempt=1)
        return batch.given_up(Rejection("consolidate", "backend error", "refused")).run_id

    assert rejected(7) == rejected(7)
    assert rejected(7) != rejected(12)


class HeldBackend(FlakyBackend):
    """Consolidates only once `release` is set: a run still in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def before(self, request: Any) -> None:
        self.release.wait(20)


def step_while_held(processor: MemoryProcessor, backend: HeldBackend, calls: int) -> None:
    """Start, wait for `calls` backend calls, then step on while the held run is in flight."""
    processor.start()
    step_until(processor, lambda: backend.calls == calls)
    for _ in range(50):
        processor.step()


def release_and_settle(
    processor: MemoryProcessor, backend: HeldBackend, consumer: FakeConsumer, position: int
) -> None:
    """Let the held run finish; step until partition 0 is committed up to `position`."""
    backend.release.set()
    step_until(processor, lambda: consumer.committed.get(0) == position)
    processor.shutdown()


def test_a_bad_record_is_lettered_only_once_the_records_before_it_are_done() -> None:
    # Sent as it was read, the letter waited for a commit held back by the run in flight
    # before it: a crash in between read the record again and lettered it twice.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    good = make_event("ada", "I live in Lisbon")
    consumer.produce(0, good.to_bytes(), good.kafka_key)
    consumer.produce(0, b"not json")
    backend = HeldBackend()
    processor = m.processor(consumer, backend, letters)
    step_while_held(processor, backend, calls=1)
    assert letters.letters == []  # the run before it is still in flight
    assert consumer.committed.get(0, 0) == 0
    release_and_settle(processor, backend, consumer, position=2)
    assert [(x.stage, x.offset) for x in letters.letters] == [("decode", 1)]


class AdaHeldBobFails(HeldBackend):
    """Ada's run waits for `release`; Bob's fails for good."""

    def before(self, request: Any) -> None:
        if request.user_id == "bob":
            raise BackendError("unparseable")
        super().before(request)


def test_a_given_up_batch_is_lettered_with_the_commit_that_passes_it() -> None:
    # Sent when the batch was given up, its letters waited for a commit held back by the run
    # in flight before them: a crash in between read the events again and lettered them
    # twice. They go once every record before them is done, with the offset past them.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    ada, bob = make_event("ada", "I live in Lisbon"), make_event("bob", "I like tea")
    for e in (ada, bob):
        consumer.produce(0, e.to_bytes(), e.kafka_key)
    backend = AdaHeldBobFails()
    processor = m.processor(consumer, backend, letters)
    step_while_held(processor, backend, calls=2)
    assert letters.letters == []  # Ada's run, before Bob's record, is still in flight
    assert [r.run.status.value for r in m.runs.runs(key_of("bob"))] == ["failed"]
    release_and_settle(processor, backend, consumer, position=2)
    assert [(x.stage, x.offset) for x in letters.letters] == [("consolidate", 1)]
    assert letters.consumed == [{TopicPartition(TOPIC, 0): 2}]


def test_letters_refused_leave_their_offsets_open_and_go_once() -> None:
    # An aborted transaction: neither the letters nor the offset past them.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 2
    consumer.produce(0, b"not json")
    consumer.produce(0, b"nor this")
    processor = m.processor(consumer, FlakyBackend(), letters)
    processor.start()
    step_until(processor, lambda: processor.outage.failures == 2)
    assert consumer.committed.get(0, 0) == 0
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()
    assert [x.offset for x in letters.letters] == [0, 1]
    assert letters.consumed == [{TopicPartition(TOPIC, 0): 2}]  # both in one transaction


def test_run_until_idle_waits_for_letters_the_topic_refused() -> None:
    # Nothing buffered or in flight, but a letter not sent yet: not idle.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 3
    consumer.produce(0, b"not json")
    slow = FAST.model_copy(update={"backoff_base_s": 0.2, "backoff_max_s": 0.2})
    m.processor(consumer, FlakyBackend(), letters, slow).run_until_idle(idle_s=0.05)
    assert [x.offset for x in letters.letters] == [0]
    assert consumer.committed == {0: 1}


def test_a_refused_poll_is_waited_out_and_the_processor_goes_on_consuming() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    consumer.poll_errors = [TopicAuthorizationFailedError(), TopicAuthorizationFailedError()]
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    processor = m.processor(consumer, FlakyBackend(), letters)
    stop = threading.Event()
    runner = threading.Thread(target=processor.run, args=(stop,))
    runner.start()
    try:
        wait_for("the event's offset committed", lambda: consumer.committed.get(0) == 1, 20)
    finally:
        stop.set()
        runner.join(timeout=10)
    assert not runner.is_alive()
    assert m.memory.already_consolidated(key_of("ada"), [event.event_id]) == {event.event_id}
    metrics: Any = processor._metrics
    assert metrics.outage_retries.labels("processor", "broker")._value.get() == 2
    assert degraded(processor) == 0
    assert letters.letters == []


class FailingOnCue(FlakyBackend):
    """Fails its one call once told to: the flush holds the memory's lock until then."""

    def __init__(self) -> None:
        super().__init__([BackendError("unparseable")])
        self.entered, self.go = threading.Event(), threading.Event()

    def before(self, request: Any) -> None:
        self.entered.set()
        self.go.wait(20)
        super().before(request)


def test_a_batch_given_up_waits_on_no_memory_lock_on_the_polling_thread() -> None:
    # Its failed run is recorded under the memory's lock. Another holding it (an erasure, an
    # orphaned flush) must not stall the thread that polls, commits and heartbeats for every
    # memory: the record is tried again later, and the letter waits for it.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    backend = FailingOnCue()
    processor = m.processor(consumer, backend, letters)
    processor.start()
    step_until(processor, backend.entered.is_set)
    held, release, let_go = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:  # takes the lock the moment the failed flush lets go of it
        with m.memory.memory_lock(key_of("ada")):
            held.set()
            release.wait(20)
        let_go.set()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        backend.go.set()
        assert held.wait(5)
        for _ in range(20):
            processor.step()
        assert not let_go.is_set()  # the steps never waited for the holder
        assert letters.letters == []
        assert consumer.committed.get(0, 0) == 0
        assert degraded(processor) == 0
    finally:
        release.set()
        holder.join(10)
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()
    (letter,) = letters.letters
    assert letter.reason == "backend error: unparseable"
    (failed,) = [r.run for r in m.runs.runs(key_of("ada"))]
    assert failed.status.value == "failed"
