"""What becomes of a memory's batch once its flush is over: done, retried, re-planned after a
concurrent run, waited out through an outage, or given up and dead-lettered.

Runs on the processor's polling thread (it owns the offsets and the batches); only the failed
run's record goes to the database here, and a refusal of it is waited out like any outage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from consumers.backend_outage import BackendOutage
from consumers.batch_retry import BatchRetry
from consumers.batching import Batch, OffsetTracker, Rejection, TopicPartition
from consumers.dead_letter import UNEXPECTED, event_letters
from consumers.flush import UserFlusher
from consumers.flush_result import FlushKind, FlushResult
from consumers.log_fields import batch_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage
from consumers.record_letters import HeldLetters
from consumers.settings import ProcessorSettings
from domain.ids import MemoryKey
from processors.errors import BackendError, CredentialsRefused, TransientBackendError
from store.errors import (
    DatabaseUnavailable,
    EventsAlreadyConsolidated,
    StaleMemoryVersion,
    StoreError,
)

log = logging.getLogger(__name__)
CONSUMER_NAME = "processor"  # the `consumer` label and log field
# Every outcome `memoryd_flushes_total` is counted by: `_finish`'s flush kinds, re-planned,
# split, and given up at a stage of `_reject`'s.
FLUSH_OUTCOMES = (
    *(k.value for k in (FlushKind.CONSOLIDATED, FlushKind.NOTHING_NEW, FlushKind.FORGOTTEN)),
    "replanned",
    "split",
    "dead_lettered_consolidate",
    "dead_lettered_budget",
)
# The outage sources, each one memory's: a flush kept from the database, and the record of
# a failed run. Per memory, as the database may fail one memory only (a lock or statement
# timeout on its rows): another's success says nothing of it.
FLUSH, RECORDING = "a flush", "recording a failed run"
# A flush failing transiently while the backend is out, or refused for the credentials
# (`consumers.backend_outage`): per memory too, so each backs off on its own, and all end on
# the first answer the backend gives.
BACKEND = "a backend call"


class Settlement:
    def __init__(
        self,
        batches: dict[MemoryKey, Batch],
        offsets: OffsetTracker,
        flusher: UserFlusher,
        letters: HeldLetters,
        metrics: PipelineMetrics,
        outage: Outage,
        settings: ProcessorSettings,
        monotonic: Callable[[], float],
    ) -> None:
        self._batches = batches  # the processor's: a settled batch leaves it
        self._offsets = offsets
        self._flusher = flusher
        self._letters = letters
        self._metrics = metrics
        self._outage = outage
        self._settings = settings
        self._retry = BatchRetry.of(settings)
        self._monotonic = monotonic
        self._backend = BackendOutage(
            settings.backend_outage_after, settings.backend_outage_max_s, monotonic
        )
        self._answers = 0  # the flusher's answers when a batch was last settled

    def forsaken(self) -> None:
        """No batch is left (their partitions went to another processor): nothing waits out
        an outage of the flushes any more."""
        self._outage.recovered_everywhere(FLUSH)
        self._outage.recovered_everywhere(RECORDING)
        self._outage.recovered_everywhere(BACKEND)

    def left(self, key: MemoryKey) -> None:
        """The memory's batch left the processor (done, revoked, dropped by its tombstone):
        its outages end with it, so that they neither keep the consumer degraded nor pile up."""
        self._outage.recovered(FLUSH, key)
        self._outage.recovered(RECORDING, key)
        self._outage.recovered(BACKEND, key)

    def settle(self, batch: Batch) -> None:
        assert batch.future is not None
        future, batch.future = batch.future, None
        self._answered_meanwhile()
        try:
            result = future.result()
        except (EventsAlreadyConsolidated, StaleMemoryVersion) as e:
            # Another run got there first; planning again on fresh state drops what it did.
            self._outage.recovered(FLUSH, batch.key)
            log.info("re-planning after a concurrent run: %s", e, extra=batch_fields(batch))
            self._metrics.flushes.labels("replanned").inc()
            return
        except CredentialsRefused as e:
            # Never the batch's fault: waited out, whatever the other memories' flushes did.
            self._outage.recovered(FLUSH, batch.key)
            self._backend.refused()
            self._wait_out(batch, e, BACKEND)
            return
        except TransientBackendError as e:
            self._outage.recovered(FLUSH, batch.key)  # the backend is asked after the read
            if self._backend.failed(batch.key):
                self._wait_out_backend(batch, e)
            else:
                self._retry_or_give_up(batch, e)
            return
        except BackendError as e:
            self._outage.recovered(FLUSH, batch.key)
            self._backend_answered()
            self._reject(batch, Rejection.of_backend(f"backend error: {e}", e))
            return
        except DatabaseUnavailable as e:  # also MemoryBeingErased: asked again once it is done
            self._wait_out(batch, e, FLUSH)
            return
        except Exception as e:
            # A poison batch must not stall its partition: it goes to the dead-letter topic
            # with the error, and the traceback goes to the log for whoever fixes the bug.
            log.exception("flush failed unexpectedly", extra=batch_fields(batch))
            reason = f"unexpected {type(e).__name__}: {e}"
            self._reject(batch, Rejection("consolidate", reason, UNEXPECTED))
            return
        self._outage.recovered(FLUSH, batch.key)
        if result.kind in (FlushKind.CONSOLIDATED, FlushKind.REJECTED):
            self._backend_answered()  # the other kinds never asked it
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(result.forgotten)
        if result.kind is FlushKind.DEFERRED:
            # The flusher recorded the deferred run itself, under the user's lock, for the
            # events it parks. The others get no letter: consolidated already (read again
            # after a crash), or forgotten by an erasure (a letter would bring them back).
            for item in batch.keep_only(result.deferred):
                self._offsets.done(item.tp, item.offset)
            self._reject(batch, Rejection("budget", result.reason, "credit", recorded=True))
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
        if batch.attempt + 1 >= self._retry.attempts:
            reason = f"gave up after {batch.attempt + 1} attempts: {error}"
            self._reject(batch, Rejection.of_backend(reason, error))
        else:
            self._metrics.backend_retries.labels(self._flusher.backend_name).inc()
            delay = self._retry.delay(batch.attempt, error)
            batch.not_before = self._monotonic() + delay
            batch.attempt += 1
            fields = {**batch_fields(batch), "retry_in_s": delay}
            log.warning("flush failed (%s); retry in %.2fs", error, delay, extra=fields)

    def _wait_out_backend(self, batch: Batch, error: TransientBackendError) -> None:
        """The backend is out: the batch waits without being charged an attempt, as through
        a database outage, and at least as long as the provider asked."""
        wait = self._outage.failed(error, BACKEND, batch.key, at_least=self._retry.asked(error))
        batch.not_before = self._monotonic() + wait

    def _answered_meanwhile(self) -> None:
        """Any answer since the last batch settled ends a backend outage, the one to a flush
        whose write was then refused or came too late too: the backend is back."""
        answers = self._flusher.answers
        if answers > self._answers:
            self._answers = answers
            self._backend_answered()

    def _backend_answered(self) -> None:
        if self._backend.answered():
            self._outage.recovered_everywhere(BACKEND)

    def _wait_out(self, batch: Batch, error: Exception, what: str) -> None:
        """An outage, not the batch's fault: retried without counting an attempt."""
        batch.not_before = self._monotonic() + self._outage.failed(error, what, batch.key)

    def _reject(self, batch: Batch, rejection: Rejection) -> None:
        batch.rejection = batch.given_up(rejection)
        self.deliver(batch)

    def deliver(self, batch: Batch) -> None:
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
                self._wait_out(batch, e, RECORDING)
                return
            self._outage.recovered(RECORDING, batch.key)
            rejection.recorded = True
            for item in batch.without(done):  # forgotten or consolidated: no letter
                self._offsets.done(item.tp, item.offset)
        letters = event_letters(
            batch.items, rejection.stage, rejection.reason, rejection.reasons, cause=rejection.cause
        )
        # A tombstone read while the batch was in flight: those events are forgotten, no letter.
        forgotten = self._letters.wait(letters)
        for letter in forgotten:
            self._offsets.done(TopicPartition(letter.topic, letter.partition), letter.offset)
        self._metrics.events_forgotten.labels(CONSUMER_NAME).inc(len(forgotten))
        fields = {**batch_fields(batch), "stage": rejection.stage}
        log.error("giving up on %d event(s): %s", len(letters), rejection.reason, extra=fields)
        self._finish(batch, f"dead_lettered_{rejection.stage}", done=False)

    def _finish(self, batch: Batch, outcome: str, done: bool = True) -> None:
        if done:  # else their letters' transaction marks them done
            for item in batch.items:
                self._offsets.done(item.tp, item.offset)
        del self._batches[batch.key]
        self.left(batch.key)  # given up after an unexpected error, its flush may have failed
        self._metrics.flushes.labels(outcome).inc()
