"""The log writer: every event on the topic into Postgres `context_events`, exactly once.

A polled batch is decoded, bad records go to the dead-letter topic, good ones are inserted in
one transaction (`ON CONFLICT DO NOTHING` on the memory and event id), and only then are
offsets committed. A crash between insert and commit replays the batch, and the replay
inserts nothing. Events of an erased memory recorded before its tombstone are not inserted
(`PostgresEventLog.append` checks the erasure's cut-offs); tombstones themselves are not events.
"""

from __future__ import annotations

import logging
import threading
import time

from consumers.dead_letter import DeadLetter, DeadLetterSink
from consumers.decoding import Rejected, decode_record
from consumers.kafka_client import EventConsumer, commit, from_kafka, subscribe
from consumers.metrics import PipelineMetrics
from domain.model import KafkaCoordinates
from domain.ports import EventLog
from domain.retry import Backoff
from producers.contract import ContextEvent, MemoryTombstone
from store.errors import DatabaseUnavailable

log = logging.getLogger(__name__)
CONSUMER_NAME = "log-writer"
# Postgres away: the batch is read again after this wait (domain.retry).
OUTAGE_BACKOFF = Backoff(base_s=0.5, max_s=30.0)


class LogWriter:
    def __init__(
        self,
        consumer: EventConsumer,
        topic: str,
        event_log: EventLog[ContextEvent],
        dead_letters: DeadLetterSink,
        metrics: PipelineMetrics,
        poll_timeout_ms: int = 500,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._log = event_log
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._poll_timeout_ms = poll_timeout_ms

    def run(self, stop: threading.Event) -> None:
        subscribe(self._consumer, self._topic)
        failures = 0
        try:
            while not stop.is_set():
                try:
                    self.step()
                    failures = 0
                except DatabaseUnavailable as e:
                    wait = OUTAGE_BACKOFF.delay(failures)
                    log.warning("Postgres unavailable, retrying the batch in %.1fs: %s", wait, e)
                    stop.wait(wait)
                    failures += 1
        finally:
            self.close()

    def close(self) -> None:
        self._consumer.close()
        self._dead_letters.close()

    def step(self) -> int:
        """Poll one batch and make it durable; returns the number of records handled."""
        batches = self._consumer.poll(timeout_ms=self._poll_timeout_ms)
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
        self._metrics.records.labels(CONSUMER_NAME).inc(count)
        try:
            self._dead_letters.send(bad)
            appended = self._log.append(good)
        except Exception:
            # Nothing of this batch is committed: rewind so the next poll reads it again.
            for ktp, offset in first.items():
                self._consumer.seek(ktp, offset)
            raise
        for letter in bad:
            self._metrics.dead_letters.labels(CONSUMER_NAME, letter.stage).inc()
            log.warning(
                "dead-lettered %s/%d@%d (%s): %s",
                letter.topic,
                letter.partition,
                letter.offset,
                letter.stage,
                letter.reason,
            )
        self._metrics.events_logged.inc(appended.inserted)
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(appended.forgotten)
        self._metrics.events_duplicate.labels(CONSUMER_NAME).inc(
            len(good) - appended.inserted - appended.forgotten
        )
        commit(self._consumer, positions)
        return count

    def drain(self, idle_s: float = 2.0, deadline_s: float = 120.0) -> int:
        """Run until no record arrived for `idle_s` (used by the demo and tests)."""
        subscribe(self._consumer, self._topic)
        total, quiet_since, start = 0, time.monotonic(), time.monotonic()
        try:
            while time.monotonic() - start < deadline_s:
                n = self.step()
                total += n
                if n:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since >= idle_s and self._consumer.assignment():
                    break
        finally:
            self.close()
        return total
