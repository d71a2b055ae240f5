"""The MemoryProcessor's loop on a fake Kafka consumer and the in-memory stores: retries,
dead letters, the offsets it commits, and what a rebalance does to buffered and running work."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from consumers.metrics import PipelineMetrics
from consumers.processor import MemoryProcessor
from domain.model import Fact, RunStatus
from processors.errors import BackendError, TransientBackendError
from processors.schema import ConsolidationRequest
from producers.contract import ContextEvent, MemoryTombstone
from store.inmemory.vector_index import InMemoryVectorIndex
from tests.support.builders import BASE_TIME, key_of, make_event, seed_update
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, SUBJECTS, TOPIC, InMemoryMemoryd, step_until


def publish(consumer: FakeConsumer, partition: int, *events: ContextEvent) -> list[int]:
    return [consumer.produce(partition, e.to_bytes(), e.kafka_key) for e in events]


def consolidated(m: InMemoryMemoryd, events: list[ContextEvent]) -> bool:
    """Every event consumed by its own memory."""
    return all(
        m.memory.already_consolidated(key_of(e.user_id, e.organization_id), [e.event_id])
        for e in events
    )


def started(processor: MemoryProcessor) -> MemoryProcessor:
    processor.start()
    return processor


def test_events_are_consolidated_and_offsets_committed_past_them() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC, partitions=2), ListDeadLetters()
    ada = [make_event("ada", f"I like topic {i}") for i in range(3)]
    bob = [make_event("bob", "I live in Porto")]
    publish(consumer, 0, *ada)
    consumer.produce(0, b"not json")
    publish(consumer, 1, *bob)
    processor = started(m.processor(consumer, FlakyBackend(), letters))

    step_until(processor, lambda: consumer.committed == {0: 4, 1: 1})
    processor.shutdown()

    assert consolidated(m, ada + bob)
    (letter,) = letters.letters
    assert (letter.stage, letter.offset, letter.value) == ("decode", 3, b"not json")
    assert consumer.closed
    assert letters.closed


class BusyFor(FlakyBackend):
    """Rate-limited (a transient error) for one user until released; fine for the others."""

    def __init__(self, user_id: str) -> None:
        super().__init__()
        self.user_id = user_id
        self.released = threading.Event()
        self.refused = 0

    def before(self, request: ConsolidationRequest) -> None:
        if request.user_id == self.user_id and not self.released.is_set():
            self.refused += 1
            raise TransientBackendError("429")


def test_a_transient_failure_is_retried_and_holds_its_offsets_back() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = BusyFor("ada")
    ada, bob = make_event("ada", "I live in Lisbon"), make_event("bob", "I live in Porto")
    publish(consumer, 0, ada, bob)
    settings = FAST.model_copy(update={"max_attempts": 100})
    processor = started(m.processor(consumer, backend, letters, settings))

    step_until(processor, lambda: consolidated(m, [bob]) and backend.refused >= 2)
    # bob (offset 1) is done, ada (offset 0) is not: nothing may be committed past ada.
    assert consumer.committed.get(0, 0) == 0
    backend.released.set()
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()

    assert consolidated(m, [ada])
    (run,) = m.runs.runs(key_of("ada"))
    assert run.run.attempt == backend.refused
    assert letters.letters == []


def test_a_batch_that_keeps_failing_is_dead_lettered_with_its_failed_run() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = FlakyBackend([TransientBackendError("503", raw_response="busy")] * 10)
    events = [make_event("ada", "I live in Lisbon"), make_event("ada", "I like tea")]
    publish(consumer, 0, *events)
    processor = started(
        m.processor(consumer, backend, letters, FAST.model_copy(update={"max_attempts": 3}))
    )

    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()

    assert backend.calls == 3
    assert [(x.stage, x.offset) for x in letters.letters] == [
        ("consolidate", 0),
        ("consolidate", 1),
    ]
    assert letters.letters[0].reason == "gave up after 3 attempts: 503"
    (failed,) = [r.run for r in m.runs.runs(key_of("ada"))]
    assert (failed.status.value, failed.raw_response, failed.attempt) == ("failed", "busy", 2)
    assert m.memory.load_state(key_of("ada")).version == 0


def test_only_the_tries_after_a_transient_failure_count_as_backend_retries() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = FlakyBackend([TransientBackendError("503")] * 10)
    registry = CollectorRegistry()
    settings = FAST.model_copy(update={"max_attempts": 3})
    processor = MemoryProcessor(
        consumer,
        TOPIC,
        m.flusher(backend, settings.budget_policy),
        letters,
        PipelineMetrics(registry),
        settings,
    )
    publish(consumer, 0, make_event("ada", "I live in Lisbon"))
    step_until(started(processor), lambda: consumer.committed.get(0) == 1)
    processor.shutdown()
    assert backend.calls == 3
    retries = {"backend": backend.name}
    assert registry.get_sample_value("memoryd_backend_retries_total", retries) == 2


def test_an_unusable_answer_is_not_retried() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = FlakyBackend([BackendError("unparseable", raw_response="{oops")])
    publish(consumer, 0, make_event("ada", "I live in Lisbon"))
    processor = started(m.processor(consumer, backend, letters))
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()
    assert backend.calls == 1
    (letter,) = letters.letters
    assert letter.reason == "backend error: unparseable"


def test_a_dead_letter_topic_outage_retries_only_the_delivery() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    letters.refuse = 2
    backend = FlakyBackend([BackendError("unparseable")])
    publish(consumer, 0, make_event("ada", "I live in Lisbon"))
    processor = started(m.processor(consumer, backend, letters))
    step_until(processor, lambda: letters.refuse == 0)
    # Both deliveries were refused: the record's offset stays open, and no letter went out.
    assert consumer.committed.get(0, 0) == 0
    assert letters.letters == []
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    assert len(letters.letters) == 1
    processor.shutdown()
    assert backend.calls == 1  # the backend is not asked again
    assert len(m.runs.runs(key_of("ada"))) == 1  # nor is the failed run recorded twice


class Gate(FlakyBackend):
    """A backend whose calls wait until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = threading.Event()
        self.entered = threading.Event()

    def before(self, request: ConsolidationRequest) -> None:
        self.entered.set()
        assert self.opened.wait(20)


