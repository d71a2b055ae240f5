"""Answers whose write the database did not take, kept for the retry of the same batch.

A write refused as an outage (a read-only database after a failover, a privilege revoked, the
connection lost) is waited out and the batch flushed again. Asking the backend again on every
retry would pay for a call per retry while the database refuses them all, and none of those
calls could be booked. So the answer is kept in the process, with the request it answers, and
the retry applies it instead of calling: the call is paid for once, and booked once, in the
ledger entries of the run that lands.

An answer is reused only for the same memory, at the same version and generation, for the same
events: then nothing it was planned on has changed (the version counts every run applied, the
generation every erasure). Whatever else becomes of a kept answer when its memory is flushed
again is the flusher's (`UserFlusher`): booked as discarded, or dropped unbooked when an
erasure came between. A crash loses the kept answers: the batch is read again and consolidated
by a new call, the only one booked.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from consumers.log_fields import key_fields
from consumers.unapplied_runs import UnappliedRuns, log_unbooked
from domain.ids import MemoryKey
from processors.schema import BackendResponse, ConsolidationRequest

log = logging.getLogger(__name__)

# Answers are kept for batches waiting out an outage, which backpressure bounds; a batch that
# left the processor (its partition revoked, its memory forgotten) leaves its answer until
# this many are kept.
MAX_KEPT = 256


@dataclass(frozen=True)
class KeptAnswer:
    request: ConsolidationRequest
    response: BackendResponse
    duration_ms: int
    degraded: str | None  # the candidate search's degradation when the request was built
    generation: uuid.UUID | None

    def answers(self, version: int, event_ids: Iterable[uuid.UUID]) -> bool:
        return self.request.state.version == version and self.request.event_ids == frozenset(
            event_ids
        )


class KeptAnswers:
    """At most one answer per memory (a memory is flushed by one thread at a time)."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._kept: OrderedDict[MemoryKey, KeptAnswer] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def keep(self, answer: KeptAnswer) -> None:
        key = answer.request.key
        with self._lock:
            self._kept.pop(key, None)
            self._kept[key] = answer
            evicted = self._kept.popitem(last=False)[1] if len(self._kept) > self._limit else None
        if evicted is not None:
            log_unbooked(evicted.request.key, evicted.response, "too many answers kept")

    def take(
        self, key: MemoryKey, version: int, event_ids: Iterable[uuid.UUID]
    ) -> KeptAnswer | None:
        """The answer kept for exactly these events at this version, no longer kept."""
        with self._lock:
            answer = self._kept.get(key)
            if answer is None or not answer.answers(version, event_ids):
                return None
            del self._kept[key]
        log.info("applying the answer kept from a refused write", extra=key_fields(key))
        return answer

    def drop_unless(self, key: MemoryKey, generation: uuid.UUID | None) -> None:
        """Under the memory's lock, before its flush: an answer kept from before an erasure
        is neither applied nor recorded, as the run's record would bring back what the
        erasure took away. (A memory without a row had no generation: the first run gives it
        one. An erasure of it forgets the batch's events, which `settle` looks for.)"""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None or kept.generation in (None, generation):
                return
            del self._kept[key]
        log_unbooked(kept.request.key, kept.response, "its memory was erased since the call")

    def settle(
        self,
        key: MemoryKey,
        attempt: int,
        events: Iterable[uuid.UUID],
        unapplied: UnappliedRuns,
    ) -> None:
        """Under the memory's lock, once its flush is over: an answer it did not apply (its
        events consolidated meanwhile, or by its own write whose COMMIT was lost) is booked
        as discarded, unless its run was applied. `events`: the batch's, less those an
        erasure forgot; the answer to one forgotten is not recorded."""
        with self._lock:
            kept = self._kept.pop(key, None)
        if kept is None:
            return
        if not kept.request.event_ids <= frozenset(events):
            log_unbooked(
                kept.request.key, kept.response, "some of its events were forgotten since the call"
            )
        else:
            unapplied.discarded_unless_applied(
                kept.request,
                attempt,
                kept.request.now,
                kept.response,
                kept.duration_ms,
                "not applied: the batch was not the same when its write was tried again",
            )
