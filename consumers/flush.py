"""One memory's flush: from buffered events to committed memory, then to the vector index.

Runs in a worker thread. Under the memory's advisory lock it drops events an erasure forgot
and events already consumed, reads the current memory and the facts the batch is about
(`processors.candidates`), asks the backend, plans the update with the write gate and
applies it in one transaction. Indexing happens after the commit, in the background
(`IndexQueue`); if it fails the facts stay pending in Postgres and the scheduled drain picks
them up.

An answer the model got wrong for this input (`UnusableAnswer`) does not sink the batch: it
is bisected (`consumers.splitting`) to the events the model fails on alone, the others are
consolidated together in one run, and the flush returns the failing ones for the dead-letter
topic. Every call that did not become a succeeded run is recorded as a failed or discarded
run with its tokens, booked in the ledger in the same transaction. A flush whose write the
database refused (an outage; a run's or a failed run's) keeps the answers it got, usable or
not, for the retry of the same batch (`consumers.kept_answers`), which is not paid for again.

Budget: a spent credit line (balance <= 0) gets the configured policy, decided under the lock:
DEFER records a deferred run and parks the events on the dead-letter topic (stage `budget`)
until `memoryd redrive`; SKIP_EMBEDDINGS consolidates, notes `budget_action` in the run and
leaves the new facts unindexed until credit is added (the index drain skips them). A bisection
reads the balance again before each further call (`consumers.credit`): spent, DEFER parks the
events no run took yet.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from enum import StrEnum

from consumers.asking import Asking
from consumers.batching import BufferedEvent, Rejection, first_by_id
from consumers.credit import CreditLine, CreditSpent
from consumers.flush_result import FlushKind, FlushResult, RejectedEvents
from consumers.forgetting import ForgottenEvents
from consumers.indexer import IndexQueue
from consumers.kept_answers import KeptAnswer, KeptAnswers
from consumers.observers import FlushObserver
from consumers.splitting import MAX_SPLIT_CALLS, PROBE_NOTE, Answered, consolidate_isolated
from consumers.unapplied_runs import UnappliedRuns
from domain.ids import MemoryKey, deferred_run_id_for, run_id_for
from domain.model import FlushReads, MemoryState, MemoryUpdate, RunStatus
from domain.ports import Clock, FactSearch, MemoryStore
from processors.candidates import CandidatePolicy, select_candidates
from processors.consolidate import Consolidator, updated_connections
from processors.errors import UnusableAnswer
from processors.schema import BackendResponse, ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent
from store.errors import DatabaseUnavailable, EventsAlreadyConsolidated, StaleMemoryVersion


class BudgetPolicy(StrEnum):
    DEFER = "defer"  # park the events on the dead-letter topic until credit is added
    SKIP_EMBEDDINGS = "skip_embeddings"  # consolidate, but leave new facts unindexed


class UserFlusher:
    def __init__(
        self,
        store: MemoryStore,
        backend: ConsolidationBackend,
        consolidator: Consolidator,
        index_queue: IndexQueue,
        observer: FlushObserver,
        clock: Clock,
        search: FactSearch,
        forgotten: ForgottenEvents,
        budget_policy: BudgetPolicy = BudgetPolicy.DEFER,
        *,
        candidate_policy: CandidatePolicy | None = None,
        max_split_calls: int = MAX_SPLIT_CALLS,
    ) -> None:
        self._store = store
        self._forgotten = forgotten
        self._backend = backend
        self._consolidator = consolidator
        self._index_queue = index_queue
        self._observer = observer
        self._clock = clock
        self._search = search
        self._budget_policy = budget_policy
        self._candidate_policy = candidate_policy or CandidatePolicy()
        self._max_split_calls = max_split_calls
        self._unapplied = UnappliedRuns(store, backend, consolidator.prices, observer)
        self._kept = KeptAnswers()
        self._asking = Asking(
            backend, consolidator, index_queue.foreground, self._kept, self._unapplied, observer
        )

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def answers(self) -> int:
        """How many calls the backend answered, usable or not, whatever became of them."""
        return self._asking.answers

    def close(self) -> None:
        """Index what finished runs changed, then stop the index thread."""
        self._kept.close()
        self._index_queue.close()

    def flush(self, key: MemoryKey, items: Sequence[BufferedEvent], attempt: int) -> FlushResult:
        """Raises the backend's and the store's errors; the runtime decides retry or dead letter."""
        started = time.monotonic()
        try:
            at_work = self._index_queue.foreground.working()
            with at_work, self._forgotten.locked(key, items) as (reads, kept):
                self._kept.begin(key, reads.generation)
                try:
                    if kept:
                        deferral = deferred_run_id_for(
                            key, [(i.tp.topic, i.tp.partition, i.offset) for i in kept]
                        )
                        events = [i.event for i in kept]
                        result = self._consolidate(reads, events, attempt, deferral)
                    else:
                        result = FlushResult(FlushKind.FORGOTTEN, 0)
                except DatabaseUnavailable:
                    self._kept.keep(key)  # its answers wait for the retry after the outage
                    raise
                except Exception:
                    self._kept.settle(key, attempt, _ids(items), _ids(kept), self._unapplied)
                    raise
                self._kept.settle(key, attempt, _ids(items), _ids(kept), self._unapplied)
                result = replace(result, forgotten=len(items) - len(kept))
        finally:
            # A flush that raised (a timeout, a backend error) took its time too.
            self._observer.flushed(self._backend.name, time.monotonic() - started)
        if result.skip_embeddings or result.kind is FlushKind.DEFERRED:  # once, not per try
            self._observer.budget_applied(self._budget_policy.value)
        if not result.skip_embeddings:
            for update in result.updates:
                self._index_queue.submit(update)
        return result

    def record_failure(
        self, key: MemoryKey, items: Sequence[BufferedEvent], attempt: int, rejection: Rejection
    ) -> frozenset[uuid.UUID]:
        """Write the failed run record (and what its calls cost) for events about to be
        dead-lettered; idempotent on the rejection's run id, so it may be retried.

        Under the memory's lock, as a flush: an erasure may have forgotten the events since
        the flush failed (a run then would write the erased memory's ids and the model's
        answer after it), or an earlier try of a bisected batch consolidated some. Returns
        the events left out for either reason: they get no letter either. Raises
        MemoryBeingErased while an erasure runs, MemoryBusy while another holds the lock.
        """
        with self._forgotten.locked(key, items, wait=False) as (reads, kept):
            events = [i.event for i in kept if i.event.event_id not in reads.consumed]
            if events:
                request = ConsolidationRequest.build(reads.state, (), events, self._clock())
                self._unapplied.record(
                    request,
                    attempt,
                    request.now,
                    RunStatus.FAILED,
                    run_id=rejection.run_id,
                    usage=rejection.usage,
                    error=rejection.reason,
                    raw=rejection.raw_response,
                )
        return frozenset(i.event.event_id for i in items) - {e.event_id for e in events}

    # -- one flush ------------------------------------------------------------------------

    def _consolidate(
        self,
        reads: FlushReads,
        events: Sequence[ContextEvent],
        attempt: int,
        deferral: uuid.UUID,
    ) -> FlushResult:
        fresh = [e for e in first_by_id(events) if e.event_id not in reads.consumed]
        if not fresh:
            return FlushResult(FlushKind.NOTHING_NEW, 0)
        state, balance = reads.state, reads.balance
        now = self._clock()
        exhausted = balance is not None and balance <= 0
        if exhausted and self._budget_policy is BudgetPolicy.DEFER:
            reason = f"balance {balance} micro-USD"
            return self._defer(state, fresh, now, attempt, reason, deferral)
        generation = reads.generation
        try:
            update = self._attempt(
                state, fresh, now, attempt, exhausted, generation, reads.known_facts
            )
        except UnusableAnswer as e:
            defer = self._budget_policy is BudgetPolicy.DEFER
            prices = self._consolidator.prices
            credit = CreditLine(self._store, state.key, prices, balance, defer=defer)
            updates: list[MemoryUpdate] = []
            try:
                return self._split(state, fresh, now, attempt, credit, generation, e, updates)
            except CreditSpent as spent:  # the events no run took are parked
                done = {i for u in updates for i in u.run.input_event_ids}
                rest = [x for x in fresh if x.event_id not in done]
                deferred = self._defer(state, rest, now, attempt, str(spent), deferral)
                return replace(deferred, updates=tuple(updates))
        return FlushResult(FlushKind.CONSOLIDATED, len(fresh), (update,), skip_embeddings=exhausted)

    def _attempt(
        self,
        state: MemoryState,
        events: Sequence[ContextEvent],
        now: datetime,
        attempt: int,
        exhausted: bool,
        generation: uuid.UUID | None,
        known_facts: int | None = None,
        probed: KeptAnswer | None = None,
    ) -> MemoryUpdate:
        """Consolidate `events` in one run and apply it; an unusable answer is recorded as a
        failed run and raised. `known_facts`: as read under the lock, until a run is applied.
        `probed`: a bisection's probe of these events on this memory, applied instead."""
        answer = probed or self._asking.ask(
            state,
            events,
            attempt,
            generation,
            lambda: self._request(state, events, now, known_facts),
        )
        request, response, duration_ms = answer.request, answer.response, answer.duration_ms
        now = request.now
        try:
            update = self._apply(
                request,
                response,
                now,
                duration_ms,
                attempt,
                exhausted=exhausted,
                degraded=answer.degraded,
            )
        except (StaleMemoryVersion, EventsAlreadyConsolidated) as e:
            # Not applied (another run changed the memory first; the processor plans again),
            # but the call was made: it is recorded as discarded and its tokens are booked.
            self._kept.discard(answer, attempt, f"not applied: {e}", self._unapplied)
            raise
        except DatabaseUnavailable:
            raise  # not the answer's fault: kept, it is booked with the run that lands
        except Exception as e:
            # Paid for all the same, unless its write committed before the error.
            why = f"not applied: {type(e).__name__}: {e}"
            self._unapplied.discarded_unless_applied(
                request, attempt, now, response, duration_ms, why, run_id=answer.run_id
            )
            self._kept.book(answer)  # or said it is not: settled, not recorded again
            raise
        self._kept.applied(answer)
        self._observer.consolidated(update.run)
        return update

    def _apply(
        self,
        request: ConsolidationRequest,
        response: BackendResponse,
        now: datetime,
        duration_ms: int,
        attempt: int,
        *,
        exhausted: bool,
        degraded: str | None,
    ) -> MemoryUpdate:
        unshown_ids = self._consolidator.unshown_ids(request, response)
        update = self._consolidator.plan(
            request,
            response,
            unshown=self._store.facts_with_ids(request.key, unshown_ids),
            run_id=run_id_for(request.key, request.event_ids),
            backend=self._backend.name,
            prompt_version=self._backend.prompt_version,
            started_at=now,
            duration_ms=duration_ms,
            attempt=attempt,
        )
        if exhausted:
            update = _with_output(update, budget_action=self._budget_policy.value)
        if degraded is not None:
            update = _with_output(update, candidates_degraded=degraded)
        self._store.apply(update)
        return update

    def _request(
        self, state: MemoryState, events: Sequence[ContextEvent], now: datetime, known: int | None
    ) -> tuple[ConsolidationRequest, str | None]:
        candidates = select_candidates(
            state.key, events, self._search, self._candidate_policy, known=known
        )
        known_info = self._store.connections(state.key, updated_connections(events))
        connections = {c.connection_id: c.learned_info for c in known_info}
        request = ConsolidationRequest.build(
            state, candidates.facts, list(events), now, candidates.known, connections
        )
        return request, candidates.degraded

    # -- bisecting ------------------------------------------------------------------------

    def _split(
        self,
        state: MemoryState,
        fresh: Sequence[ContextEvent],
        now: datetime,
        attempt: int,
        credit: CreditLine,
        generation: uuid.UUID | None,
        error: UnusableAnswer,
        updates: list[MemoryUpdate],
    ) -> FlushResult:
        """`updates`: the runs applied. Raises CreditSpent: no credit left, and DEFER."""
        if len(fresh) == 1:
            alone = RejectedEvents((fresh[0].event_id,), f"backend error: {error}")
            return FlushResult(FlushKind.REJECTED, 0, rejected=(alone,))

        def consolidate(group: Sequence[ContextEvent]) -> MemoryUpdate:
            credit.before_call()
            # Each on the memory as the runs (and recorded failures) before it left it.
            current = self._store.load_state(state.key)
            return applied(self._attempt(current, group, now, attempt, credit.spent, generation))

        def probe(group: Sequence[ContextEvent]) -> str | Answered[KeptAnswer]:
            credit.before_call()
            try:
                answer = self._asking.ask(
                    state, group, attempt, generation,
                    lambda: self._request(state, group, now, None), probe=True,
                )  # fmt: skip
            except UnusableAnswer as e:
                return str(e)
            credit.held(answer.response)
            return Answered(answer)

        def reuse(group: Sequence[ContextEvent], answer: KeptAnswer) -> MemoryUpdate | None:
            # Recorded as discarded by an earlier try: applied, its call would be booked twice.
            if (
                self._kept.booked(answer)
                or self._store.load_state(state.key).version != state.version
            ):
                return None
            credit.booked(answer.response)  # with the run, or kept if its write is refused
            update = self._attempt(
                state, group, now, attempt, credit.spent, generation, probed=answer
            )
            return applied(update)

        def discard(a: KeptAnswer) -> None:
            credit.booked(a.response)
            self._kept.discard(a, attempt, PROBE_NOTE, self._unapplied)

        def applied(update: MemoryUpdate) -> MemoryUpdate:
            updates.append(update)
            return update

        found = consolidate_isolated(
            fresh, str(error), probe, consolidate, self._max_split_calls,
            reuse=reuse, discard=discard, keeps=DatabaseUnavailable,
        )  # fmt: skip
        return FlushResult.bisected(len(fresh), updates, found, skip_embeddings=credit.spent)

    # -- runs that change nothing ---------------------------------------------------------

    def _defer(
        self,
        state: MemoryState,
        fresh: list[ContextEvent],
        now: datetime,
        attempt: int,
        balance: str,
        run_id: uuid.UUID,
    ) -> FlushResult:
        request = ConsolidationRequest.build(state, (), fresh, now)
        reason = f"credit exhausted ({balance}): consolidation deferred"
        run = self._unapplied.record(
            request, attempt, now, RunStatus.DEFERRED, run_id=run_id, error=reason
        )
        parked = tuple(e.event_id for e in fresh)
        return FlushResult(
            FlushKind.DEFERRED, len(fresh), reason=reason, deferred_run=run.run_id, deferred=parked
        )


def _with_output(update: MemoryUpdate, **notes: str) -> MemoryUpdate:
    """The run's output says what shaped it (a budget policy, a degraded search), for audit."""
    output = {**(update.run.output or {}), **notes}
    return replace(update, run=replace(update.run, output=output))


def _ids(items: Sequence[BufferedEvent]) -> list[uuid.UUID]:
    return [i.event.event_id for i in items]