def test_a_revocation_drops_the_buffer_and_rereads_it_when_the_partition_comes_back() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    settings = FAST.model_copy(update={"max_batch": 2, "max_wait_s": 60.0})
    first, second, third = (make_event("ada", f"I like topic {i}") for i in range(3))
    publish(consumer, 0, first, second, third)
    processor = started(m.processor(consumer, FlakyBackend(), letters, settings))
    # Batches of two: the third event waits in the buffer for a fourth that does not come.
    step_until(processor, lambda: consolidated(m, [first, second]))
    step_until(processor, lambda: consumer.committed.get(0) == 2)

    consumer.rebalance(revoke={0}, assign={0})  # kafka-python keeps its fetch position
    processor.step()
    # The third event was dropped from the buffer: it is read again, not skipped.
    assert consumer.seeks == [(0, 2)]
    assert consumer.fetched[0] == 3
    assert not consolidated(m, [third])
    processor.shutdown()  # flushes what is buffered
    assert consolidated(m, [third])
    assert consumer.committed[0] == 3


def test_a_tombstone_drops_what_is_held_of_its_memory_and_no_more() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    settings = FAST.model_copy(update={"max_batch": 100, "max_wait_s": 60.0})
    ours = [make_event("ada", f"I like topic {i}") for i in range(2)]
    theirs = make_event("ada", "I live in Porto", org="org-b")  # another memory, same user id
    publish(consumer, 0, *ours, theirs)
    tombstone = MemoryTombstone(
        organization_id="org-a", user_id="ada", erasure_id=uuid.uuid4(), forgotten_at=BASE_TIME
    )
    consumer.produce(0, tombstone.to_bytes(), tombstone.kafka_key)
    after = make_event("ada", "I collect stamps")
    publish(consumer, 0, after)
    processor = started(m.processor(consumer, FlakyBackend(), letters, settings))
    step_until(processor, lambda: consumer.fetched[0] == 5)
    # Dropped on sight of the tombstone; org-b's ada and what came after it are still held.
    assert {e.content for e in processor.held_events()} == {"I live in Porto", "I collect stamps"}
    processor.shutdown()
    assert consolidated(m, [theirs, after])
    assert not any(consolidated(m, [e]) for e in ours)
    assert letters.letters == []  # forgotten, not dead-lettered
    assert consumer.committed[0] == 5


class RefusesAdaHoldsBob(Gate):
    """Refuses ada's batch (not transient); bob's call waits at the gate."""

    def before(self, request: ConsolidationRequest) -> None:
        if request.key.user_id == "ada":
            raise BackendError("400 invalid argument")
        super().before(request)


