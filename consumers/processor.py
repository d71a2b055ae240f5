"""The MemoryProcessor consumer: per-user batches, concurrent flushes, safe offsets.

One thread owns the Kafka consumer (kafka-python's consumer is not thread-safe): it polls,
buffers events per user, hands ready users to a thread pool, collects results, and commits
per partition the offset below the earliest record not yet done. A user is never flushed
twice at once: while a batch is in flight or waiting for a retry, newer events wait.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from kafka import ConsumerRebalanceListener

from consumers.batching import BufferedEvent, OffsetTracker, TopicPartition, UserBuffers
from consumers.dead_letter import DeadLetter, DeadLetterSink
from consumers.decoding import Rejected, decode_event
from consumers.errors import DeadLetterError
from consumers.flush import FlushKind, FlushResult, UserFlusher
from consumers.kafka_client import commit, from_kafka
from consumers.metrics import PipelineMetrics
from processors.errors import BackendError, TransientBackendError
from store.errors import DatabaseUnavailable, EventsAlreadyConsolidated, StaleMemoryVersion

log = logging.getLogger(__name__)
CONSUMER_NAME = "processor"


@dataclass(frozen=True)
class ProcessorSettings:
    max_batch: int = 20
    max_wait_s: float = 2.0
    concurrency: int = 4
    max_attempts: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    max_buffered: int = 5_000
    poll_timeout_ms: int = 200


@dataclass
class Batch:
    user_id: str
    items: list[BufferedEvent]
    attempt: int = 0
    not_before: float = 0.0
    future: Future[FlushResult] | None = field(default=None, repr=False)

    @property
    def events(self) -> list[Any]:
        return [i.event for i in self.items]


class MemoryProcessor:
    def __init__(
        self,
        consumer: Any,
        topic: str,
        flusher: UserFlusher,
        dead_letters: DeadLetterSink,
        metrics: PipelineMetrics,
        settings: ProcessorSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self._topic = topic
        self._flusher = flusher
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._settings = settings
        self._monotonic = monotonic
        self._buffers = UserBuffers(settings.max_batch, settings.max_wait_s)
        self._offsets = OffsetTracker()
        self._batches: dict[str, Batch] = {}  # in flight or waiting for a retry, by user
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="flush")
        self._paused = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._consumer.subscribe([self._topic], listener=_Rebalance(self))

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                self.step()
        finally:
            self.shutdown()

    def run_until_idle(self, idle_s: float = 3.0, deadline_s: float = 300.0) -> None:
        """Consume until nothing is buffered, in flight or arriving (demo and tests)."""
        self.start()
        start = quiet_since = self._monotonic()
        try:
            while self._monotonic() - start < deadline_s:
                if self.step() or self._batches or len(self._buffers):
                    quiet_since = self._monotonic()
                elif self._monotonic() - quiet_since >= idle_s and self._consumer.assignment():
                    return
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Flush what is buffered, wait for it, commit what is done, stop the pool."""
        deadline = self._monotonic() + 60
        while (len(self._buffers) or self._batches) and self._monotonic() < deadline:
            self._launch(force=True)
            self._collect(wait_s=0.2)
        self._commit()
        self._pool.shutdown(wait=True)
        self._consumer.close()
        self._dead_letters.close()

    # -- one iteration --------------------------------------------------------------------

    def step(self) -> int:
        polled = self._poll()
        self._collect(wait_s=0.0)
        self._launch(force=False)
        self._commit()
        self._backpressure()
        self._metrics.buffered.set(len(self._buffers))
        self._metrics.in_flight.set(sum(1 for b in self._batches.values() if b.future))
        return polled

    def _poll(self) -> int:
        batches = self._consumer.poll(timeout_ms=self._settings.poll_timeout_ms)
        now = self._monotonic()
        letters: list[tuple[TopicPartition, int, DeadLetter]] = []
        count = 0
        for ktp, records in batches.items():
            tp = from_kafka(ktp)
            for record in records:
                count += 1
                self._offsets.received(tp, record.offset)
                decoded = decode_event(record.value)
                if isinstance(decoded, Rejected):
                    letter = DeadLetter(
                        record.key,
                        record.value,
                        decoded.stage,
                        decoded.reason,
                        tp.topic,
                        tp.partition,
                        record.offset,
                    )
                    letters.append((tp, record.offset, letter))
                else:
                    self._buffers.add(BufferedEvent(tp, record.offset, decoded), now)
        self._metrics.records.labels(CONSUMER_NAME).inc(count)
        if letters:
            # If this raises, nothing is committed past these records and the process stops:
            # a dead-letter topic we cannot write to is an outage, not a record problem.
            self._dead_letters.send([x[2] for x in letters])
            for tp, offset, letter in letters:
                self._offsets.done(tp, offset)
                self._metrics.dead_letters.labels(CONSUMER_NAME, letter.stage).inc()
                log.warning(
                    "dead-lettered %s/%d@%d (%s): %s",
                    tp.topic,
                    tp.partition,
                    offset,
                    letter.stage,
                    letter.reason,
                )
        return count

    def _launch(self, force: bool) -> None:
        now = self._monotonic()
        for batch in self._batches.values():
            if batch.future is None and batch.not_before <= now:
                self._submit(batch)
        for user_id in self._buffers.ready(now, force=force, exclude=self._batches):
            taken = self._buffers.take(user_id)
            batch = Batch(user_id, taken.items)
            self._batches[user_id] = batch
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        batch.future = self._pool.submit(
            self._flusher.flush, batch.user_id, batch.events, batch.attempt
        )

    def _collect(self, wait_s: float) -> None:
        deadline = self._monotonic() + wait_s
        while True:
            finished = [
                b for b in self._batches.values() if b.future is not None and b.future.done()
            ]
            for batch in finished:
                self._settle(batch)
            if finished or self._monotonic() >= deadline:
                return
            time.sleep(0.01)

    # -- outcomes -------------------------------------------------------------------------

    def _settle(self, batch: Batch) -> None:
        assert batch.future is not None
        future, batch.future = batch.future, None
        try:
            result = future.result()
        except (EventsAlreadyConsolidated, StaleMemoryVersion) as e:
            # Another run got there first; planning again on fresh state drops what it did.
            log.info("re-planning %s: %s", batch.user_id, e)
            self._metrics.flushes.labels("replanned").inc()
            return
        except TransientBackendError as e:
            self._retry_or_give_up(batch, e)
            return
        except BackendError as e:
            self._give_up(batch, f"backend error: {e}", e.raw_response)
            return
        except DatabaseUnavailable as e:
            self._retry_later(batch, f"database unavailable: {e}", count_attempt=False)
            return
        except Exception as e:
            log.exception("flush of %s failed unexpectedly", batch.user_id)
            self._give_up(batch, f"unexpected {type(e).__name__}: {e}", None)
            return
        if result.kind is FlushKind.DEFERRED:
            self._dead_letter(batch, "budget", result.reason)
            return
        self._finish(batch, result.kind.value)

    def _retry_or_give_up(self, batch: Batch, error: TransientBackendError) -> None:
        self._metrics.backend_retries.labels(self._flusher.backend_name).inc()
        if batch.attempt + 1 >= self._settings.max_attempts:
            self._give_up(
                batch, f"gave up after {batch.attempt + 1} attempts: {error}", error.raw_response
            )
        else:
            self._retry_later(batch, str(error), count_attempt=True)

    def _retry_later(self, batch: Batch, reason: str, count_attempt: bool) -> None:
        step = batch.attempt if count_attempt else min(batch.attempt, 3)
        delay = min(self._settings.backoff_max_s, self._settings.backoff_base_s * 2**step)
        batch.not_before = self._monotonic() + delay * random.uniform(0.8, 1.2)
        if count_attempt:
            batch.attempt += 1
        log.warning("flush of %s failed (%s); retry in %.2fs", batch.user_id, reason, delay)

    def _give_up(self, batch: Batch, reason: str, raw: str | None) -> None:
        try:
            self._flusher.record_failure(batch.user_id, batch.events, batch.attempt, reason, raw)
        except DatabaseUnavailable as e:
            self._retry_later(batch, f"cannot record the failed run: {e}", count_attempt=False)
            return
        self._dead_letter(batch, "consolidate", reason)

    def _dead_letter(self, batch: Batch, stage: str, reason: str) -> None:
        letters = [
            DeadLetter(
                i.event.kafka_key,
                i.event.to_bytes(),
                stage,
                reason,
                i.tp.topic,
                i.tp.partition,
                i.offset,
            )
            for i in batch.items
        ]
        try:
            self._dead_letters.send(letters)
        except DeadLetterError as e:
            self._retry_later(batch, str(e), count_attempt=False)
            return
        self._metrics.dead_letters.labels(CONSUMER_NAME, stage).inc(len(letters))
        log.error(
            "dead-lettered %d event(s) of %s (%s): %s", len(letters), batch.user_id, stage, reason
        )
        self._finish(batch, f"dead_lettered_{stage}")

    def _finish(self, batch: Batch, outcome: str) -> None:
        for item in batch.items:
            self._offsets.done(item.tp, item.offset)
        del self._batches[batch.user_id]
        self._metrics.flushes.labels(outcome).inc()

    # -- offsets and flow control ---------------------------------------------------------

    def _commit(self) -> None:
        positions = self._offsets.committable()
        if positions:
            commit(self._consumer, positions)
            self._offsets.committed(positions)
        self._metrics.commit_lag.labels(CONSUMER_NAME).set(self._offsets.open_count())

    def _backpressure(self) -> None:
        held = len(self._buffers) + sum(len(b.items) for b in self._batches.values())
        if not self._paused and held >= self._settings.max_buffered:
            self._consumer.pause(*self._consumer.assignment())
            self._paused = True
        elif self._paused and held < self._settings.max_buffered // 2:
            self._consumer.resume(*self._consumer.paused())
            self._paused = False

    def revoke(self, tps: Sequence[TopicPartition]) -> None:
        """Partitions are leaving: finish their flushes, commit, forget the rest."""
        gone = set(tps)
        mine = [b for b in self._batches.values() if b.items and b.items[0].tp in gone]
        running = [b.future for b in mine if b.future is not None]
        wait(running, timeout=self._settings.max_wait_s + 60)
        for batch in mine:
            if batch.future is not None and batch.future.done():
                self._settle(batch)
        for batch in [b for b in self._batches.values() if b.items and b.items[0].tp in gone]:
            del self._batches[batch.user_id]  # waiting for a retry: the new owner retries
        self._buffers.drop_partitions(gone)
        self._commit()
        self._offsets.forget(gone)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, processor: MemoryProcessor) -> None:
        self._processor = processor

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._processor.revoke([from_kafka(tp) for tp in revoked])

    def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("assigned %s", sorted(str(tp) for tp in assigned))
