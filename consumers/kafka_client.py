"""Kafka consumers configured the way both runtimes need them, and the offset plumbing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition
from consumers.errors import ConsumerError
from producers.kafka_clients import open_client

log = logging.getLogger(__name__)


class PartitionLike(Protocol):
    """kafka-python's TopicPartition, as the runtimes read it."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


class RecordLike(Protocol):
    """kafka-python's ConsumerRecord, as the runtimes read it."""

    @property
    def offset(self) -> int: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def value(self) -> bytes | None: ...

    @property
    def headers(self) -> Sequence[tuple[str, bytes]] | None: ...


class EventConsumer(Protocol):
    """What the runtimes use of kafka-python's `KafkaConsumer`, which ships no types.

    Partitions and offsets cross it in kafka-python's own structs (`to_kafka`, `commit`);
    the rebalance listener is called back from inside `poll`.
    """

    def subscribe(self, topics: Sequence[str], listener: Any = None) -> None: ...

    def topics(self) -> set[str]: ...

    def poll(self, timeout_ms: int) -> Mapping[Any, Sequence[RecordLike]]: ...

    def assignment(self) -> set[Any]: ...

    def paused(self) -> set[Any]: ...

    def pause(self, *partitions: Any) -> None: ...

    def resume(self, *partitions: Any) -> None: ...

    def seek(self, partition: Any, offset: int) -> None: ...

    def commit(self, offsets: Mapping[Any, Any]) -> None: ...

    def commit_async(self, offsets: Mapping[Any, Any], callback: Callable[..., None]) -> Any: ...

    def group_metadata(self) -> Any: ...

    def position(self, partition: Any, timeout_ms: int | None = None) -> int | None: ...

    def highwater(self, partition: Any) -> int | None: ...

    def close(self) -> None: ...


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
    read_committed: bool = False  # the dead-letter topic's readers: it is written in transactions


def make_consumer(settings: ConsumerSettings) -> EventConsumer:
    """Manual commits only: an offset is committed after its effect is durable, never before."""
    consumer: EventConsumer = open_client(
        KafkaConsumer,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.group_id,
        client_id=settings.client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=settings.max_poll_records,
        session_timeout_ms=settings.session_timeout_ms,
        max_poll_interval_ms=settings.max_poll_interval_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        isolation_level="read_committed" if settings.read_committed else "read_uncommitted",
    )
    return consumer


def end_offsets(bootstrap_servers: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Partition -> the offset the next record will get, read without joining any group.
    Raises ConsumerError when the brokers cannot say (unreachable, timed out)."""
    timeout_ms = int(timeout_s * 1000)
    try:
        consumer = open_client(
            KafkaConsumer,
            bootstrap_servers=bootstrap_servers,
            client_id="memoryd-end-offsets",
            enable_auto_commit=False,
            request_timeout_ms=timeout_ms,
            # Or the constructor waits its own 30 s for a broker, whatever timeout_s says.
            bootstrap_timeout_ms=timeout_ms,
        )
    except KafkaError as e:
        raise ConsumerError(f"end offsets of {topic} not read: {e!r}") from e
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise ConsumerError(f"topic {topic} has no partitions (does it exist?)")
        ends = consumer.end_offsets([KafkaTopicPartition(topic, p) for p in partitions])
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    except KafkaError as e:
        raise ConsumerError(f"end offsets of {topic} not read: {e!r}") from e
    finally:
        consumer.close()


# How long a run that read everything there was stays quiet before it stops (`until_idle`):
# a poll or two, for a rebalance callback or a last record still on its way.
CAUGHT_UP_QUIET_S = 0.1


def until_idle(consumer: EventConsumer, quiet_s: float, idle_s: float) -> bool:
    """Whether a run that has been quiet for `quiet_s` is done: quiet for `idle_s`, or for
    `CAUGHT_UP_QUIET_S` having read every record there was. The second ends a run over a
    topic that stopped growing (the demo's, a test's) without waiting out `idle_s`."""
    if quiet_s >= idle_s:
        return True
    return quiet_s >= CAUGHT_UP_QUIET_S and caught_up(consumer)


def caught_up(consumer: EventConsumer) -> bool:
    """Whether the consumer has read every record its partitions held at its last fetch.

    No round trip: the high watermarks come with the fetch responses (none yet: not caught
    up), and a position is read as it stands (`timeout_ms=0` refreshes nothing).
    """
    partitions = consumer.assignment()
    if not partitions:
        return False
    for tp in partitions:
        end = consumer.highwater(tp)
        at = consumer.position(tp, timeout_ms=0)
        if end is None or at is None or at < end:
            return False
    return True


def subscribe(consumer: EventConsumer, topic: str, listener: Any | None = None) -> None:
    """Subscribe, then load the cluster metadata before the first poll joins the group.

    kafka-python 3.0.12 snapshots the subscribed topics' partitions only on a metadata update.
    Joining before one arrives, the group leader assigns nothing (or from a stale snapshot),
    and the next update forces a second rebalance. That rebalance can be lost: if a poll()
    times out mid-SyncGroup, need_rejoin() already reads False and the consumer keeps no
    partitions until some later rebalance (seen as a processor idling with zero partitions on
    a loaded machine). A blocking metadata fetch right after subscribing makes the first
    assignment complete and final.
    """
    if listener is None:
        consumer.subscribe([topic])
    else:
        consumer.subscribe([topic], listener=listener)
    consumer.topics()


def to_kafka(tp: TopicPartition) -> KafkaTopicPartition:
    return KafkaTopicPartition(tp.topic, tp.partition)


def from_kafka(tp: PartitionLike) -> TopicPartition:
    return TopicPartition(tp.topic, tp.partition)


def commit(consumer: EventConsumer, positions: Mapping[TopicPartition, int]) -> None:
    if positions:
        consumer.commit(
            {to_kafka(tp): OffsetAndMetadata(pos, "", -1) for tp, pos in positions.items()}
        )


def commit_async(consumer: EventConsumer, positions: Mapping[TopicPartition, int]) -> None:
    """Commit without blocking: the only kind allowed on kafka-python's IO thread, where the
    rebalance listener runs. A failure is logged when a later poll reports it."""
    if positions:
        consumer.commit_async(
            {to_kafka(tp): OffsetAndMetadata(pos, "", -1) for tp, pos in positions.items()},
            callback=_log_commit_failure,
        )


def _log_commit_failure(offsets: Any, result: Any) -> None:
    if isinstance(result, BaseException):
        # Harmless (the partition's next owner reads those records again), but visible.
        log.warning("asynchronous offset commit failed: %r", result)


class RevocationListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Forwards revoked and lost partitions to `on_leave(partitions, lost=...)` and assigned
    ones to `on_assigned(partitions)`.

    kafka-python calls it on its IO thread, inside the owner's `poll()`: the owner's thread is
    blocked meanwhile, and the callbacks must not make blocking consumer calls.
    """

    def __init__(
        self,
        on_leave: Callable[..., None],
        on_assigned: Callable[[list[TopicPartition]], None],
    ) -> None:
        self._on_leave = on_leave
        self._on_assigned = on_assigned

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._on_leave([from_kafka(tp) for tp in revoked])

    def on_partitions_lost(self, lost: Any) -> None:
        # Evicted from the group: the partitions are someone else's, nothing may be committed.
        self._on_leave([from_kafka(tp) for tp in lost], lost=True)

    def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("assigned %s", sorted(str(tp) for tp in assigned))
        self._on_assigned([from_kafka(tp) for tp in assigned])