def test_a_tombstone_drops_the_letters_of_its_memory_still_waiting_to_be_sent() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = RefusesAdaHoldsBob()
    bob, ada = make_event("bob", "I live in Porto"), make_event("ada", "I live in Lisbon")
    publish(consumer, 0, bob, ada)
    processor = started(m.processor(consumer, backend, letters))
    # Ada's batch is given up, its letter waits for bob's earlier record to be done.
    step_until(processor, lambda: backend.entered.is_set() and bool(m.runs.runs(key_of("ada"))))
    # Then ada's memory is erased: its cut-off, then its tombstone.
    m.db.cutoffs[SUBJECTS(key_of("ada"))] = {(TOPIC, 0): 2}
    tombstone = MemoryTombstone(
        organization_id="org-a", user_id="ada", erasure_id=uuid.uuid4(), forgotten_at=BASE_TIME
    )
    consumer.produce(0, tombstone.to_bytes(), tombstone.kafka_key)
    step_until(processor, lambda: consumer.fetched[0] == 3)
    backend.opened.set()
    step_until(processor, lambda: consumer.committed.get(0) == 3)
    processor.shutdown()
    assert consolidated(m, [bob])
    assert letters.letters == []  # forgotten: no copy of ada's event after the erasure


def test_a_flush_still_running_at_a_revocation_finishes_as_an_orphan() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    gate = Gate()
    event = make_event("ada", "I live in Lisbon")
    publish(consumer, 0, event)
    settings = FAST.model_copy(update={"revoke_wait_s": 0.01})
    processor = started(m.processor(consumer, gate, letters, settings))
    step_until(processor, gate.entered.is_set)

    consumer.rebalance(revoke={0}, assign=set())
    processor.step()
    assert consumer.committed.get(0, 0) == 0  # not done: nothing committed past it
    assert processor.assignment() == set()
    gate.opened.set()
    step_until(processor, lambda: consolidated(m, [event]))  # its effect is durable
    processor.shutdown()
    assert consumer.committed.get(0, 0) == 0  # the next owner re-reads it and finds it done


def test_lost_partitions_commit_nothing() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    gate = Gate()
    events = [make_event("ada", "I live in Lisbon")]
    publish(consumer, 0, *events)
    processor = started(m.processor(consumer, gate, letters))
    step_until(processor, gate.entered.is_set)
    consumer.rebalance(revoke={0}, assign=set(), lost=True)
    processor.step()
    gate.opened.set()
    step_until(processor, lambda: consolidated(m, events))
    processor.shutdown()
    assert all(c.get(0, 0) == 0 for c in consumer.commits)  # nothing past the event


def test_backpressure_pauses_and_resumes_the_consumer() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    gate = Gate()
    # One user's events: held back by the gate, they are in flight, not in the buffer.
    events = [make_event("ada", f"I read chapter {i}", minutes=i) for i in range(6)]
    publish(consumer, 0, *events)
    settings = FAST.model_copy(update={"max_buffered": 4, "concurrency": 1, "max_batch": 10})
    registry = CollectorRegistry()
    processor = started(
        MemoryProcessor(
            consumer,
            TOPIC,
            m.flusher(gate, settings.budget_policy),
            letters,
            PipelineMetrics(registry),
            settings,
        )
    )
    step_until(processor, lambda: bool(consumer.paused()))
    step_until(processor, lambda: registry.get_sample_value("memoryd_flushes_in_flight") == 1)
    # The gauge counts what the pause is decided on: the batch in flight too.
    held = registry.get_sample_value("memoryd_buffered_events")
    assert held is not None
    assert held >= settings.max_buffered
    gate.opened.set()
    step_until(processor, lambda: not consumer.paused())
    step_until(processor, lambda: consolidated(m, events))
    processor.shutdown()


def test_a_partition_paused_at_a_rebalance_and_assigned_back_is_read_again() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    gate = Gate()
    events = [make_event("ada", f"I read chapter {i}", minutes=i) for i in range(6)]
    publish(consumer, 0, *events)
    settings = FAST.model_copy(
        update={"max_buffered": 4, "concurrency": 1, "max_batch": 10, "revoke_wait_s": 0.01}
    )
    processor = started(m.processor(consumer, gate, letters, settings))
    step_until(processor, lambda: bool(consumer.paused()))
    # A rebalance while paused (a deploy, a member joining): the partition comes straight back
    # and kafka-python keeps it paused, but what the pause held was dropped.
    consumer.rebalance(revoke={0}, assign={0})
    processor.step()
    gate.opened.set()
    later = make_event("ada", "I finished the book", minutes=10)
    publish(consumer, 0, later)
    step_until(processor, lambda: consolidated(m, [*events, later]))
    processor.shutdown()
    assert consumer.committed[0] == 7


class BuggyIndex(InMemoryVectorIndex):
    """Raises what no adapter translates (a bug), on its first write only."""

    def __init__(self, m: InMemoryMemoryd) -> None:
        super().__init__(m.embedder)
        self.failed = False

    def upsert(self, facts: Sequence[Fact]) -> int:
        if not self.failed:
            self.failed = True
            raise RuntimeError("a bug in the index adapter")
        return super().upsert(facts)


