"""Kafka consumers configured the way both runtimes need them, and the offset plumbing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition


@dataclass(frozen=True)
class ConsumerSettings:
    bootstrap_servers: str
    topic: str
    group_id: str
    client_id: str
    max_poll_records: int = 500
    session_timeout_ms: int = 30_000
    max_poll_interval_ms: int = 300_000
    heartbeat_interval_ms: int = 3_000


def make_consumer(settings: ConsumerSettings) -> Any:
    """Manual commits only: an offset is committed after its effect is durable, never before."""
    return KafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.group_id,
        client_id=settings.client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=settings.max_poll_records,
        session_timeout_ms=settings.session_timeout_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
    )


def to_kafka(tp: TopicPartition) -> KafkaTopicPartition:
    return KafkaTopicPartition(tp.topic, tp.partition)


def from_kafka(tp: Any) -> TopicPartition:
    return TopicPartition(tp.topic, tp.partition)


def commit(consumer: Any, positions: Mapping[TopicPartition, int]) -> None:
    if positions:
        consumer.commit(
            {to_kafka(tp): OffsetAndMetadata(pos, "", -1) for tp, pos in positions.items()}
        )
