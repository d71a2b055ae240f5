"""The dead-letter topic: records memoryd could not use, with the reason in their headers.

The original key and value are kept byte for byte, so `memoryd redrive` can put a record back
exactly as it was once the cause is fixed. Two records cannot be kept: one with neither key
nor value (Kafka takes none such from a producer; the letter's value is empty), and one within
a letter's headers of the size limit (the letter leaves key and value out and says how large
they were, `dlq.omitted`; the record stays where its source headers point, until retention).
Either, refused, stalled its partition for good.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError, MessageSizeTooLargeError
from kafka.structs import ConsumerGroupMetadata, OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import BufferedEvent, TopicPartition
from consumers.errors import DeadLetterError
from producers.kafka_clients import open_client

log = logging.getLogger(__name__)
HEADER_REASON = "dlq.reason"
HEADER_STAGE = "dlq.stage"
HEADER_TOPIC = "dlq.source.topic"
HEADER_PARTITION = "dlq.source.partition"
HEADER_OFFSET = "dlq.source.offset"
HEADER_CONSUMER = "dlq.consumer"
HEADER_OMITTED = "dlq.omitted"
# Where a record is dead-lettered (`dlq.stage`): any consumer of the topic can fail to decode
# or validate it; only the processor consolidates and applies a budget.
READ_STAGES = ("decode", "validate")
PROCESSOR_STAGES = (*READ_STAGES, "consolidate", "budget")


@dataclass(frozen=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    stage: str
    reason: str
    topic: str
    partition: int
    offset: int

    def headers(self, consumer: str) -> list[tuple[str, bytes]]:
        return [
            (HEADER_REASON, self.reason.encode()),
            (HEADER_STAGE, self.stage.encode()),
            (HEADER_TOPIC, self.topic.encode()),
            (HEADER_PARTITION, str(self.partition).encode()),
            (HEADER_OFFSET, str(self.offset).encode()),
            (HEADER_CONSUMER, consumer.encode()),
        ]


def event_letters(
    items: Sequence[BufferedEvent],
    stage: str,
    reason: str,
    reasons: Mapping[uuid.UUID, str] | None = None,
) -> list[DeadLetter]:
    """Dead letters for valid events a consumer gives up on, each at its source offset;
    `reasons` gives some events a reason of their own (a bisected batch's)."""
    own = reasons or {}
    return [
        DeadLetter(
            i.event.kafka_key,
            i.event.to_bytes(),
            stage,
            own.get(i.event.event_id, reason),
            i.tp.topic,
            i.tp.partition,
            i.offset,
        )
        for i in items
    ]


class DeadLetterSink(Protocol):
    def send(
        self, letters: Sequence[DeadLetter], consumed: Mapping[TopicPartition, int], group: Any
    ) -> None:
        """Write every letter and commit the consumer group's positions `consumed` (partition
        -> next offset to read) in one Kafka transaction, or raise `DeadLetterError`; then
        neither is visible. `group` is the consumer's `group_metadata()`."""

    def close(self) -> None: ...


# A transaction here takes milliseconds. One left open by a killed process holds back every
# read_committed reader of the dead-letter topic until the broker aborts it, this long after
# it began (and the broker's next check for timed-out transactions).
TRANSACTION_TIMEOUT_MS = 10_000


class KafkaDeadLetterSink:
    """Letters and the offsets that move past their records, committed together.

    Sent and then committed separately, a crash in between read the records again and
    lettered them twice; in one transaction, a crash leaves neither (readers of the topic
    read committed records only). The transactional id is new for each process: the
    consumer group's generation (KIP-447) fences a consumer that lost its partitions, and
    a killed process's open transaction is aborted after `TRANSACTION_TIMEOUT_MS`.
    """

    def __init__(
        self, bootstrap_servers: str, topic: str, consumer_name: str, timeout_s: float = 30.0
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._topic = topic
        self._consumer_name = consumer_name
        self._timeout_s = timeout_s
        self._producer: Any = self._new_producer()
        self._initialised = False

    def send(
        self, letters: Sequence[DeadLetter], consumed: Mapping[TopicPartition, int], group: Any
    ) -> None:
        if not letters:
            return
        if isinstance(group, ConsumerGroupMetadata) and (
            group.generation_id < 0 or not group.member_id
        ):
            # Evicted from the group (kafka-python resets the generation to -1 and the member
            # id to ''): the broker takes a transactional commit with neither as an admin's and
            # fences nothing, so this consumer would letter records, and commit offsets, of
            # partitions another member owns now.
            raise DeadLetterError(
                f"{len(letters)} dead letter(s) not sent: the consumer is not in its group"
                f" (generation {group.generation_id}, member {group.member_id!r})"
            )
        try:
            producer = self._ready()
            producer.begin_transaction()
            for letter in letters:
                self._send_one(producer, letter)
            if consumed:
                offsets = {
                    KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(pos, "", -1)
                    for tp, pos in consumed.items()
                }
                producer.send_offsets_to_transaction(offsets, group)
            producer.commit_transaction()
        except KafkaError as e:
            self._abort()
            raise DeadLetterError(f"{len(letters)} dead letter(s) not committed: {e!r}") from e

    def _send_one(self, producer: Any, letter: DeadLetter) -> None:
        headers = letter.headers(self._consumer_name)
        value = b"" if letter.key is None and letter.value is None else letter.value
        try:
            producer.send(self._topic, key=letter.key, value=value, headers=headers)
        except MessageSizeTooLargeError:
            sizes = f"key={len(letter.key or b'')} value={len(letter.value or b'')} bytes"
            omitted = [*headers, (HEADER_OMITTED, sizes.encode())]
            producer.send(self._topic, key=None, value=b"", headers=omitted)

    def _new_producer(self) -> Any:
        return open_client(
            KafkaProducer,
            bootstrap_servers=self._bootstrap_servers,
            client_id=f"{self._consumer_name}-dlq",
            transactional_id=f"memoryd-{self._consumer_name}-dlq-{uuid.uuid4().hex}",
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            acks="all",
            max_block_ms=int(self._timeout_s * 1000),
            delivery_timeout_ms=int(self._timeout_s * 1000),
            request_timeout_ms=min(int(self._timeout_s * 1000), 10_000),
        )

    def _ready(self) -> Any:
        """The producer, its transactions initialised (on the first letter, not at start)."""
        if self._producer is None:
            self._producer = self._new_producer()
        if not self._initialised:
            self._producer.init_transactions()
            self._initialised = True
        return self._producer

    def _abort(self) -> None:
        """Abort the open transaction and drop the producer: the next send starts a new one.

        Aborted, the failed transaction holds back no read_committed reader of the topic until
        the broker times it out. Kept, the producer lost letters: kafka-python 3.0.12 bumps
        its epoch after a refused record (the topic's size limit, say), then the broker
        refuses its next transaction's records as out of sequence, its I/O thread dies, and
        `commit_transaction` returns as if that transaction had committed. Before a
        transaction began (no producer, or its `init_transactions` timed out) there is
        nothing to abort: the next send tries again with the same producer."""
        if self._producer is None or not self._initialised:
            return
        try:
            self._producer.abort_transaction()
        except KafkaError as e:  # fenced, or its state unknown: the broker aborts it in time
            log.warning("dead-letter transaction not aborted: %r", e)
        self._producer.close(timeout=0)
        self._producer = None
        self._initialised = False

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
