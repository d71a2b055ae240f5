"""A user's retraction of one fact (`fact_retraction` events), applied without the backend.

A retraction is an explicit instruction, not an observation to interpret, so no model sees
it: `RetractionAwareBackend` hides retraction events (and the facts they retract) from the
backend, and `RetractingConsolidator` applies them to the planned update. A deleted fact is
archived, a corrected one contradicted (the correction event that travels with it becomes
the new fact the usual way). The change goes into the same run, so it is in `fact_history`,
in the run's `applied` effect (replay folds it) and in the index like any other change.

A retraction naming a fact that is not an active or held fact of that user changes nothing
and is recorded as skipped: one user can never retract another's fact.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from domain.ids import MemoryKey
from domain.model import Fact, FactChange, FactChangeKind, FactStatus, MemoryUpdate, TokenUsage
from processors.consolidate import Consolidator, applied_effect
from processors.schema import (
    BackendResponse,
    ConsolidationBackend,
    ConsolidationOutput,
    ConsolidationRequest,
)
from producers.contract import EventType, FactRetraction, RetractionReason

STATUS_FOR = {
    RetractionReason.DELETED: FactStatus.ARCHIVED,
    RetractionReason.CORRECTED: FactStatus.CONTRADICTED,
}


@dataclass(frozen=True)
class Retraction:
    event_id: uuid.UUID
    key: MemoryKey
    target: FactRetraction


def retractions(request: ConsolidationRequest) -> list[Retraction]:
    return [
        Retraction(
            o.event.event_id,
            MemoryKey(o.event.organization_id, o.event.user_id),
            o.event.retraction(),
        )
        for o in request.observations
        if o.event.event_type is EventType.FACT_RETRACTION
    ]


def without_retractions(request: ConsolidationRequest) -> ConsolidationRequest:
    """The request a backend may see: no retraction events, no retracted facts.

    Observations keep their labels, so evidence the backend cites still resolves.
    """
    retracted = {r.target.fact_id for r in retractions(request)}
    return replace(
        request,
        observations=tuple(
            o for o in request.observations if o.event.event_type is not EventType.FACT_RETRACTION
        ),
        active_facts=tuple(f for f in request.active_facts if f.fact_id not in retracted),
    )


def retraction_changes(
    facts: Sequence[Fact], wanted: Sequence[Retraction], now: datetime
) -> tuple[list[FactChange], list[dict[str, Any]]]:
    """The fact changes the retractions make, and a decision per retraction for the run."""
    by_id = {f.fact_id: f for f in facts}
    changes: dict[uuid.UUID, FactChange] = {}
    decisions: list[dict[str, Any]] = []
    for r in wanted:
        fact_id = r.target.fact_id
        target = changes[fact_id].after if fact_id in changes else by_id.get(fact_id)
        decision = {"event_id": str(r.event_id), "fact_id": str(fact_id), "reason": r.target.reason}
        if target is None or target.key != r.key:
            decisions.append({**decision, "verdict": "skipped", "why": "no such fact of the user"})
            continue
        if target.pinned:
            # memory_facts' upsert never overwrites a pinned row (store.fact_rows).
            decisions.append({**decision, "verdict": "skipped", "why": "the fact is pinned"})
            continue
        after = replace(
            target,
            status=STATUS_FOR[r.target.reason],
            updated_at=now,
            version=target.version + 1,
            indexed_at=None,
        )
        before = changes[fact_id].before if fact_id in changes else target
        changes[fact_id] = FactChange(kind=FactChangeKind.RETRACT, after=after, before=before)
        decisions.append({**decision, "verdict": "applied", "status": after.status.value})
    return list(changes.values()), decisions


class RetractionAwareBackend:
    """A `ConsolidationBackend` that hides retractions from the backend it wraps and does not
    call it at all for a batch of nothing but retractions."""

    def __init__(self, inner: ConsolidationBackend) -> None:
        self._inner = inner
        self.name = inner.name
        self.model = inner.model
        self.prompt_version = inner.prompt_version

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        if not retractions(request):
            return self._inner.consolidate(request)
        visible = without_retractions(request)
        if visible.observations:
            return self._inner.consolidate(visible)
        unchanged = ConsolidationOutput(
            updated_working_memory=request.state.working_memory,
            updated_scaffold=dict(request.state.scaffold),
        )
        return BackendResponse(
            output=unchanged, raw_response="", usage=TokenUsage(), model=self._inner.model
        )


class RetractingConsolidator(Consolidator):
    """`Consolidator` that also applies the batch's retractions to the planned update."""

    def _planned_on(self, request: ConsolidationRequest) -> ConsolidationRequest:
        # The retracted facts are out of the working set, so the gate cannot fold a
        # correction into the very fact it replaces.
        return replace(request, active_facts=without_retractions(request).active_facts)

    def _completed(self, request: ConsolidationRequest, update: MemoryUpdate) -> MemoryUpdate:
        wanted = retractions(request)
        if not wanted:
            return update
        return with_retractions(update, request.active_facts, wanted, request.now)


def with_retractions(
    update: MemoryUpdate, facts: Sequence[Fact], wanted: Sequence[Retraction], now: datetime
) -> MemoryUpdate:
    # What the run itself wrote for a fact comes after the retraction in the batch's order
    # of effects (a re-statement of the same text): the run's change wins.
    touched = {c.after.fact_id for c in update.fact_changes}
    changes, decisions = retraction_changes(facts, wanted, now)
    kept = [c for c in changes if c.after.fact_id not in touched]
    all_changes = (*update.fact_changes, *kept)
    output: dict[str, Any] = dict(update.run.output or {})
    output["applied"] = applied_effect(update.state, all_changes, update.connection_additions)
    output["retractions"] = decisions
    return replace(update, run=replace(update.run, output=output), fact_changes=all_changes)
