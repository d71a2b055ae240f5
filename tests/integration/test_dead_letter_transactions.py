"""Letters and the offsets past their records are committed in one Kafka transaction.

A letter sent and then an offset committed separately was doubled by a crash in between:
the record was read again and lettered again. In one transaction a crash leaves neither, and
the topic's readers (the invariant checker, `memoryd redrive`) read committed records only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.structs import ConsumerGroupMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition
from consumers.dead_letter import HEADER_OFFSET, HEADER_OMITTED, DeadLetter, KafkaDeadLetterSink
from consumers.errors import DeadLetterError
from memoryd.analyst.dead_letters import read_dead_letters
from tests.support.deployment import (
    Deployment,
    committed,
    dead_letters,
    limit_message_bytes,
    max_message_bytes,
    wait_until,
)

pytestmark = pytest.mark.integration


def letter(topic: str, offset: int) -> DeadLetter:
    return DeadLetter(None, b"not json", "decode", "not JSON", topic, 0, offset)


def test_the_letters_and_their_offsets_commit_together(deployment: Deployment) -> None:
    k = deployment.settings.kafka
    group = "letters-and-offsets"
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        sink.send([letter(k.topic, 0), letter(k.topic, 1)], {TopicPartition(k.topic, 0): 2}, group)
    finally:
        sink.close()
    seen = read_dead_letters(k.bootstrap_servers, k.dead_letter_topic)
    assert sorted(x.source for x in seen) == [(k.topic, 0, 0), (k.topic, 0, 1)]
    assert committed(k.bootstrap_servers, group, KafkaTopicPartition(k.topic, 0)) == 2


def test_a_consumer_evicted_from_its_group_letters_nothing(deployment: Deployment) -> None:
    # kafka-python's group metadata once the consumer was evicted (reset_generation): with no
    # generation and no member, the broker took the transaction's offsets unfenced, over those
    # of the partition's new owner, and its letters doubled the new owner's.
    k = deployment.settings.kafka
    group = "evicted-consumer"
    evicted = ConsumerGroupMetadata(group_id=group, generation_id=-1, member_id="")
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        with pytest.raises(DeadLetterError, match="not in its group"):
            sink.send([letter(k.topic, 0)], {TopicPartition(k.topic, 0): 1}, evicted)
    finally:
        sink.close()
    assert read_dead_letters(k.bootstrap_servers, k.dead_letter_topic) == []
    assert committed(k.bootstrap_servers, group, KafkaTopicPartition(k.topic, 0)) is None


def test_the_letters_of_an_aborted_transaction_are_not_read(deployment: Deployment) -> None:
    # What the broker does to the open transaction of a process killed before its commit.
    k = deployment.settings.kafka
    abandoned: Any = KafkaProducer(
        bootstrap_servers=k.bootstrap_servers, transactional_id="killed-processor"
    )
    try:
        abandoned.init_transactions()
        abandoned.begin_transaction()
        abandoned.send(k.dead_letter_topic, value=b"not json", partition=0)
        abandoned.flush()
        abandoned.abort_transaction()
    finally:
        abandoned.close()
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        sink.send([letter(k.topic, 0)], {}, None)
    finally:
        sink.close()
    seen = read_dead_letters(k.bootstrap_servers, k.dead_letter_topic)
    assert [x.source for x in seen] == [(k.topic, 0, 0)]


def test_records_no_letter_can_copy_are_lettered_without_their_bytes(
    deployment: Deployment,
) -> None:
    # Kafka takes no record without key and value from a producer, and none over its size
    # limit: a 1 MiB record fits the limit alone, not with a letter's headers. Refused, the
    # letter was retried forever and its partition stalled.
    k = deployment.settings.kafka
    group = "letters-without-bytes"
    near_limit = b"x" * (1024 * 1024 - 100)
    empty = DeadLetter(None, None, "decode", "record has no value", k.topic, 0, 0)
    large = DeadLetter(b"ada", near_limit, "decode", "not JSON", k.topic, 0, 1)
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "log-writer")
    try:
        sink.send([empty, large], {TopicPartition(k.topic, 0): 2}, group)
    finally:
        sink.close()
    records = sorted(
        dead_letters(k.bootstrap_servers, k.dead_letter_topic, 2),
        key=lambda r: int(dict(r.headers)[HEADER_OFFSET]),
    )
    assert [(r.key, r.value) for r in records] == [(None, b""), (None, b"")]
    assert HEADER_OMITTED not in dict(records[0].headers)
    assert (
        dict(records[1].headers)[HEADER_OMITTED] == f"key=3 value={len(near_limit)} bytes".encode()
    )
    assert committed(k.bootstrap_servers, group, KafkaTopicPartition(k.topic, 0)) == 2


# A record batch's header alone is 61 bytes, a letter's header names 95 more.
BELOW_ANY_LETTER = 128
# Above a letter of a short record, or of none (about 250 bytes), below one of 4000 bytes.
BELOW_A_LARGE_RECORD = 1024


def test_a_letter_the_topic_refuses_as_too_large_goes_without_its_bytes(
    kafka_bootstrap: str, kafka_admin: Any, kafka_topic_factory: Callable[..., str]
) -> None:
    # The dead-letter topic's own limit below the producer's: the broker refused the letter
    # inside the transaction, and it was retried for as long as that lasted.
    source, dlq = kafka_topic_factory(prefix="events"), kafka_topic_factory(prefix="dlq")
    limit_message_bytes(kafka_admin, dlq, BELOW_A_LARGE_RECORD)
    group = "letters-refused-by-the-broker"
    large = b"x" * 4000
    letters = [
        letter(source, 0),
        DeadLetter(b"ada", large, "decode", "not JSON", source, 0, 1),
        letter(source, 2),
    ]
    sink = KafkaDeadLetterSink(kafka_bootstrap, dlq, "processor", timeout_s=10.0)
    try:
        sink.send(letters, {TopicPartition(source, 0): 3}, group)
    finally:
        sink.close()
    records = sorted(
        dead_letters(kafka_bootstrap, dlq, 3), key=lambda r: int(dict(r.headers)[HEADER_OFFSET])
    )
    assert [(r.key, r.value) for r in records] == [
        (None, b"not json"),
        (None, b""),
        (None, b"not json"),
    ]
    omitted = [dict(r.headers).get(HEADER_OMITTED) for r in records]
    assert omitted == [None, f"key=3 value={len(large)} bytes".encode(), None]
    assert len(read_dead_letters(kafka_bootstrap, dlq)) == 3  # the aborted attempts left none
    assert committed(kafka_bootstrap, group, KafkaTopicPartition(source, 0)) == 3


def test_a_topic_that_refuses_even_a_letter_without_bytes_is_an_outage(
    kafka_bootstrap: str, kafka_admin: Any, kafka_topic_factory: Callable[..., str]
) -> None:
    source, dlq = kafka_topic_factory(prefix="events"), kafka_topic_factory(prefix="dlq")
    limit_message_bytes(kafka_admin, dlq, BELOW_ANY_LETTER)
    group = "letters-refused-even-bare"
    large = DeadLetter(b"ada", b"x" * 4000, "decode", "not JSON", source, 0, 0)
    sink = KafkaDeadLetterSink(kafka_bootstrap, dlq, "processor", timeout_s=10.0)
    try:
        with pytest.raises(DeadLetterError, match="refuses even a letter without"):
            sink.send([large], {TopicPartition(source, 0): 1}, group)
        assert read_dead_letters(kafka_bootstrap, dlq) == []
        assert committed(kafka_bootstrap, group, KafkaTopicPartition(source, 0)) is None

        # The operator fixes the topic: the same sink's next attempt writes the letter whole.
        reset = ConfigResource(ConfigResourceType.TOPIC, dlq, ["max.message.bytes"])
        assert kafka_admin.reset_configs([reset]) == {"topic": {dlq: "OK"}}
        wait_until(
            lambda: max_message_bytes(kafka_admin, dlq) != str(BELOW_ANY_LETTER), 10, "reset"
        )
        sink.send([large], {TopicPartition(source, 0): 1}, group)
    finally:
        sink.close()
    [record] = dead_letters(kafka_bootstrap, dlq, 1)
    assert (record.key, len(record.value)) == (b"ada", 4000)
    assert committed(kafka_bootstrap, group, KafkaTopicPartition(source, 0)) == 1
