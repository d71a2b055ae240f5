"""Bad input against the decoder and both consumers, as properties: whatever a topic holds,
nothing raises out of a consumer, every bad record is dead-lettered exactly once with a reason
that names what is wrong and quotes at most an excerpt of it, and every valid event is logged
and consolidated exactly once. The consumers run on a fake Kafka consumer and the in-memory
stores (the same classes `memoryd log-writer` and `memoryd processor` run)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from consumers.decoding import Rejected, decode_record
from consumers.log_writer import LogWriter
from consumers.metrics import PipelineMetrics
from domain.ids import MemoryKey
from domain.model import RunStatus
from producers.contract import ContextEvent
from store.inmemory import InMemoryEventLog
from tests.support.bad_input import (
    BadRecord,
    bad_records,
    check_reason,
    valid_events,
    wrong_headers,
)
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, SUBJECTS, TOPIC, InMemoryMemoryd, step_until

NO_WAIT = FAST.model_copy(update={"max_wait_s": 0.0, "poll_timeout_ms": 0})
EXAMPLES = settings(
    max_examples=1_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# A topic's records: valid events (some sent twice) and bad records, on two partitions.
Item = tuple[ContextEvent | BadRecord, int]
topics = st.lists(
    st.tuples(valid_events() | bad_records(), st.integers(0, 1)), min_size=1, max_size=6
).flatmap(lambda items: st.tuples(st.just(items), st.lists(st.sampled_from(items), max_size=2)))


def _publish(
    consumer: FakeConsumer, items: list[Item], headers: Any
) -> dict[tuple[int, int], BadRecord]:
    """Publish every item; the bad ones by (partition, offset)."""
    bad = {}
    for item, partition in items:
        if isinstance(item, ContextEvent):
            consumer.produce(partition, item.to_bytes(), item.kafka_key, headers)
        else:
            offset = consumer.produce(partition, item.value, b"\xff\x00", headers)
            bad[(partition, offset)] = item
    return bad


def _all_committed(consumer: FakeConsumer) -> bool:
    return all(consumer.committed.get(p, 0) == len(log) for p, log in consumer.log.items())


def _check_letters(letters: ListDeadLetters, bad: dict[tuple[int, int], BadRecord]) -> None:
    """Each bad record dead-lettered once, byte for byte, with a fitting reason; nothing else."""
    by_offset = Counter((x.partition, x.offset) for x in letters.letters)
    assert by_offset == Counter(bad.keys())
    for letter in letters.letters:
        record = bad[(letter.partition, letter.offset)]
        assert letter.value == record.value
        check_reason(record, letter.stage, letter.reason)


def _valid(items: list[Item]) -> dict[Any, ContextEvent]:
    return {
        (e.organization_id, e.user_id, e.event_id): e
        for e, _ in items
        if isinstance(e, ContextEvent)
    }


@EXAMPLES
@given(record=bad_records())
def test_the_decoder_rejects_every_bad_record_with_its_reason(record: BadRecord) -> None:
    decoded = decode_record(record.value)
    assert isinstance(decoded, Rejected), decoded
    check_reason(record, decoded.stage, decoded.reason)


@EXAMPLES
@given(event=valid_events())
def test_the_decoder_takes_every_valid_event_as_it_was_sent(event: ContextEvent) -> None:
    assert decode_record(event.to_bytes()) == event


@pytest.mark.timeout(900)  # ~40 s on a quiet machine, 200 s at load 28 on two cores
@EXAMPLES
@given(topic=topics, headers=wrong_headers())
def test_the_log_writer_logs_valid_events_once_and_dead_letters_bad_records_once(
    topic: tuple[list[Item], list[Item]], headers: Any
) -> None:
    items = topic[0] + topic[1]
    consumer, letters = FakeConsumer(TOPIC, partitions=2), ListDeadLetters()
    bad = _publish(consumer, items, headers)
    m = InMemoryMemoryd()
    log = InMemoryEventLog(m.db, SUBJECTS)
    writer = LogWriter(consumer, TOPIC, log, letters, PipelineMetrics(CollectorRegistry()))
    writer.drain(idle_s=0.0, deadline_s=10.0)

    assert _all_committed(consumer)
    _check_letters(letters, bad)
    valid = _valid(items)
    logged = [
        e.event
        for key in {MemoryKey(org, user) for org, user, _ in valid}
        for e in log.user_events(key)
    ]
    assert sorted(logged, key=lambda e: e.event_id) == sorted(
        valid.values(), key=lambda e: e.event_id
    )


@pytest.mark.timeout(900)  # ~40 s on a quiet machine, 200 s at load 28 on two cores
@EXAMPLES
@given(topic=topics, headers=wrong_headers())
def test_the_processor_consolidates_valid_events_once_and_dead_letters_bad_records_once(
    topic: tuple[list[Item], list[Item]], headers: Any
) -> None:
    items = topic[0] + topic[1]
    consumer, letters = FakeConsumer(TOPIC, partitions=2), ListDeadLetters()
    bad = _publish(consumer, items, headers)
    m = InMemoryMemoryd()
    processor = m.processor(consumer, FlakyBackend(), letters, NO_WAIT)
    processor.start()
    step_until(processor, lambda: _all_committed(consumer), timeout_s=20.0)
    processor.shutdown()

    _check_letters(letters, bad)
    valid = _valid(items)
    consumed = Counter(
        (r.run.key.organization_id, r.run.key.user_id, event_id)
        for r in m.db.runs.values()
        if r.run.status is RunStatus.SUCCEEDED
        for event_id in r.run.input_event_ids
    )
    assert consumed == Counter(valid.keys())


# -- what the properties found, one example each -----------------------------------------------


def _event(**changes: Any) -> bytes:
    data = {
        "schema_version": 1,
        "event_id": "6f1c3a52-8a0e-4d4b-9a57-3f1f0f2a7c11",
        "user_id": "ada",
        "organization_id": "org-a",
        "event_type": "fact",
        "content": "I live in Lisbon",
        "source_metadata": {"source": "interactive"},
        "occurred_at": "2026-01-01T00:00:00Z",
        **changes,
    }
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("value", "stage", "reason"),
    [
        # json.loads raised RecursionError, out of the consumer's loop.
        (b"[" * 100_000, "decode", "not JSON: nested too deeply"),
        # ...and ValueError for an integer past Python's 4300-digit conversion limit.
        (_event()[:-1] + b', "n": ' + b"9" * 5_000 + b"}", "decode", "too long to convert"),
        # A scaffold_update whose content nests deeper than json.loads can: RecursionError
        # out of the contract's own validator.
        (
            _event(event_type="scaffold_update", scaffold_key="k", content="[" * 3000 + "]" * 3000),
            "validate",
            "scaffold_update content is nested too deeply",
        ),
        # A key given twice was read as its last value, silently.
        (_event()[:-1] + b', "user_id": "bob"}', "decode", "not JSON: duplicate key 'user_id'"),
        # \u0000 in a scaffold value: valid text, but jsonb refuses it in every write.
        (
            _event(event_type="scaffold_update", scaffold_key="k", content='"a\\u0000b"'),
            "validate",
            "the scaffold value contains NUL",
        ),
    ],
)
def test_records_the_properties_found(value: bytes, stage: str, reason: str) -> None:
    decoded = decode_record(value)
    assert isinstance(decoded, Rejected)
    assert (decoded.stage, reason in decoded.reason) == (stage, True), decoded.reason


def test_an_unknown_field_is_named_by_an_excerpt_only() -> None:
    decoded = decode_record(_event(**{"x" * 5_000: 1}))
    assert isinstance(decoded, Rejected)
    assert (
        decoded.reason
        == f"invalid ContextEvent: {'x' * 39 + '…'!r}: Extra inputs are not permitted"
    )
