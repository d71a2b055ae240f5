"""One memory's flush: from buffered events to committed memory, then to the vector index.

Runs in a worker thread. Under the memory's advisory lock it drops events an erasure forgot
and events already consumed, reads the current memory, asks the backend, plans the update
with the write gate and applies it in one transaction. Indexing happens after the commit, in
the background (`IndexQueue`); if it fails the facts stay pending in Postgres and the
scheduled drain picks them up.

Budget: a user with a credit line whose balance is spent (<= 0) before a flush gets the
configured policy, decided under the lock and written down: DEFER records a deferred run and
the runtime parks the events on the dead-letter topic (stage `budget`) until `memoryd redrive`;
SKIP_EMBEDDINGS consolidates, records `budget_action` in the run's output and leaves the new
facts unindexed until credit is added (the index drain skips users out of credit).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from consumers.batching import BufferedEvent
from consumers.forgetting import ForgottenEvents
from consumers.indexer import IndexQueue
from consumers.observers import FlushObserver
from domain.ids import MemoryKey, run_id_for
from domain.model import MemoryState, MemoryUpdate, RunStatus
from domain.ports import Clock, MemoryStore
from processors.consolidate import Consolidator, failed_run
from processors.schema import REQUEST_STATUSES, ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent


class BudgetPolicy(StrEnum):
    DEFER = "defer"  # park the events on the dead-letter topic until credit is added
    SKIP_EMBEDDINGS = "skip_embeddings"  # consolidate, but leave new facts unindexed


class FlushKind(StrEnum):
    CONSOLIDATED = "consolidated"
    NOTHING_NEW = "nothing_new"
    DEFERRED = "deferred"
    FORGOTTEN = "forgotten"  # every event was of an erased memory, before its tombstone


@dataclass(frozen=True)
class FlushResult:
    kind: FlushKind
    events: int
    run_id: uuid.UUID | None = None
    update: MemoryUpdate | None = None
    reason: str = ""
    skip_embeddings: bool = False
    forgotten: int = 0  # events left out because an erasure forgot them


class UserFlusher:
    def __init__(
        self,
        store: MemoryStore,
        backend: ConsolidationBackend,
        consolidator: Consolidator,
        index_queue: IndexQueue,
        observer: FlushObserver,
        clock: Clock,
        forgotten: ForgottenEvents,
        budget_policy: BudgetPolicy = BudgetPolicy.DEFER,
    ) -> None:
        self._store = store
        self._forgotten = forgotten
        self._backend = backend
        self._consolidator = consolidator
        self._index_queue = index_queue
        self._observer = observer
        self._clock = clock
        self._budget_policy = budget_policy

    @property
    def backend_name(self) -> str:
        return self._backend.name

    def close(self) -> None:
        """Index what finished runs changed, then stop the index thread."""
        self._index_queue.close()

    def flush(self, key: MemoryKey, items: Sequence[BufferedEvent], attempt: int) -> FlushResult:
        """Raises the backend's and the store's errors; the runtime decides retry or dead letter."""
        started = time.monotonic()
        with self._store.memory_lock(key):
            kept = self._forgotten.remembered(key, items)
            if kept:
                result = self._consolidate(key, [i.event for i in kept], attempt)
            else:
                result = FlushResult(FlushKind.FORGOTTEN, 0)
            result = replace(result, forgotten=len(items) - len(kept))
        if result.update is not None and not result.skip_embeddings:
            self._index_queue.submit(result.update)
        self._observer.flushed(self._backend.name, time.monotonic() - started)
        return result

    def record_failure(
        self,
        key: MemoryKey,
        events: Sequence[ContextEvent],
        attempt: int,
        error: str,
        raw: str | None,
    ) -> uuid.UUID:
        """Write the failed run record for events about to be dead-lettered."""
        state = self._store.load_state(key)
        return self._record_unapplied(
            state, events, self._clock(), attempt, error, raw, RunStatus.FAILED
        )

    def _record_unapplied(
        self,
        state: MemoryState,
        events: Sequence[ContextEvent],
        now: datetime,
        attempt: int,
        error: str,
        raw: str | None,
        status: RunStatus,
    ) -> uuid.UUID:
        """The record of a run that changed nothing (failed or deferred), one per occurrence."""
        request = ConsolidationRequest.build(state, (), list(events), now)
        run_id = occurrence_run_id()
        self._store.record_run(
            failed_run(
                request,
                run_id=run_id,
                backend=self._backend.name,
                model=self._backend.model,
                prompt_version=self._backend.prompt_version,
                started_at=now,
                duration_ms=0,
                error=error,
                raw_response=raw,
                attempt=attempt,
                status=status,
            )
        )
        return run_id

    def _consolidate(
        self, key: MemoryKey, events: Sequence[ContextEvent], attempt: int
    ) -> FlushResult:
        unique = list({e.event_id: e for e in events}.values())
        done = self._store.already_consolidated(key, (e.event_id for e in unique))
        fresh = [e for e in unique if e.event_id not in done]
        if not fresh:
            return FlushResult(FlushKind.NOTHING_NEW, 0)
        state = self._store.load_state(key)
        now = self._clock()
        balance = self._store.balance(key)
        exhausted = balance is not None and balance <= 0
        if exhausted:
            self._observer.budget_applied(self._budget_policy.value)
            if self._budget_policy is BudgetPolicy.DEFER:
                return self._defer(state, fresh, now, attempt, f"balance {balance} micro-USD")
        active = tuple(self._store.facts(key, REQUEST_STATUSES))
        request = ConsolidationRequest.build(state, active, fresh, now)
        run_id = run_id_for(key, request.event_ids)
        started = time.monotonic()
        response = self._backend.consolidate(request)
        duration_ms = int((time.monotonic() - started) * 1000)
        update = self._consolidator.plan(
            request,
            response,
            run_id=run_id,
            backend=self._backend.name,
            prompt_version=self._backend.prompt_version,
            started_at=now,
            duration_ms=duration_ms,
            attempt=attempt,
        )
        if exhausted:
            update = _with_budget_action(update, self._budget_policy)
        self._store.apply(update)
        self._observer.consolidated(update.run)
        return FlushResult(
            FlushKind.CONSOLIDATED, len(fresh), run_id, update, skip_embeddings=exhausted
        )

    def _defer(
        self,
        state: MemoryState,
        fresh: list[ContextEvent],
        now: datetime,
        attempt: int,
        balance: str,
    ) -> FlushResult:
        reason = f"credit exhausted ({balance}): consolidation deferred"
        run_id = self._record_unapplied(
            state, fresh, now, attempt, reason, None, RunStatus.DEFERRED
        )
        return FlushResult(FlushKind.DEFERRED, len(fresh), run_id, reason=reason)


def _with_budget_action(update: MemoryUpdate, policy: BudgetPolicy) -> MemoryUpdate:
    """The run's output says which budget policy shaped it, for the audit trail."""
    output = {**(update.run.output or {}), "budget_action": policy.value}
    return replace(update, run=replace(update.run, output=output))


def occurrence_run_id() -> uuid.UUID:
    """The id of a failed or deferred run: one occurrence, not a function of its events.

    The same events can fail again after a redrive, or succeed; each occurrence needs its own
    record. An id derived from the events would collide with the succeeded run's id
    (`run_id_for`), and `ON CONFLICT DO NOTHING` would then silently drop that run's record.
    """
    return uuid.uuid4()
