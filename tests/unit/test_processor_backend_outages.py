"""The processor when the backend fails transiently: the retry delay the provider asks for is
honoured (up to a cap); the backend failing every memory is an outage, waited out without
charging attempts; one batch failing while others are answered is still dead-lettered; a
refused key is an outage at once, even for one memory."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from consumers.processor import MemoryProcessor
from domain.model import MemoryUpdate
from processors.errors import CredentialsRefused, TransientBackendError
from processors.schema import ConsolidationRequest
from producers.contract import ContextEvent
from store.errors import DatabaseRefused
from tests.support.builders import key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, TOPIC, InMemoryMemoryd, step_until


def publish(consumer: FakeConsumer, *events: ContextEvent) -> None:
    for e in events:
        consumer.produce(0, e.to_bytes(), e.kafka_key)


def metric(processor: MemoryProcessor, name: str, *labels: str) -> float:
    metrics: Any = processor._metrics
    return float(getattr(metrics, name).labels(*labels)._value.get())


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The waits the processor computed for the flushes it retries, from its log."""
    return [r.retry_in_s for r in caplog.records if hasattr(r, "retry_in_s")]


def test_a_backend_failing_every_memory_is_waited_out_as_it_asks_not_dead_lettered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    # Far more failures than the attempts a batch has, and a quota's delay far above backoff.
    backend = FlakyBackend([TransientBackendError("429", retry_after_s=0.2)] * 10)
    events = [make_event(user, f"{user} lives in Lisbon") for user in ("ada", "bob")]
    publish(consumer, *events)
    settings = FAST.model_copy(update={"max_attempts": 3, "backend_outage_after": 2})
    processor = m.processor(consumer, backend, letters, settings)
    processor.start()

    step_until(processor, lambda: metric(processor, "degraded", "processor") == 1)
    step_until(processor, lambda: consumer.committed.get(0) == 2)
    processor.shutdown()

    assert letters.letters == []
    for e in events:
        assert m.memory.already_consolidated(key_of(e.user_id), [e.event_id])
    assert backend.calls == 12
    assert metric(processor, "outage_retries", "processor", "backend") >= 1
    assert metric(processor, "degraded", "processor") == 0
    delays = retry_delays(caplog)
    assert len(delays) == 10
    assert all(d >= 0.2 for d in delays), delays


def test_a_provider_s_retry_delay_is_honoured_up_to_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = FlakyBackend([TransientBackendError("429", retry_after_s=3600.0)] * 2)
    publish(consumer, make_event("ada", "I live in Lisbon"))
    settings = FAST.model_copy(update={"backend_retry_max_s": 0.1})
    processor = m.processor(consumer, backend, letters, settings)
    processor.start()
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()

    assert backend.calls == 3
    assert retry_delays(caplog) == [0.1, 0.1]
    assert letters.letters == []


class FailsFor(FlakyBackend):
    """Fails one memory's every call, transiently, asking for a delay; answers the others."""

    def __init__(self, user_id: str) -> None:
        super().__init__()
        self.user_id = user_id

    def before(self, request: ConsolidationRequest) -> None:
        if request.user_id == self.user_id:
            raise TransientBackendError("503", retry_after_s=0.1)


def test_a_batch_failing_alone_while_others_are_answered_is_dead_lettered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    events = [make_event(user, f"{user} lives in Lisbon") for user in ("ada", "bob", "cy")]
    publish(consumer, *events)
    settings = FAST.model_copy(update={"max_attempts": 3, "backend_outage_after": 2})
    processor = m.processor(consumer, FailsFor("ada"), letters, settings)
    processor.start()
    step_until(processor, lambda: consumer.committed.get(0) == 3)
    processor.shutdown()

    assert [(x.stage, x.offset) for x in letters.letters] == [("consolidate", 0)]
    assert letters.letters[0].reason == "gave up after 3 attempts: 503"
    for e in events[1:]:
        assert m.memory.already_consolidated(key_of(e.user_id), [e.event_id])
    assert metric(processor, "outage_retries", "processor", "backend") == 0
    assert retry_delays(caplog) == [0.1, 0.1]


def test_a_refused_key_is_waited_out_for_one_memory_without_charging_attempts() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    # More refusals than the attempts a batch has, and one memory only: still an outage.
    backend = FlakyBackend([CredentialsRefused("401 UNAUTHENTICATED")] * 5)
    event = make_event("ada", "I live in Lisbon")
    publish(consumer, event)
    settings = FAST.model_copy(update={"max_attempts": 2})
    processor = m.processor(consumer, backend, letters, settings)
    processor.start()

    step_until(processor, lambda: metric(processor, "degraded", "processor") == 1)
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()

    assert letters.letters == []
    assert m.memory.already_consolidated(key_of("ada"), [event.event_id])
    assert backend.calls == 6
    assert metric(processor, "outage_retries", "processor", "backend_auth") == 5
    assert metric(processor, "outage_retries", "processor", "backend") == 0
    assert metric(processor, "backend_retries", backend.name) == 0
    assert metric(processor, "degraded", "processor") == 0


def test_an_answer_whose_write_is_refused_ends_the_backend_s_outage(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend answered: it is back, though the database refused what it answered."""
    caplog.set_level(logging.INFO)
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    backend = FlakyBackend([CredentialsRefused("401 UNAUTHENTICATED")])
    publish(consumer, make_event("ada", "I live in Lisbon"))
    apply, refusals = m.memory.apply, [1]

    def refused_once(update: MemoryUpdate) -> None:
        if refusals.pop() if refusals else False:
            raise DatabaseRefused("cannot execute INSERT in a read-only transaction")
        apply(update)

    monkeypatch.setattr(m.memory, "apply", refused_once)
    processor = m.processor(consumer, backend, letters)
    processor.start()
    step_until(processor, lambda: consumer.committed.get(0) == 1)
    processor.shutdown()

    assert backend.calls == 2  # the retry after the refused write applies the answer kept
    said = [r.getMessage() for r in caplog.records if r.name == "consumers.outage"]
    ended = said.index("a backend call recovered after 1 retries")
    refused = next(n for n, line in enumerate(said) if "database_refused" in line)
    assert ended < refused, said