def test_a_bug_in_an_index_write_leaves_its_facts_pending_and_later_flushes_succeed() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    index = BuggyIndex(m)
    settings = FAST.model_copy(update={"max_batch": 1})
    first, second = make_event("ada", "I live in Lisbon"), make_event("bo", "I live in Porto")
    processor = started(
        MemoryProcessor(
            consumer,
            TOPIC,
            m.flusher(FlakyBackend(), index=index),
            letters,
            PipelineMetrics(CollectorRegistry()),
            settings,
        )
    )
    publish(consumer, 0, first)
    step_until(processor, lambda: consolidated(m, [first]) and index.failed)
    publish(consumer, 0, second)
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()
    assert consolidated(m, [first, second])
    assert letters.letters == []
    ada = m.memory.facts(key_of("ada"))
    assert ada
    assert {f.fact_id for f in m.memory.pending_index()} == {f.fact_id for f in ada}


def test_events_an_earlier_try_consolidated_are_not_dead_lettered_with_the_rest() -> None:
    # A bisected batch applies its clean groups, then a later group's call keeps timing out
    # until the batch is given up: only what was not consolidated is dead-lettered.
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    applied, failing = make_event("ada", "I live in Lisbon"), make_event("ada", "I like tea")
    update = seed_update(m.memory, "ada", [])
    m.memory.apply(replace(update, run=replace(update.run, input_event_ids=(applied.event_id,))))
    publish(consumer, 0, applied, failing)
    backend = FlakyBackend([TransientBackendError("timed out")] * 10)
    settings = FAST.model_copy(update={"max_attempts": 2})
    processor = started(m.processor(consumer, backend, letters, settings))
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()
    assert [letter.offset for letter in letters.letters] == [1]
    failed = [r.run for r in m.runs.runs(key_of("ada")) if r.run.status is RunStatus.FAILED]
    assert [r.input_event_ids for r in failed] == [(failing.event_id,)]


class FailsOnce(FlakyBackend):
    """Refuses the batch (not transient); an erasure of its memory completes meanwhile."""

    def __init__(self, m: InMemoryMemoryd) -> None:
        super().__init__([BackendError("400 invalid argument")])
        self.m = m

    def before(self, request: ConsolidationRequest) -> None:
        # After the flush's reads under the lock: the erasure's cut-offs land before the
        # failed run is recorded and the events are dead-lettered.
        self.m.db.cutoffs[SUBJECTS(request.key)] = {(TOPIC, 0): 2}
        super().before(request)


def test_events_an_erasure_forgot_after_their_flush_failed_get_no_run_and_no_letter() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    events = [make_event("ada", "I live in Lisbon"), make_event("ada", "I like tea")]
    publish(consumer, 0, *events)
    processor = started(m.processor(consumer, FailsOnce(m), letters))
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()
    assert letters.letters == []
    assert m.runs.runs(key_of("ada")) == []  # nothing written after the erasure


class SlowToJoin(FakeConsumer):
    """A consumer whose group join takes `join_polls` polls and whose first fetch one more, as
    when the group waits out the session of a member that was killed; every poll takes 1 s."""

    def __init__(self, join_polls: int) -> None:
        super().__init__(TOPIC)
        self.now = 0.0
        self.polls = 0
        self.join_polls = join_polls

    def clock(self) -> float:
        return self.now

    def poll(self, timeout_ms: int) -> Any:
        self.now += 1.0
        self.polls += 1
        if self.polls < self.join_polls:
            return {}
        if self.polls == self.join_polls:
            self._run_rebalances()  # assigned, nothing fetched yet
            return {}
        return super().poll(timeout_ms)


def test_run_until_idle_counts_quiet_from_the_assignment_not_from_the_start() -> None:
    m, letters = InMemoryMemoryd(), ListDeadLetters()
    consumer = SlowToJoin(join_polls=10)
    ada = [make_event("ada", "I live in Lisbon")]
    publish(consumer, 0, *ada)
    flusher = m.flusher(FlakyBackend(), FAST.budget_policy)
    metrics = PipelineMetrics(CollectorRegistry())
    processor = MemoryProcessor(
        consumer, TOPIC, flusher, letters, metrics, FAST, monotonic=consumer.clock
    )

    processor.run_until_idle(idle_s=3.0, deadline_s=100.0)

    assert consumer.polls > consumer.join_polls  # it read after the join, not just up to it
    assert consolidated(m, ada)
    assert consumer.committed == {0: 1}
