"""The dead-letter topic: records memoryd could not use, with the reason in their headers.

The original key and value are kept byte for byte, so `memoryd redrive` can put a record back
exactly as it was once the cause is fixed.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError

from consumers.batching import BufferedEvent
from consumers.errors import DeadLetterError

HEADER_REASON = "dlq.reason"
HEADER_STAGE = "dlq.stage"
HEADER_TOPIC = "dlq.source.topic"
HEADER_PARTITION = "dlq.source.partition"
HEADER_OFFSET = "dlq.source.offset"
HEADER_CONSUMER = "dlq.consumer"


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
    def send(self, letters: Sequence[DeadLetter]) -> None:
        """Write every letter durably or raise `DeadLetterError`."""

    def close(self) -> None: ...


class KafkaDeadLetterSink:
    def __init__(
        self, bootstrap_servers: str, topic: str, consumer_name: str, timeout_s: float = 30.0
    ) -> None:
        self._topic = topic
        self._consumer_name = consumer_name
        self._timeout_s = timeout_s
        self._producer: Any = KafkaProducer(
            bootstrap_servers=bootstrap_servers,
            client_id=f"{consumer_name}-dlq",
            acks="all",
            enable_idempotence=True,
            max_block_ms=int(timeout_s * 1000),
            delivery_timeout_ms=int(timeout_s * 1000),
            request_timeout_ms=min(int(timeout_s * 1000), 10_000),
        )

    def send(self, letters: Sequence[DeadLetter]) -> None:
        if not letters:
            return
        try:
            futures = [
                self._producer.send(
                    self._topic,
                    key=letter.key,
                    value=letter.value,
                    headers=letter.headers(self._consumer_name),
                )
                for letter in letters
            ]
            self._producer.flush(timeout=self._timeout_s)
            for future in futures:
                future.get(timeout=self._timeout_s)
        except KafkaError as e:
            raise DeadLetterError(f"{len(letters)} dead letter(s) not acknowledged: {e!r}") from e

    def close(self) -> None:
        self._producer.close()
