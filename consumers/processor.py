"""The MemoryProcessor consumer: per-memory batches, concurrent flushes, safe offsets.

One thread owns the (not thread-safe) Kafka consumer: it polls, buffers events per memory,
hands ready memories to a thread pool, collects results, and commits per partition the offset
below the earliest record not done. A memory is never flushed twice at once; its tombstone drops
what is buffered of it. Rebalance callbacks run on kafka-python's IO thread, where a blocking
commit raises: a revocation commits asynchronously and leaves running batches as orphans.
What becomes of a batch once its flush is over is `consumers.settlement`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from kafka.errors import KafkaError

from consumers.backpressure import Backpressure
from consumers.batching import (
    Batch,
    BufferedEvent,
    OffsetTracker,
    TopicPartition,
    UserBuffers,
)
from consumers.dead_letter import PROCESSOR_STAGES, DeadLetter, DeadLetterSink
from consumers.decoding import Rejected, decode_record
from consumers.flush import UserFlusher
from consumers.flush_result import FlushResult
from consumers.forgetting import drop_held, held_events
from consumers.kafka_client import (
    EventConsumer,
    RevocationListener,
    commit,
    commit_async,
    from_kafka,
    subscribe,
    to_kafka,
    until_idle,
)
from consumers.liveness import ConsumerLiveness
from consumers.log_fields import key_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.record_letters import HeldLetters
from consumers.settings import ProcessorSettings
from consumers.settlement import CONSUMER_NAME, FLUSH_OUTCOMES, Settlement
from domain.ids import MemoryKey
from producers.contract import ContextEvent, MemoryTombstone

log = logging.getLogger(__name__)
POLL = "a poll"  # the outage source


class MemoryProcessor:
    def __init__(
        self,
        consumer: EventConsumer,
        topic: str,
        flusher: UserFlusher,
        dead_letters: DeadLetterSink,
        metrics: PipelineMetrics,
        settings: ProcessorSettings,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self.liveness = ConsumerLiveness(monotonic)  # read by /readyz
        self._topic = topic
        self._flusher = flusher
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._settings = settings
        self._monotonic = monotonic
        self._buffers = UserBuffers(settings.max_batch, settings.max_wait_s)
        self._offsets = OffsetTracker()
        self._batches: dict[MemoryKey, Batch] = {}  # in flight or waiting for a retry
        # Flushes still running for partitions this processor lost: their memories wait.
        self._orphans: dict[MemoryKey, Future[FlushResult]] = {}
        # Where each revoked partition must be read again from, should it come back to us.
        self._resume: dict[TopicPartition, int] = {}
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="flush")
        self._backpressure = Backpressure(consumer, settings.max_buffered)
        self.outage = Outage(CONSUMER_NAME, metrics, settings.backoff)
        metrics.expect(
            CONSUMER_NAME, PROCESSOR_STAGES, settings.budget_policy.value, FLUSH_OUTCOMES
        )
        # Undecodable records whose letters the dead-letter topic did not take yet.
        self._letters = HeldLetters(
            dead_letters, CONSUMER_NAME, metrics, self.outage, monotonic, consumer.group_metadata
        )
        self._settlement = Settlement(
            self._batches,
            self._offsets,
            flusher,
            self._letters,
            metrics,
            self.outage,
            settings,
            monotonic,
        )
        self._poll_failing = False

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        subscribe(self._consumer, self._topic, RevocationListener(self.revoke, self.assigned))

    def assignment(self) -> set[TopicPartition]:
        """The partitions this processor owns now."""
        return {from_kafka(tp) for tp in self._consumer.assignment()}

    def held_events(self) -> list[ContextEvent]:
        """Every event this processor holds in memory: buffered, or in a batch not settled."""
        return held_events(self._buffers, self._batches)

    def run(self, stop: threading.Event) -> None:
        self.start()
        try:
            while not stop.is_set():
                try:
                    self.step()
                except KafkaError as e:
                    # A fetch refused (e.g. the topic's ACL revoked, a record too large): wait
                    # it out as the log writer does. Nothing past a done record was committed.
                    stop.wait(self.outage.failed(e, POLL))
                    self._poll_failing = True
        finally:
            self.shutdown()

    def run_until_idle(self, idle_s: float = 3.0, deadline_s: float = 300.0) -> None:
        """Consume until nothing is buffered, in flight, waiting to be dead-lettered or
        arriving (demo and tests): quiet for `idle_s`, or briefly once every record there
        was is read (`kafka_client.until_idle`)."""
        self.start()
        start = quiet_since = self._monotonic()
        try:
            while self._monotonic() - start < deadline_s:
                polled = self.step()
                if polled or self._batches or self._orphans or self._buffers or self._letters:
                    quiet_since = self._monotonic()
                elif not self._consumer.assignment():
                    # Quiet counts from the assignment: a slow join or first fetch is not idle.
                    quiet_since = self._monotonic()
                elif until_idle(self._consumer, self._monotonic() - quiet_since, idle_s):
                    return
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Flush what is buffered, wait for it, commit what is done, finish indexing, stop."""
        deadline = self._monotonic() + 60
        while (len(self._buffers) or self._batches) and self._monotonic() < deadline:
            self._launch(force=True)
            self._collect(wait_s=0.2)
        self._letters.send_due(self._offsets)
        self._commit()
        self._pool.shutdown(wait=True)
        self._flusher.close()
        self._consumer.close()
        self._dead_letters.close()

    # -- one iteration --------------------------------------------------------------------

    def step(self) -> int:
        polled = self._poll()
        self.liveness.polled(paused=self._backpressure.paused)
        self._collect(wait_s=0.0)
        self._launch(force=False)
        self._letters.send_due(self._offsets)
        self._commit()
        self._metrics.buffered.set(self._held())  # what the pause is decided on
        self._metrics.in_flight.set(sum(1 for b in self._batches.values() if b.future))
        return polled

    def _poll(self) -> int:
        batches = self._consumer.poll(timeout_ms=self._settings.poll_timeout_ms)
        if self._poll_failing:
            self._poll_failing = False
            self.outage.recovered(POLL)
        now = self._monotonic()
        letters: list[DeadLetter] = []
        count = 0
        for ktp, records in batches.items():
            tp = from_kafka(ktp)
            for record in records:
                count += 1
                self._offsets.received(tp, record.offset)
                decoded = decode_record(record.value)
                if isinstance(decoded, Rejected):
                    letters.append(decoded.letter(record.key, record.value, tp, record.offset))
                elif isinstance(decoded, MemoryTombstone):
                    self._forget(decoded, tp, record.offset)
                    self._offsets.done(tp, record.offset)
                else:
                    self._buffers.add(BufferedEvent(tp, record.offset, decoded), now)
        self._metrics.records.labels(CONSUMER_NAME).inc(count)
        self._letters.wait(letters)
        return count

    def _launch(self, force: bool) -> None:
        now = self._monotonic()
        for batch in list(self._batches.values()):
            if batch.future is None and batch.not_before <= now:
                if batch.rejection is None:
                    self._submit(batch)
                else:
                    # Given up already: only recording its failed run is retried, never the
                    # backend call.
                    self._settlement.deliver(batch)
        busy = set(self._batches) | set(self._orphans)
        for key in self._buffers.ready(now, force=force, exclude=busy):
            taken = self._buffers.take(key)
            batch = Batch(key, taken.items)
            self._batches[key] = batch
            self._submit(batch)

    def _submit(self, batch: Batch) -> None:
        batch.future = self._pool.submit(
            self._flusher.flush, batch.key, list(batch.items), batch.attempt
        )

    def _forget(self, tombstone: MemoryTombstone, tp: TopicPartition, offset: int) -> None:
        dropped = drop_held(tombstone, self._buffers, self._batches)
        key = MemoryKey(tombstone.organization_id, tombstone.user_id)
        if key not in self._batches:  # one still running settles, and ends its outages, itself
            self._settlement.left(key)
        for item in dropped:
            self._offsets.done(item.tp, item.offset)
        # Given up before the erasure, their letters still waiting for earlier records.
        unsent = self._letters.forget(tombstone.kafka_key, tp, offset)
        for letter in unsent:
            self._offsets.done(tp, letter.offset)
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(len(dropped) + len(unsent))

    def _collect(self, wait_s: float) -> None:
        deadline = self._monotonic() + wait_s
        while True:
            finished = [
                b for b in self._batches.values() if b.future is not None and b.future.done()
            ]
            for batch in finished:
                self._settlement.settle(batch)
            self._reap_orphans()
            if finished or self._monotonic() >= deadline:
                return
            time.sleep(0.01)

    # -- offsets and flow control ---------------------------------------------------------

    def _commit(self) -> None:
        positions = self._offsets.committable()
        if positions:
            try:
                commit(self._consumer, positions)
            except KafkaError as e:
                # Not a data problem: an offset left uncommitted only means its record is read
                # again, and consolidated_events makes that a no-op. Usually the group is
                # rebalancing; the next step commits again if the partition is still ours.
                self._metrics.commit_failures.labels(CONSUMER_NAME).inc()
                log.warning("offset commit failed, retrying on the next step: %r", e)
            else:
                self._offsets.committed(positions)
        self._metrics.commit_lag.labels(CONSUMER_NAME).set(self._offsets.open_count())

    def _held(self) -> int:
        """Events held (buffered, in flight, to retry), paused at too many."""
        held = len(self._buffers) + sum(len(b.items) for b in self._batches.values())
        self._backpressure.update(held)
        return held

    def revoke(self, tps: Sequence[TopicPartition], *, lost: bool = False) -> None:
        """Partitions are leaving (called on kafka-python's IO thread, inside `poll`).

        Revoked: wait briefly for running flushes, settle what finished and commit it without
        blocking. Lost (we were evicted): commit nothing, we no longer own them. Either way
        the rest is forgotten and the new owner re-reads it.
        """
        self.liveness.left(tps, lost=lost)
        gone = set(tps)
        mine = [b for b in self._batches.values() if b.items[0].tp in gone]
        if not lost:
            running = [b.future for b in mine if b.future is not None]
            wait(running, timeout=self._settings.revoke_wait_s)
            for batch in mine:
                if batch.future is not None and batch.future.done():
                    self._settlement.settle(batch)
            positions = {tp: p for tp, p in self._offsets.committable().items() if tp in gone}
            commit_async(self._consumer, positions)
        for batch in [b for b in self._batches.values() if b.items[0].tp in gone]:
            del self._batches[batch.key]
            self._settlement.left(batch.key)
            if batch.future is not None:
                # Still running: its memory waits for it before a new flush starts here.
                self._orphans[batch.key] = batch.future
        if not self._batches:
            self._settlement.forsaken()
        dropped = self._buffers.drop_partitions(gone)
        if not lost:
            for tp in gone:
                position = self._offsets.position(tp)
                if position is not None:
                    self._resume[tp] = position
        self._offsets.forget(gone)
        self._letters.drop(gone)
        counts = (len(gone), len(self._orphans), dropped)
        kind = "lost" if lost else "revoked"
        log.info("%s %d partition(s): %d flush(es) still running, %d dropped", kind, *counts)

    def assigned(self, tps: Sequence[TopicPartition]) -> None:
        """Partitions arrive (IO thread). kafka-python keeps its fetch position for a partition
        that was revoked and assigned straight back, past the events revoke() dropped from
        the buffers: read those again from the first one not done, or they would be skipped
        and a later commit would pass them."""
        self.liveness.assigned(tps)
        for tp in tps:
            if tp in self._resume:
                self._consumer.seek(to_kafka(tp), self._resume[tp])
        self._resume.clear()  # the others are someone else's now
        self._backpressure.assigned()  # unpaused: what was held is dropped

    def _reap_orphans(self) -> None:
        for key, future in list(self._orphans.items()):
            if future.done():
                del self._orphans[key]
                if future.exception() is not None:
                    # Not lost: the partition's owner re-reads these events and retries them.
                    log.info("orphaned flush failed: %r", future.exception(), extra=key_fields(key))
