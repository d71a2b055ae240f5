"""fact_retraction events: validated by the contract, applied without the backend."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from domain.ids import MemoryKey
from domain.model import (
    Fact,
    FactChangeKind,
    FactStatus,
    MemoryState,
)
from processors.cost import PriceTable
from processors.gate import WriteGate
from processors.offline import OfflineBackend
from processors.retraction import (
    RetractingConsolidator,
    Retraction,
    RetractionAwareBackend,
    retraction_changes,
)
from processors.schema import BackendResponse, ConsolidationRequest
from producers.contract import (
    ContextEvent,
    EventType,
    FactRetraction,
    RetractionReason,
)
from producers.corrections import FactCorrections
from tests.support.builders import make_event, make_fact
from tests.support.fakes import BagOfWordsEmbedder

NOW = datetime(2026, 11, 2, tzinfo=UTC)
EARLIER = datetime(2026, 11, 1, tzinfo=UTC)


def fact(content: str, user: str = "ada", pinned: bool = False, org: str = "org-a") -> Fact:
    return make_fact(user, content, at=EARLIER, pinned=pinned, org=org)


LISBON = fact("Ada lives in Lisbon")
PINNED = fact("Ada's daughter is Mia", pinned=True)
BOBS = fact("Bob lives in Porto", user="bob")
OTHER_ADAS = fact("Ada lives in Lisbon", org="org-b")  # the same user id in another organization


def retraction(target: Fact, reason: RetractionReason, user: str = "ada") -> Retraction:
    return Retraction(
        uuid.uuid4(),
        MemoryKey("org-a", user),
        FactRetraction(fact_id=target.fact_id, reason=reason),
    )


@pytest.mark.parametrize(
    ("target", "reason", "user", "status"),
    [
        (LISBON, RetractionReason.DELETED, "ada", FactStatus.ARCHIVED),
        (LISBON, RetractionReason.CORRECTED, "ada", FactStatus.CONTRADICTED),
        (BOBS, RetractionReason.DELETED, "ada", None),  # another user's fact
        (OTHER_ADAS, RetractionReason.DELETED, "ada", None),  # another organization's "ada"
        (PINNED, RetractionReason.DELETED, "ada", None),  # pinned rows are never overwritten
        (fact("never stored"), RetractionReason.DELETED, "ada", None),
    ],
)
def test_retraction_changes(
    target: Fact, reason: RetractionReason, user: str, status: FactStatus | None
) -> None:
    changes, decisions = retraction_changes(
        [LISBON, PINNED, BOBS, OTHER_ADAS], [retraction(target, reason, user)], NOW
    )
    if status is None:
        assert changes == []
        assert decisions[0]["verdict"] == "skipped"
        return
    (change,) = changes
    assert change.kind is FactChangeKind.RETRACT
    assert change.before == target
    assert change.after.status is status
    assert change.after.version == target.version + 1
    assert change.after.updated_at == NOW
    assert change.after.indexed_at is None
    assert decisions[0]["verdict"] == "applied"


def event(kind: EventType, content: str, minutes: int = 0) -> ContextEvent:
    return make_event("ada", content, kind, at=EARLIER.replace(minute=minutes))


def test_the_contract_validates_retraction_content() -> None:
    good = FactRetraction(fact_id=LISBON.fact_id).model_dump_json()
    assert event(EventType.FACT_RETRACTION, good).retraction().fact_id == LISBON.fact_id
    for bad in ("not json", '{"fact_id": "nope"}', '{"fact_id": null}'):
        with pytest.raises(ValidationError):
            event(EventType.FACT_RETRACTION, bad)


class CountingBackend(OfflineBackend):
    def __init__(self) -> None:
        super().__init__(BagOfWordsEmbedder())
        self.seen: list[ConsolidationRequest] = []

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        self.seen.append(request)
        return super().consolidate(request)


def request(events: list[ContextEvent], facts: tuple[Fact, ...]) -> ConsolidationRequest:
    state = MemoryState("ada", "org-a", "Ada lives in Lisbon.", {"City": "Lisbon"}, (), 3)
    return ConsolidationRequest.build(state, facts, events, NOW)


def plan(req: ConsolidationRequest, backend: CountingBackend) -> tuple[Fact, ...]:
    wrapped = RetractionAwareBackend(backend)
    response = wrapped.consolidate(req)
    update = RetractingConsolidator(WriteGate(BagOfWordsEmbedder()), PriceTable({})).plan(
        req,
        response,
        run_id=uuid.uuid4(),
        backend=wrapped.name,
        prompt_version=wrapped.prompt_version,
        started_at=NOW,
        duration_ms=0,
    )
    assert set(update.consumed_event_ids) == {o.event.event_id for o in req.observations}
    applied = {f["after"]["fact_id"] for f in (update.run.output or {})["applied"]["facts"]}
    assert applied == {str(c.after.fact_id) for c in update.fact_changes}
    return tuple(c.after for c in update.fact_changes)


def test_a_batch_of_only_retractions_never_calls_the_backend() -> None:
    backend = CountingBackend()
    delete = FactRetraction(fact_id=LISBON.fact_id).model_dump_json()
    after = plan(request([event(EventType.FACT_RETRACTION, delete)], (LISBON,)), backend)
    assert backend.seen == []
    assert [(f.fact_id, f.status) for f in after] == [(LISBON.fact_id, FactStatus.ARCHIVED)]


def test_a_correction_replaces_the_retracted_fact_and_the_backend_never_sees_either() -> None:
    backend = CountingBackend()
    corrected = FactRetraction(fact_id=LISBON.fact_id, reason=RetractionReason.CORRECTED)
    events = [
        event(EventType.FACT_RETRACTION, corrected.model_dump_json()),
        event(EventType.CORRECTION, "Actually I live in Lisbon's neighbour Porto", 1),
    ]
    after = {f.fact_id: f for f in plan(request(events, (LISBON,)), backend)}
    (seen,) = backend.seen
    assert [o.event.event_type for o in seen.observations] == [EventType.CORRECTION]
    assert LISBON.fact_id not in {f.fact_id for f in seen.active_facts}
    assert after[LISBON.fact_id].status is FactStatus.CONTRADICTED
    new = [f for f in after.values() if f.fact_id != LISBON.fact_id]
    assert any("Porto" in f.content and f.status is FactStatus.ACTIVE for f in new)


class Recorder:
    def __init__(self) -> None:
        self.events: list[ContextEvent] = []

    def publish(self, events: list[ContextEvent]) -> None:
        self.events += events


def test_fact_corrections_publish_retraction_then_correction() -> None:
    recorder = Recorder()
    corrections = FactCorrections(recorder, "ada", "org-a")
    corrections.delete_fact(LISBON.fact_id, idempotency_key="k1")
    corrections.correct_fact(LISBON.fact_id, "I live in Porto", idempotency_key="k2")
    kinds = [e.event_type for e in recorder.events]
    assert kinds == [EventType.FACT_RETRACTION, EventType.FACT_RETRACTION, EventType.CORRECTION]
    reasons = [e.retraction().reason for e in recorder.events[:2]]
    assert reasons == [RetractionReason.DELETED, RetractionReason.CORRECTED]
    again = Recorder()
    FactCorrections(again, "ada", "org-a").delete_fact(LISBON.fact_id, idempotency_key="k1")
    assert again.events[0].event_id == recorder.events[0].event_id


def test_a_correction_key_names_one_request_of_one_fact() -> None:
    """The key "k" and the key "k:new" were one event each way; and one key on two facts was
    one retraction, so the second fact was never retracted."""
    recorder = Recorder()
    corrections = FactCorrections(recorder, "ada", "org-a")
    corrections.correct_fact(LISBON.fact_id, "I live in Porto", idempotency_key="k")
    corrections.correct_fact(LISBON.fact_id, "I live in Braga", idempotency_key="k:new")
    corrections.correct_fact(PINNED.fact_id, "Ada's daughter is Maria", idempotency_key="k")
    corrections.delete_fact(LISBON.fact_id, idempotency_key="k")
    ids = [e.event_id for e in recorder.events]
    assert len(set(ids)) == len(ids) == 7
    retried = Recorder()
    FactCorrections(retried, "ada", "org-a").correct_fact(
        LISBON.fact_id, "I live in Porto", idempotency_key="k"
    )
    assert [e.event_id for e in retried.events] == ids[:2]


def test_a_deleted_fact_leaves_w_and_s_and_what_else_they_say_stays() -> None:
    tea = fact("Ada prefers green tea")
    state = MemoryState(
        "ada",
        "org-a",
        "Lately: Ada lives in Lisbon. Ada runs on Sundays.\nHow they like things: ada  PREFERS"
        " green tea.\nAda lives in Lisbon's old town with her partner.",
        {
            "City": "Lisbon",
            "Preferences": ["Ada prefers green tea", "Ada prefers trains"],
            "People": {"Ada": {"Home": "Ada lives in Lisbon."}},
            "Notes": "Ada prefers green teas",  # another statement: stays
        },
        (),
        3,
    )
    deletes = [
        event(EventType.FACT_RETRACTION, FactRetraction(fact_id=f.fact_id).model_dump_json(), i)
        for i, f in enumerate((LISBON, tea))
    ]
    req = ConsolidationRequest.build(state, (LISBON, tea), deletes, NOW)
    wrapped = RetractionAwareBackend(CountingBackend())
    update = RetractingConsolidator(WriteGate(BagOfWordsEmbedder()), PriceTable({})).plan(
        req,
        wrapped.consolidate(req),
        run_id=uuid.uuid4(),
        backend=wrapped.name,
        prompt_version=wrapped.prompt_version,
        started_at=NOW,
        duration_ms=0,
    )
    # The label stays with the sentence after it; a line left with nothing is gone.
    assert update.state.working_memory == "Lately: Ada runs on Sundays."
    assert dict(update.state.scaffold) == {
        "City": "Lisbon",
        "Preferences": ["Ada prefers trains"],
        "People": {"Ada": {}},
        "Notes": "Ada prefers green teas",
    }
    applied = (update.run.output or {})["applied"]
    assert applied["working_memory"] == update.state.working_memory
    assert applied["scaffold"] == update.state.scaffold
