"""The log writer: every event on the topic into Postgres `context_events`, exactly once.

A polled batch is decoded, good records are inserted in one transaction (`ON CONFLICT DO
NOTHING` on the memory and event id), and only then are offsets committed. A crash between
insert and commit replays the batch, and the replay inserts nothing. The bad records' letters
go to the dead-letter topic in one Kafka transaction with the batch's offsets, after the
insert: a failed insert, which rewinds the batch, has sent nothing, and a crash or a failure
before that transaction commits leaves neither letters nor offsets, so the replay letters
each record once.

Every outage (Postgres away or refusing writes, the broker away, the dead-letter topic
unwritable, a commit failed in a rebalance) is retried with bounded backoff for as long as it
lasts, and said in the log and `memoryd_consumer_degraded` (`consumers.outage`).

Events of an erased memory recorded before its tombstone are not inserted
(`PostgresEventLog.append` checks the erasure's cut-offs); tombstones themselves are not events.
"""

from __future__ import annotations

import logging
import threading
import time

from kafka.errors import KafkaError

from consumers.batching import TopicPartition
from consumers.dead_letter import READ_STAGES, DeadLetter, DeadLetterSink
from consumers.decoding import Rejected, decode_record
from consumers.kafka_client import (
    EventConsumer,
    RevocationListener,
    commit,
    from_kafka,
    subscribe,
    until_idle,
)
from consumers.liveness import ConsumerLiveness
from consumers.log_fields import letter_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import DEFAULT_BACKOFF, OUTAGES, Outage
from domain.model import KafkaCoordinates
from domain.ports import EventLog
from domain.retry import Backoff
from producers.contract import ContextEvent, MemoryTombstone

log = logging.getLogger(__name__)
CONSUMER_NAME = "log-writer"


class LogWriter:
    def __init__(
        self,
        consumer: EventConsumer,
        topic: str,
        event_log: EventLog[ContextEvent],
        dead_letters: DeadLetterSink,
        metrics: PipelineMetrics,
        poll_timeout_ms: int = 500,
        liveness: ConsumerLiveness | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._log = event_log
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._poll_timeout_ms = poll_timeout_ms
        self._liveness = liveness or ConsumerLiveness()
        self.outage = Outage(CONSUMER_NAME, metrics, backoff)
        metrics.expect(CONSUMER_NAME, READ_STAGES)

    @property
    def liveness(self) -> ConsumerLiveness:
        return self._liveness

    def _subscribe(self) -> None:
        live = self._liveness
        subscribe(self._consumer, self._topic, RevocationListener(live.left, live.assigned))

    def run(self, stop: threading.Event) -> None:
        self._subscribe()
        try:
            while not stop.is_set():
                try:
                    self.step()
                except OUTAGES as e:
                    stop.wait(self.outage.failed(e, "a batch"))
                else:
                    self.outage.recovered("a batch")
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()
        self._dead_letters.close()

    def step(self) -> int:
        """Poll one batch and make it durable; returns the number of records handled."""
        batches = self._consumer.poll(timeout_ms=self._poll_timeout_ms)
        self._liveness.polled()
        if not batches:
            return 0
        good: list[tuple[ContextEvent, KafkaCoordinates]] = []
        bad: list[DeadLetter] = []
        positions = {}
        first = {}
        for ktp, records in batches.items():
            tp = from_kafka(ktp)
            first[ktp] = records[0].offset
            for record in records:
                decoded = decode_record(record.value)
                if isinstance(decoded, MemoryTombstone):
                    continue  # its erasure wrote the cut-offs this writer checks
                if isinstance(decoded, Rejected):
                    bad.append(
                        DeadLetter(
                            record.key,
                            record.value,
                            decoded.stage,
                            decoded.reason,
                            tp.topic,
                            tp.partition,
                            record.offset,
                        )
                    )
                else:
                    good.append((decoded, KafkaCoordinates(tp.topic, tp.partition, record.offset)))
            positions[tp] = records[-1].offset + 1
        count = sum(len(r) for r in batches.values())
        try:
            appended = self._log.append(good)
            if bad:  # their transaction commits the offsets
                self._send_letters(bad, positions)
        except Exception:
            # Nothing of this batch is committed: rewind so the next poll reads it again.
            for ktp, offset in first.items():
                self._consumer.seek(ktp, offset)
            raise
        # Counted once handled: a batch rewound by an outage is polled again, maybe many times.
        self._metrics.records.labels(CONSUMER_NAME).inc(count)
        self._metrics.events_logged.inc(appended.inserted)
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(appended.forgotten)
        self._metrics.events_duplicate.labels(CONSUMER_NAME).inc(
            len(good) - appended.inserted - appended.forgotten
        )
        if bad:
            return count
        try:
            commit(self._consumer, positions)
        except KafkaError as e:
            # Everything is durable; only the position is not. Usually a rebalance: whoever
            # owns the partition next reads these records again, which inserts nothing.
            self._metrics.commit_failures.labels(CONSUMER_NAME).inc()
            log.warning("offset commit failed, the records will be read again: %r", e)
        return count

    def _send_letters(
        self, letters: list[DeadLetter], positions: dict[TopicPartition, int]
    ) -> None:
        self._dead_letters.send(letters, positions, self._consumer.group_metadata())
        for letter in letters:
            self._metrics.dead_letters.labels(CONSUMER_NAME, letter.stage, letter.cause).inc()
            log.warning(
                "dead-lettered a record: %s",
                letter.reason,
                extra=letter_fields(letter, CONSUMER_NAME),
            )

    def drain(self, idle_s: float = 2.0, deadline_s: float = 120.0) -> int:
        """Run until no record arrived for `idle_s`, or briefly once every record there was
        is read (`kafka_client.until_idle`; used by the demo and tests)."""
        self._subscribe()
        total, quiet_since, start = 0, time.monotonic(), time.monotonic()
        try:
            while time.monotonic() - start < deadline_s:
                n = self.step()
                total += n
                if n or not self._consumer.assignment():
                    # Quiet counts from the assignment: joining the group can take longer
                    # than `idle_s` on a busy machine, and nothing arrives before it.
                    quiet_since = time.monotonic()
                elif until_idle(self._consumer, time.monotonic() - quiet_since, idle_s):
                    break
        finally:
            self.close()
        return total
