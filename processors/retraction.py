"""A user's retraction of one fact (`fact_retraction` events), applied without the backend.

A retraction is an explicit instruction, not an observation to interpret, so no model sees
it: `RetractionAwareBackend` hides retraction events (and the facts they retract) from the
backend, and `RetractingConsolidator` applies them to the planned update. A deleted fact is
archived, a corrected one contradicted (the correction event that travels with it becomes
the new fact the usual way). The change goes into the same run, so it is in `fact_history`,
in the run's `applied` effect (replay folds it) and in the index like any other change.
The retracted statements leave W and S in the same run (`without_statements`).

A retraction naming a fact that is not an active or held fact of that user changes nothing
and is recorded as skipped: one user can never retract another's fact.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from domain.ids import MemoryKey, normalize_content
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    MemoryState,
    MemoryUpdate,
    TokenUsage,
)
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
        # No patch of S: S unchanged.
        unchanged = ConsolidationOutput(updated_working_memory=request.state.working_memory)
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
    state = without_statements(update.state, [c.before.content for c in kept if c.before])
    output: dict[str, Any] = dict(update.run.output or {})
    output["applied"] = applied_effect(state, all_changes, update.connection_additions)
    output["retractions"] = decisions
    run = replace(update.run, output=output)
    return replace(update, run=run, state=state, fact_changes=all_changes)


def without_statements(state: MemoryState, statements: Sequence[str]) -> MemoryState:
    """W and S without the retracted facts' statements, which W and S are shown in every chat.

    The backend never sees a retraction, and a batch of nothing but retractions is not sent
    to it, so W and S would go on telling what the user took back. What is taken out: S's
    strings equal to a statement (case and spacing aside) at any depth, and W's sentences
    containing one. The offline backend keeps statements in S and W word for word; a model
    that reworded one in W is not caught here (its next run rewrites W without the fact).
    """
    texts = [t for t in (_comparable(s) for s in statements) if t]
    if not texts:
        return state
    scaffold = _scrubbed(dict(state.scaffold), texts)
    working = _without_sentences(state.working_memory, texts)
    return replace(
        state, scaffold=scaffold if isinstance(scaffold, dict) else {}, working_memory=working
    )


def _comparable(text: str) -> str:
    return normalize_content(text).rstrip(".!?… ")


def _scrubbed(value: Any, texts: Sequence[str]) -> Any:
    if isinstance(value, dict):
        return {
            k: _scrubbed(v, texts)
            for k, v in value.items()
            if not (isinstance(v, str) and _comparable(v) in texts)
        }
    if isinstance(value, list):
        return [
            _scrubbed(v, texts)
            for v in value
            if not (isinstance(v, str) and _comparable(v) in texts)
        ]
    return value


_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])\s+")
# An opening such as the offline backend's "Lately: ", kept for the sentence after it.
_LABEL = re.compile(r"^[A-Z][^.!?:]{0,30}: ")


def _without_sentences(text: str, texts: Sequence[str]) -> str:
    said = [re.compile(rf"(?<!\w){re.escape(t)}(?!\w)") for t in texts]

    def retracted(sentence: str) -> bool:
        return any(p.search(normalize_content(sentence)) for p in said)

    lines = []
    for line in text.split("\n"):
        sentences = _SENTENCE_BREAK.split(line)
        kept = [s for s in sentences if not retracted(s)]
        if len(kept) == len(sentences):
            lines.append(line)
            continue
        label = _LABEL.match(sentences[0])
        if kept and label and retracted(sentences[0]):
            kept[0] = label.group(0) + kept[0]
        if kept:
            lines.append(" ".join(kept))
    return "\n".join(lines)
