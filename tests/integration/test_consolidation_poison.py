"""What cannot be consolidated goes to the dead-letter topic, and the partition moves on.

A record Postgres would refuse, a batch the backend chokes on, a dead-letter topic that fails
for a while: none of them stalls the partition, and offsets pass an event only once it is
consolidated or dead-lettered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.errors import KafkaError

from consumers.dead_letter import KafkaDeadLetterSink
from consumers.kafka_client import ConsumerSettings, make_consumer
from consumers.processor import MemoryProcessor
from consumers.settings import ProcessorSettings
from memoryd import wiring
from processors.consolidate import Consolidator
from processors.errors import BackendError
from processors.gate import WriteGate
from processors.schema import BackendResponse, ConsolidationRequest
from producers.contract import EventType
from tests.support.builders import make_event
from tests.support.deployment import (
    Deployment,
    dead_letters,
    headers_of,
    letter_count,
    limit_message_bytes,
)
from tests.support.fakes import FlakyBackend

pytestmark = pytest.mark.integration
# A record batch's header alone is 61 bytes, a letter's header names 95 more.
BELOW_ANY_LETTER = 128


def consumed(deployment: Deployment) -> set[object]:
    return {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}


def test_an_event_postgres_cannot_store_is_dead_lettered_alone(deployment: Deployment) -> None:
    # The contract refuses NUL, so the event is made as a producer that skips it would send it.
    poison = make_event("ada", "I work in engineering", minutes=0).model_copy(
        update={"content": "I work in engi\x00neering"}
    )
    fine = [
        make_event("ada", "I prefer short answers", EventType.PREFERENCE, minutes=1),
        make_event("bo", "I live in Lisbon", minutes=0),
    ]
    deployment.publish([poison, *fine])
    deployment.run_both()

    assert consumed(deployment) == {e.event_id for e in fine}
    logged = {r[0] for r in deployment.query("SELECT event_id FROM context_events")}
    assert logged == {e.event_id for e in fine}
    k = deployment.settings.kafka
    letters = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=2)
    assert sorted(headers_of(x)["dlq.consumer"] for x in letters) == ["log-writer", "processor"]
    assert all("NUL" in headers_of(x)["dlq.reason"] for x in letters)
    assert all(headers_of(x)["dlq.stage"] == "validate" for x in letters)


class ChokesOn(FlakyBackend):
    """The offline backend, except for one user, on whom it fails with a bug."""

    def __init__(self, user_id: str) -> None:
        super().__init__()
        self._user_id = user_id

    def before(self, request: ConsolidationRequest) -> None:
        if request.user_id == self._user_id:
            raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")

    def users(self) -> list[str]:
        return [r.user_id for r in self.requests]


def test_a_poison_batch_is_dead_lettered_and_its_offsets_pass(deployment: Deployment) -> None:
    poison = [make_event("ada", f"Ada note {i}", minutes=i) for i in range(2)]
    fine = [make_event("bo", "I live in Lisbon"), make_event("cy", "I work at Initech")]
    deployment.publish([*poison, *fine])
    backend = ChokesOn("ada")
    deployment.run_processor(backend)

    assert consumed(deployment) == {e.event_id for e in fine}
    assert backend.users().count("ada") == 1  # a bug is not retried
    k = deployment.settings.kafka
    letters = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=2)
    assert {headers_of(x)["dlq.stage"] for x in letters} == {"consolidate"}
    assert all("unexpected TypeError" in headers_of(x)["dlq.reason"] for x in letters)
    [(status, error)] = deployment.query(
        "SELECT status, error FROM consolidation_runs WHERE user_id = 'ada'"
    )
    assert status == "failed"
    assert "TypeError" in error

    # The offsets went past the dead-lettered events: the group reads nothing again.
    again = ChokesOn("ada")
    deployment.run_processor(again)
    assert again.users() == []
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 2


@contextmanager
def letters_refused(admin: Any, topic: str, until: Callable[[], bool]) -> Iterator[None]:
    """The dead-letter topic refuses every letter until `until()` holds: its max.message.bytes
    is below any letter's size, even one sent without its record's bytes (an operator's
    mistake, say), until a thread watching for that gives the topic its default back."""
    limit_message_bytes(admin, topic, BELOW_ANY_LETTER)
    done = threading.Event()
    failed: list[Exception] = []

    def watch() -> None:
        try:
            while not (done.is_set() or until()):
                time.sleep(0.01)
            reset = ConfigResource(ConfigResourceType.TOPIC, topic, ["max.message.bytes"])
            answer = admin.reset_configs([reset])
            if answer != {"topic": {topic: "OK"}}:
                raise AssertionError(f"the topic's limit was not reset: {answer}")
        except (AssertionError, KafkaError) as e:  # handed to the test's thread below
            failed.append(e)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=30)
    if failed:
        raise failed[0]


class AlwaysUnparseable:
    name, model, prompt_version = "scripted", "scripted-v1", "scripted-v1"

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        with self._lock:
            self.calls += 1
        raise BackendError("output is not JSON", raw_response='{"updated_working_mem')


def test_a_failing_dead_letter_topic_retries_the_letter_not_the_llm(
    deployment: Deployment, kafka_admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    events = [make_event("ada", "I work in engineering")]
    deployment.publish(events)
    backend = AlwaysUnparseable()
    s = deployment.settings
    k = s.kafka

    def run(c: wiring.Core) -> float:
        flusher = wiring.flusher(c, backend, Consolidator(WriteGate(None), c.prices))
        consumer = make_consumer(
            ConsumerSettings(k.bootstrap_servers, k.topic, k.processor_group, "test-processor")
        )
        sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
        settings = ProcessorSettings(max_wait_s=0.2, backoff_base_s=0.05, max_attempts=3)
        processor = MemoryProcessor(consumer, k.topic, flusher, sink, c.metrics, settings)

        def failures() -> float:
            labels = {"consumer": "processor", "cause": "dead_letter_topic"}
            return c.registry.get_sample_value("memoryd_outage_retries_total", labels) or 0.0

        with letters_refused(kafka_admin, k.dead_letter_topic, until=lambda: failures() > 0):
            processor.run_until_idle(idle_s=2.0)
        return failures()

    assert deployment.with_core(run) > 0
    refusals = [r.getMessage() for r in caplog.records if r.name == "consumers.outage"]
    assert refusals
    assert all("MessageSizeTooLargeError" in m for m in refusals), refusals
    assert backend.calls == 1
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 1
    runs = deployment.query("SELECT status, raw_response FROM consolidation_runs")
    assert runs == [("failed", '{"updated_working_mem')]
    assert consumed(deployment) == set()
