"""Publishing `ContextEvent`s to Kafka with the guarantees the pipeline relies on.

acks=all and the idempotent producer mean a broker-side retry never writes a record twice;
`event_id` covers the retries the caller makes itself. The send is bounded in time and a
delivery failure is raised to the caller instead of being logged away.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from producers.contract import SCHEMA_VERSION, ContextEvent, MemoryTombstone
from producers.errors import PublishError, Undelivered
from producers.kafka_clients import (
    close_now,
    has_failed_for_good,
    open_client,
    unanswered,
    was_aborted,
)
from producers.partitioner import RememberingPartitioner

log = logging.getLogger(__name__)


class EventPublisher(Protocol):
    def publish(self, events: Sequence[ContextEvent]) -> None:
        """Deliver every event or raise `PublishError`."""


@dataclass(frozen=True)
class ProducerSettings:
    bootstrap_servers: str
    topic: str
    delivery_timeout_ms: int = 30_000
    request_timeout_ms: int = 10_000
    linger_ms: int = 5
    # Per partition. kafka-python's 16 KiB default closes a batch every ~40 events, and each
    # batch costs a wake-up of the sender thread and a request: 256 KiB cut the producer's CPU
    # per event from 44 to 30 us (BENCHMARKS, Ingest). Below the broker's 1 MiB request limit.
    batch_size_bytes: int = 256 * 1024
    # At most the topic's max.message.bytes (see KafkaSettings.max_record_bytes).
    max_record_bytes: int = 1_048_576
    client_id: str = "memoryd-producer"


def event_headers(event: ContextEvent) -> list[tuple[str, bytes]]:
    return [
        ("schema_version", str(SCHEMA_VERSION).encode()),
        ("event_type", event.event_type.value.encode()),
        ("event_id", str(event.event_id).encode()),
    ]


def open_kafka_producer(settings: ProducerSettings) -> Any:
    return open_client(
        KafkaProducer,
        bootstrap_servers=settings.bootstrap_servers,
        client_id=settings.client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=settings.linger_ms,
        # A batch the topic would refuse is split and sent again: not built at all.
        batch_size=min(settings.batch_size_bytes, settings.max_record_bytes),
        max_request_size=settings.max_record_bytes,
        partitioner=RememberingPartitioner(),
        request_timeout_ms=settings.request_timeout_ms,
        delivery_timeout_ms=settings.delivery_timeout_ms,
        max_block_ms=settings.delivery_timeout_ms,
    )


class KafkaEventPublisher:
    """The production `EventPublisher`: one Kafka producer, thread-safe, reused per process.

    A producer that failed for good (see `has_failed_for_good`) is replaced by a new one: a
    record the broker refused costs that record and the ones caught up with it, not every
    later request."""

    def __init__(
        self,
        settings: ProducerSettings,
        open_producer: Callable[[ProducerSettings], Any] = open_kafka_producer,
    ) -> None:
        self._settings = settings
        self._open_producer = open_producer
        self._producer = open_producer(settings)
        # Held while a failed producer is replaced, so that concurrent requests make one.
        self._replacing = threading.Lock()
        # Held by `close`, so that a second close waits for the first and then does nothing.
        self._closing = threading.Lock()
        self._closed = False

    def publish(self, events: Sequence[ContextEvent]) -> None:
        """Send every event, then wait once for all of them, up to the delivery timeout.

        Not all or none: the producer is idempotent, not transactional, so the events that were
        acknowledged are on the topic whatever became of the others. `PublishError.undelivered`
        names the others. A memory's events share a key, hence a partition, and the idempotent
        producer (acks=all, at most 5 requests in flight) writes them in the order sent, retries
        included; an event refused leaves a gap in that order, not a reordering.
        """
        producer = self._working_producer()
        deadline = time.monotonic() + self._settings.delivery_timeout_ms / 1000
        sent, undelivered = self._send_all(producer, events)
        # flush() sends what lingers at once instead of after linger_ms. It waits for every batch
        # of this shared producer, other requests' too, and its errors are about those batches
        # (a timeout, one aborted): which of these events were acknowledged, their own futures
        # say, below.
        with contextlib.suppress(KafkaError):
            producer.flush(timeout=self._remaining(deadline))
        failed: list[tuple[int, Any, KafkaError]] = []
        for position, future in sent:
            try:
                future.get(timeout=self._remaining(deadline))
            except KafkaError as e:
                failed.append((position, future, e))
        if failed and self._failed_for_good(producer):
            # Once the broker refuses one record, the producer aborts every other one, with the
            # refused one's error: those the broker never judged may be sent again.
            undelivered += [
                Undelivered(p, repr(e), e.retriable or was_aborted(f)) for p, f, e in failed
            ]
            # The next request need not meet the failed producer. No new one now is the next
            # request's error to report: this one's outcome is decided, and said below.
            with contextlib.suppress(PublishError):
                self._working_producer()
        else:
            undelivered += [Undelivered(p, repr(e), e.retriable) for p, _, e in failed]
        if undelivered:
            undelivered.sort(key=lambda u: u.position)
            raise PublishError(
                f"{len(undelivered)} of {len(events)} event(s) not acknowledged: "
                f"{undelivered[0].reason}",
                undelivered,
            )

    def _send_all(
        self, producer: Any, events: Sequence[ContextEvent]
    ) -> tuple[list[tuple[int, Any]], list[Undelivered]]:
        sent: list[tuple[int, Any]] = []
        undelivered: list[Undelivered] = []
        for position, event in enumerate(events):
            try:
                future = producer.send(
                    self._settings.topic,
                    key=event.kafka_key,
                    value=event.to_bytes(),
                    headers=event_headers(event),
                )
            except KafkaTimeoutError as e:
                # No metadata or no buffer space within max_block_ms: each of the events left
                # would wait as long again, for the same reason.
                undelivered.extend(
                    Undelivered(p, repr(e), retriable=True) for p in range(position, len(events))
                )
                break
            except KafkaError as e:
                # A producer another request replaced (and closed) refuses the send for what
                # the producer is, not for what the event is.
                retriable = e.retriable or producer is not self._producer
                undelivered.append(Undelivered(position, repr(e), retriable))
            else:
                sent.append((position, future))
        return sent, undelivered

    def _failed_for_good(self, producer: Any) -> bool:
        return producer is not self._producer or has_failed_for_good(producer)

    def _working_producer(self) -> Any:
        """The producer, or a new one in place of one that failed for good. The failed one is
        closed without waiting on its broker: the records it still held fail, retriable."""
        with self._replacing:
            failed = self._producer
            if not has_failed_for_good(failed):
                return failed
            try:
                self._producer = self._open_producer(self._settings)
            except KafkaError as e:
                # The failed one stays, found again by the next request, which tries again.
                raise PublishError(f"no new producer in place of a failed one: {e!r}") from e
            working = self._producer
        # Why it failed, kafka-python's sender logged as it did.
        log.warning("the Kafka producer failed for good: replaced by a new one")
        close_now(failed, self._settings.request_timeout_ms / 1000)
        return working

    @staticmethod
    def _remaining(deadline: float) -> float:
        return max(0.0, deadline - time.monotonic())

    def publish_tombstone(self, tombstone: MemoryTombstone) -> TombstonePosition:
        """Publish a memory's tombstone under the memory's key; returns where it landed.

        Consumers read the memory's events before this position as forgotten, so the caller
        records it before erasing anything.
        """
        timeout_s = self._settings.delivery_timeout_ms / 1000
        producer = self._working_producer()
        try:
            future = producer.send(
                self._settings.topic,
                key=tombstone.kafka_key,
                value=tombstone.to_bytes(),
                headers=[
                    ("schema_version", str(SCHEMA_VERSION).encode()),
                    ("record_type", tombstone.kind.encode()),
                ],
            )
            producer.flush(timeout=timeout_s)
            metadata = future.get(timeout=timeout_s)
        except KafkaError as e:
            if self._failed_for_good(producer):
                with contextlib.suppress(PublishError):  # as in publish
                    self._working_producer()
            raise PublishError(f"tombstone not acknowledged: {e!r}") from e
        return TombstonePosition(metadata.topic, metadata.partition, metadata.offset)

    def close(self) -> None:
        """Close the producer within twice its request timeout, whatever its broker does.

        The records it holds first get the request timeout to be delivered: a publish of
        another thread may be waiting for them, and a healthy broker takes them. kafka-python's
        own `close()` waited for them without a limit, and an idempotent producer whose broker
        stopped answering neither sends nor expires them, so a process stopping then never
        exited: those still held after the wait are given up (each belongs to a publish that
        raises PublishError for it) and the producer is closed by force.

        Closing a closed publisher does nothing: the API closes it in the server's graceful
        stop, and again, after the server, when it stops on SIGINT."""
        with self._closing:
            if not self._closed:
                self._closed = True
                self._close()

    def _close(self) -> None:
        timeout_s = self._settings.request_timeout_ms / 1000
        with contextlib.suppress(KafkaError):
            self._producer.flush(timeout=timeout_s)
        given_up = unanswered(self._producer)
        try:
            close_now(self._producer, timeout_s)
        except KafkaError as e:  # its I/O thread did not end in time: left to the process's end
            log.warning("Kafka producer not closed: %r", e)
        if given_up:
            log.warning(
                "Kafka producer closed with %d record(s) unacknowledged: given up (their"
                " publish is answered as failed)",
                given_up,
            )
        else:
            log.info("Kafka producer closed with no record unacknowledged")


@dataclass(frozen=True)
class TombstonePosition:
    topic: str
    partition: int
    offset: int
