"""The dead-letter topic read whole, as `SeenLetter`s for the invariant checker.

Read by partition assignment (no consumer group), from the first offset to the end offset
the broker reports when the read starts: nothing is committed, and any number of readers
can look at the same topic without moving anyone's progress. Letters are written in
transactions (`consumers.dead_letter`): only committed ones are read, and the end is the
last stable offset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from consumers.dead_letter import (
    HEADER_CONSUMER,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_REASON,
    HEADER_STAGE,
    HEADER_TOPIC,
)
from domain.ids import MemoryKey
from producers.contract import ContextEvent
from producers.kafka_clients import open_client


@dataclass(frozen=True)
class SeenLetter:
    """One record of the dead-letter topic, as the invariant checker needs it."""

    consumer: str
    stage: str
    reason: str
    source: tuple[str, int, int]  # topic, partition, offset of the record it stands for
    key: MemoryKey | None = None  # None: the record was not a valid event
    event_id: uuid.UUID | None = None


class DeadLetterReadError(RuntimeError):
    """The dead-letter topic could not be read to its end in time."""


def seen_letter(headers: Sequence[tuple[str, bytes]] | None, value: bytes | None) -> SeenLetter:
    h = {k: v.decode(errors="replace") for k, v in headers or ()}
    event = _event(value)
    return SeenLetter(
        consumer=h.get(HEADER_CONSUMER, ""),
        stage=h.get(HEADER_STAGE, ""),
        reason=h.get(HEADER_REASON, ""),
        source=(
            h.get(HEADER_TOPIC, ""),
            int(h.get(HEADER_PARTITION, -1)),
            int(h.get(HEADER_OFFSET, -1)),
        ),
        key=None if event is None else MemoryKey(event.organization_id, event.user_id),
        event_id=None if event is None else event.event_id,
    )


def _event(value: bytes | None) -> ContextEvent | None:
    """The event a letter carries; None for a record that never was one (no memory, no id)."""
    if value is None:
        return None
    try:
        return ContextEvent.from_bytes(value)
    except ValueError:
        return None


def read_dead_letters(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[SeenLetter]:
    """Every record on `topic` up to its current end."""
    consumer: Any = open_client(
        KafkaConsumer,
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        if not parts:
            raise DeadLetterReadError(f"topic {topic} has no partitions")
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        letters: list[SeenLetter] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise DeadLetterReadError(
                    f"{topic}: read {len(letters)} of {sum(end.values())} record(s) in time"
                )
            for records in consumer.poll(timeout_ms=500).values():
                letters.extend(seen_letter(r.headers, r.value) for r in records)
        return letters
    finally:
        consumer.close()
