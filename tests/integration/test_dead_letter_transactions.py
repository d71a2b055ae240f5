"""Letters and the offsets past their records are committed in one Kafka transaction.

A letter sent and then an offset committed separately was doubled by a crash in between:
the record was read again and lettered again. In one transaction a crash leaves neither, and
the topic's readers (the invariant checker, `memoryd redrive`) read committed records only.
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.structs import ConsumerGroupMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition
from consumers.dead_letter import HEADER_OFFSET, HEADER_OMITTED, DeadLetter, KafkaDeadLetterSink
from consumers.errors import DeadLetterError
from memoryd.analyst.dead_letters import read_dead_letters
from tests.support.deployment import Deployment, dead_letters

pytestmark = pytest.mark.integration


def letter(topic: str, offset: int) -> DeadLetter:
    return DeadLetter(None, b"not json", "decode", "not JSON", topic, 0, offset)


def committed(bootstrap: str, group: str, tp: KafkaTopicPartition) -> int | None:
    consumer: Any = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    try:
        offset = consumer.committed(tp)
        return None if offset is None else int(offset)
    finally:
        consumer.close()


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
