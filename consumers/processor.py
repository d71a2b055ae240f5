"""The MemoryProcessor consumer: per-memory batches, concurrent flushes, safe offsets.

One thread owns the (not thread-safe) Kafka consumer: it polls, buffers events per memory,
hands ready memories to a thread pool, collects results, and commits per partition the offset
below the earliest record not done. A memory is never flushed twice at once; its tombstone drops
what is buffered of it. Rebalance callbacks run on kafka-python's IO thread, where a blocking
commit raises: a revocation commits asynchronously and leaves running batches as orphans.
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
    Rejection,
    TopicPartition,
    UserBuffers,
)
from consumers.dead_letter import PROCESSOR_STAGES, DeadLetter, DeadLetterSink, event_letters
from consumers.decoding import Rejected, decode_record
from consumers.flush import FlushKind, FlushResult, UserFlusher
from consumers.forgetting import drop_held, held_events
from consumers.kafka_client import (
    EventConsumer,
    RevocationListener,
    commit,
    commit_async,
    from_kafka,
    subscribe,
    to_kafka,
)
from consumers.liveness import ConsumerLiveness
from consumers.log_fields import batch_fields, key_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.record_letters import HeldLetters
from consumers.settings import ProcessorSettings
from domain.ids import MemoryKey
from processors.errors import BackendError, TransientBackendError
from producers.contract import ContextEvent, MemoryTombstone
from store.errors import (
    DatabaseUnavailable,
    EventsAlreadyConsolidated,
    StaleMemoryVersion,
    StoreError,
)

log = logging.getLogger(__name__)
CONSUMER_NAME = "processor"  # the `consumer` label and log field


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
        metrics.expect(CONSUMER_NAME, PROCESSOR_STAGES, settings.budget_policy.value)
        # Undecodable records whose letters the dead-letter topic did not take yet.
        self._letters = HeldLetters(
            dead_letters, CONSUMER_NAME, metrics, self.outage, monotonic, consumer.group_metadata
        )

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
                self.step()
        finally:
            self.shutdown()

    def run_until_idle(self, idle_s: float = 3.0, deadline_s: float = 300.0) -> None:
        """Consume until nothing is buffered, in flight, waiting to be dead-lettered or
        arriving (demo and tests)."""
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
                elif self._monotonic() - quiet_since >= idle_s:
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
                    self._forget(decoded)
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
                    self._deliver(batch)
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

    def _forget(self, tombstone: MemoryTombstone) -> None:
        dropped = drop_held(tombstone, self._buffers, self._batches)
        for item in dropped:
            self._offsets.done(item.tp, item.offset)
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(len(dropped))

    def _collect(self, wait_s: float) -> None:
        deadline = self._monotonic() + wait_s
        while True:
            finished = [
                b for b in self._batches.values() if b.future is not None and b.future.done()
            ]
            for batch in finished:
                self._settle(batch)
            self._reap_orphans()
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
            log.info("re-planning after a concurrent run: %s", e, extra=batch_fields(batch))
            self._metrics.flushes.labels("replanned").inc()
            return
        except TransientBackendError as e:
            self._retry_or_give_up(batch, e)
            return
        except BackendError as e:
            self._reject(batch, Rejection.of_backend(f"backend error: {e}", e))
            return
        except DatabaseUnavailable as e:  # also MemoryBeingErased: asked again once it is done
            self._wait_out(batch, e, "a flush")
            return
        except Exception as e:
            # A poison batch must not stall its partition: it goes to the dead-letter topic
            # with the error, and the traceback goes to the log for whoever fixes the bug.
            log.exception("flush failed unexpectedly", extra=batch_fields(batch))
            self._reject(batch, Rejection("consolidate", f"unexpected {type(e).__name__}: {e}"))
            return
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(result.forgotten)
        if result.kind is FlushKind.DEFERRED:
            # The flusher recorded the deferred run itself, under the user's lock.
            self._reject(batch, Rejection("budget", result.reason, recorded=True))
            return
        if result.rejected:
            self._split_off(batch, result)
            return
        self._finish(batch, result.kind.value)

    def _split_off(self, batch: Batch, result: FlushResult) -> None:
        """A bisected batch: what was consolidated is done, the rest is dead-lettered."""
        for item in batch.keep_only(result.rejected_reasons):
            self._offsets.done(item.tp, item.offset)
        if result.kind is FlushKind.CONSOLIDATED:
            self._metrics.flushes.labels("split").inc()
        self._reject(batch, result.split_rejection(len(batch.items)))

    def _retry_or_give_up(self, batch: Batch, error: TransientBackendError) -> None:
        self._metrics.backend_retries.labels(self._flusher.backend_name).inc()
        if batch.attempt + 1 >= self._settings.max_attempts:
            reason = f"gave up after {batch.attempt + 1} attempts: {error}"
            self._reject(batch, Rejection.of_backend(reason, error))
        else:
            self._retry_later(batch, str(error))

    def _retry_later(self, batch: Batch, reason: str) -> None:
        delay = self._settings.backoff.delay(batch.attempt)
        batch.not_before = self._monotonic() + delay
        batch.attempt += 1
        log.warning("flush failed (%s); retry in %.2fs", reason, delay, extra=batch_fields(batch))

    def _wait_out(self, batch: Batch, error: Exception, what: str) -> None:
        """An outage, not the batch's fault: retried without counting an attempt."""
        batch.not_before = self._monotonic() + self.outage.failed(error, what)

    def _reject(self, batch: Batch, rejection: Rejection) -> None:
        batch.rejection = batch.given_up(rejection)
        self._deliver(batch)

    def _deliver(self, batch: Batch) -> None:
        """Record the failed run, then hand the events' letters to `HeldLetters`, which sends
        each with the commit that passes its record; recording may be retried."""
        rejection = batch.rejection
        assert rejection is not None
        if not rejection.recorded:
            try:
                done = self._flusher.record_failure(
                    batch.key, batch.items, batch.attempt, rejection
                )
            except StoreError as e:
                # Never a letter without its failed run: the run log is what explains it.
                self._wait_out(batch, e, "recording a failed run")
                return
            rejection.recorded = True
            for item in batch.without(done):  # forgotten or consolidated: no letter
                self._offsets.done(item.tp, item.offset)
        letters = event_letters(batch.items, rejection.stage, rejection.reason, rejection.reasons)
        self._letters.wait(letters)
        fields = {**batch_fields(batch), "stage": rejection.stage}
        log.error("giving up on %d event(s): %s", len(letters), rejection.reason, extra=fields)
        self._finish(batch, f"dead_lettered_{rejection.stage}", done=False)

    def _finish(self, batch: Batch, outcome: str, done: bool = True) -> None:
        if done:  # else their letters' transaction marks them done
            for item in batch.items:
                self._offsets.done(item.tp, item.offset)
        del self._batches[batch.key]
        self._metrics.flushes.labels(outcome).inc()
        self.outage.recovered()

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
                    self._settle(batch)
            positions = {tp: p for tp, p in self._offsets.committable().items() if tp in gone}
            commit_async(self._consumer, positions)
        for batch in [b for b in self._batches.values() if b.items[0].tp in gone]:
            del self._batches[batch.key]
            if batch.future is not None:
                # Still running: its memory waits for it before a new flush starts here.
                self._orphans[batch.key] = batch.future
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
