"""Runs that changed nothing (failed, deferred, discarded), recorded with what their calls
cost: a call the backend answered is paid for whether or not its answer was applied."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from consumers.log_fields import key_fields
from consumers.observers import FlushObserver
from domain.ids import MemoryKey, occurrence_run_id, run_id_for
from domain.model import RunRecord, RunStatus, TokenUsage
from domain.ports import MemoryStore
from processors.consolidate import failed_run, shown_facts, unapplied_ledger
from processors.cost import PriceTable
from processors.errors import UnusableAnswer
from processors.schema import BackendResponse, ConsolidationBackend, ConsolidationRequest
from store.errors import StoreError

log = logging.getLogger(__name__)


class UnappliedRuns:
    def __init__(
        self,
        store: MemoryStore,
        backend: ConsolidationBackend,
        prices: PriceTable,
        observer: FlushObserver,
    ) -> None:
        self._store = store
        self._backend = backend
        self._prices = prices
        self._observer = observer

    def record(
        self,
        request: ConsolidationRequest,
        attempt: int,
        started_at: datetime,
        status: RunStatus,
        *,
        run_id: uuid.UUID | None = None,
        usage: TokenUsage | None = None,
        error: str | None = None,
        raw: str | None = None,
        model: str | None = None,
        duration_ms: int = 0,
        output: dict[str, Any] | None = None,
    ) -> RunRecord:
        """Record a run that changed nothing, with what its call cost, in one transaction."""
        run = failed_run(
            request,
            run_id=run_id or occurrence_run_id(),
            backend=self._backend.name,
            model=model or self._backend.model,
            prompt_version=self._backend.prompt_version,
            started_at=started_at,
            duration_ms=duration_ms,
            error=error,
            raw_response=raw,
            attempt=attempt,
            status=status,
            usage=usage,
            prices=self._prices,
            output=output,
        )
        self._store.record_run(run, unapplied_ledger(self._prices, run))
        self._observer.charged(run)
        return run

    def discarded(
        self,
        request: ConsolidationRequest,
        attempt: int,
        started_at: datetime,
        response: BackendResponse,
        duration_ms: int,
        why: str,
        *,
        run_id: uuid.UUID | None = None,
    ) -> RunRecord:
        """A usable answer that is not applied, recorded with what its call cost."""
        return self.record(
            request,
            attempt,
            started_at,
            RunStatus.DISCARDED,
            run_id=run_id,
            usage=response.usage,
            raw=response.raw_response,
            model=response.model,
            duration_ms=duration_ms,
            output={"discarded": why, "candidates": shown_facts(request)},
        )

    def discarded_unless_applied(
        self,
        request: ConsolidationRequest,
        attempt: int,
        started_at: datetime,
        response: BackendResponse,
        duration_ms: int,
        why: str,
        *,
        run_id: uuid.UUID | None = None,
    ) -> None:
        """`discarded`, for an answer not applied for `why`, unless its run was applied
        after all (the connection lost in COMMIT). The processor retries the batch with a
        new call; without this the call before was never booked."""
        try:
            if self._store.run_applied(run_id_for(request.key, request.event_ids), started_at):
                return
            self.discarded(request, attempt, started_at, response, duration_ms, why, run_id=run_id)
        except StoreError as e:
            # The flush's own error is raised on; this one only keeps the call's cost from the
            # ledger.
            log_unbooked(request.key, response.usage.total, e)

    def failed(
        self,
        request: ConsolidationRequest,
        attempt: int,
        error: UnusableAnswer,
        duration_ms: int,
        run_id: uuid.UUID,
    ) -> RunRecord:
        """An unusable answer, recorded with what its call cost; idempotent on `run_id`."""
        return self.record(
            request,
            attempt,
            request.now,
            RunStatus.FAILED,
            run_id=run_id,
            usage=error.usage,
            error=str(error),
            raw=error.raw_response,
            duration_ms=duration_ms,
        )

    def failed_unless_recorded(
        self,
        request: ConsolidationRequest,
        attempt: int,
        error: UnusableAnswer,
        duration_ms: int,
        run_id: uuid.UUID,
    ) -> None:
        """`failed`, once a flush is over: a store error only keeps the cost from the ledger."""
        try:
            self.failed(request, attempt, error, duration_ms, run_id)
        except StoreError as e:
            log_unbooked(request.key, error.usage.total, e)


def log_unbooked(key: MemoryKey, tokens: int, why: object) -> None:
    """An answered call given up without a run: its cost is in no ledger, so the spend the
    ledger reports is short by it, which only this error says."""
    log.error(
        "a call's %d token(s) are not booked: %s",
        tokens,
        why,
        extra=key_fields(key),
    )
