"""One user's flush: from buffered events to committed memory, then to the vector index.

Runs in a worker thread. Under the user's advisory lock it drops events already consumed,
reads the current memory, asks the backend, plans the update with the write gate and applies
it in one transaction. Indexing happens after the commit; if it fails the facts stay pending
in Postgres and the scheduled indexer picks them up.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from consumers.indexer import FactIndexer
from consumers.metrics import PipelineMetrics
from processors.consolidate import Consolidator, failed_run
from processors.schema import ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent
from store.errors import VectorIndexUnavailable
from store.memory_store import PostgresMemoryStore
from store.records import FactStatus, MemoryState, MemoryUpdate, RunStatus, run_id_for

log = logging.getLogger(__name__)


class BudgetPolicy(StrEnum):
    DEFER = "defer"  # park the events on the dead-letter topic until credit is added
    SKIP_EMBEDDINGS = "skip_embeddings"  # consolidate, but leave new facts unindexed


class FlushKind(StrEnum):
    CONSOLIDATED = "consolidated"
    NOTHING_NEW = "nothing_new"
    DEFERRED = "deferred"


@dataclass(frozen=True)
class FlushResult:
    kind: FlushKind
    events: int
    run_id: uuid.UUID | None = None
    update: MemoryUpdate | None = None
    reason: str = ""


class UserFlusher:
    def __init__(
        self,
        store: PostgresMemoryStore,
        backend: ConsolidationBackend,
        consolidator: Consolidator,
        indexer: FactIndexer,
        metrics: PipelineMetrics,
        clock: Callable[[], datetime],
        budget_policy: BudgetPolicy = BudgetPolicy.DEFER,
    ) -> None:
        self._store = store
        self._backend = backend
        self._consolidator = consolidator
        self._indexer = indexer
        self._metrics = metrics
        self._clock = clock
        self._budget_policy = budget_policy

    @property
    def backend_name(self) -> str:
        return self._backend.name

    def flush(self, user_id: str, events: Sequence[ContextEvent], attempt: int) -> FlushResult:
        """Raises the backend's and the store's errors; the runtime decides retry or dead letter."""
        with self._store.user_lock(user_id):
            result = self._consolidate(user_id, events, attempt)
        if result.update is not None and not self._skip_embeddings(user_id):
            self._index(result.update)
        return result

    def record_failure(
        self,
        user_id: str,
        events: Sequence[ContextEvent],
        attempt: int,
        error: str,
        raw: str | None,
    ) -> uuid.UUID:
        """Write the failed run record for events about to be dead-lettered."""
        state = self._store.load_state(user_id, events[0].organization_id)
        request = ConsolidationRequest.build(state, (), list(events), self._clock())
        run_id = run_id_for(user_id, request.event_ids, attempt=attempt + 1)
        self._store.record_run(
            failed_run(
                request,
                run_id=run_id,
                backend=self._backend.name,
                model=self._backend.model,
                prompt_version=self._backend.prompt_version,
                started_at=request.now,
                duration_ms=0,
                error=error,
                raw_response=raw,
                attempt=attempt,
            )
        )
        return run_id

    def _consolidate(
        self, user_id: str, events: Sequence[ContextEvent], attempt: int
    ) -> FlushResult:
        unique = list({e.event_id: e for e in events}.values())
        done = self._store.already_consolidated(e.event_id for e in unique)
        fresh = [e for e in unique if e.event_id not in done]
        if not fresh:
            return FlushResult(FlushKind.NOTHING_NEW, 0)
        state = self._store.load_state(user_id, fresh[0].organization_id)
        now = self._clock()
        if self._budget_policy is BudgetPolicy.DEFER and self._exhausted(user_id):
            return self._defer(user_id, state, fresh, now, attempt)
        active = tuple(self._store.facts(user_id, (FactStatus.ACTIVE, FactStatus.HELD)))
        request = ConsolidationRequest.build(state, active, fresh, now)
        run_id = run_id_for(user_id, request.event_ids)
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
        self._store.apply(update)
        self._observe(update)
        return FlushResult(FlushKind.CONSOLIDATED, len(fresh), run_id, update)

    def _defer(
        self,
        user_id: str,
        state: MemoryState,
        fresh: list[ContextEvent],
        now: datetime,
        attempt: int,
    ) -> FlushResult:
        request = ConsolidationRequest.build(state, (), fresh, now)
        run_id = run_id_for(user_id, request.event_ids, attempt=attempt)
        reason = "credit exhausted: consolidation deferred"
        self._store.record_run(
            failed_run(
                request,
                run_id=run_id,
                backend=self._backend.name,
                model=self._backend.model,
                prompt_version=self._backend.prompt_version,
                started_at=now,
                duration_ms=0,
                error=reason,
                raw_response=None,
                attempt=attempt,
                status=RunStatus.DEFERRED,
            )
        )
        return FlushResult(FlushKind.DEFERRED, len(fresh), run_id, reason=reason)

    def _exhausted(self, user_id: str) -> bool:
        balance = self._store.balance(user_id)
        return balance is not None and balance <= 0

    def _skip_embeddings(self, user_id: str) -> bool:
        return self._budget_policy is BudgetPolicy.SKIP_EMBEDDINGS and self._exhausted(user_id)

    def _index(self, update: MemoryUpdate) -> None:
        try:
            self._indexer.index_changes(update)
        except VectorIndexUnavailable as e:
            # Not lost: the facts keep indexed_at = NULL and the scheduled indexer retries them.
            self._metrics.index_failures.inc()
            log.warning(
                "vector index unavailable, %d fact(s) left pending: %s", len(update.fact_changes), e
            )

    def _observe(self, update: MemoryUpdate) -> None:
        run = update.run
        m = self._metrics
        m.events_consolidated.inc(len(run.input_event_ids))
        m.tokens.labels(run.backend, "prompt").inc(run.usage.prompt_tokens)
        m.tokens.labels(run.backend, "completion").inc(run.usage.completion_tokens)
        m.cost.labels("llm").inc(run.cost_micro_usd)
        for verdict, count in (
            ("allow", run.gate.allowed),
            ("hold", run.gate.held),
            ("discard", run.gate.discarded),
            ("reinforce", run.gate.reinforced),
        ):
            m.gate_verdicts.labels(verdict).inc(count)
