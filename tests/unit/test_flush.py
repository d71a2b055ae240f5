"""One user's flush on the in-memory stores: consolidation, budget paths, indexing after."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from consumers.batching import Rejection
from consumers.flush import BudgetPolicy
from consumers.flush_result import FlushKind
from domain.ids import ledger_entry_id_for
from domain.model import Fact, FactStatus, LedgerEntry, MemoryUpdate, RunStatus, TokenUsage
from processors.errors import TransientBackendError
from processors.schema import BackendResponse, ConsolidationRequest
from store.errors import (
    DatabaseUnavailable,
    MemoryBeingErased,
    StaleMemoryVersion,
    VectorIndexUnavailable,
)
from tests.support.builders import BASE_TIME, buffered, key_of, make_event, make_fact, seed_update
from tests.support.fakes import FlakyBackend
from tests.support.inmemory import SUBJECTS, InMemoryMemoryd


def spend(m: InMemoryMemoryd, user_id: str, micro_usd: int) -> None:
    """Credit of `micro_usd`, all spent."""
    m.memory.set_credit(key_of(user_id), micro_usd)
    m.memory.record_ledger(
        [
            LedgerEntry(
                ledger_entry_id_for(uuid.uuid4(), "llm"),
                user_id,
                "org-a",
                None,
                "llm",
                "m",
                1,
                micro_usd,
                BASE_TIME,
            )
        ]
    )


class BrokenIndex:
    """A vector index that is down for writes."""

    def upsert(self, facts: Sequence[Fact]) -> int:
        raise VectorIndexUnavailable("chroma is down")


EVENTS = [make_event("ada", "I live in Lisbon"), make_event("ada", "I like green tea")]
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)


def test_a_flush_consolidates_then_indexes_in_the_background() -> None:
    m = InMemoryMemoryd()
    backend = FlakyBackend()
    flusher = m.flusher(backend)
    # A repeat in the batch.
    result = flusher.flush(key_of("ada"), buffered([*EVENTS, EVENTS[0]]), attempt=0)
    flusher.close()  # waits for the index thread

    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, 2)
    assert len(backend.requests[0].observations) == 2
    assert m.memory.load_state(key_of("ada")).version == 1
    assert m.memory.already_consolidated(key_of("ada"), (e.event_id for e in EVENTS)) == {
        e.event_id for e in EVENTS
    }
    facts = m.memory.facts(key_of("ada"))
    assert {f.content for f in facts} >= {"The user lives in Lisbon"}
    assert m.memory.pending_backlog().count == 0
    assert m.index.count(key_of("ada")) == len(facts)
    assert [r.run_id for r in m.observer.runs] == list(result.run_ids)
    assert [backend_name for backend_name, _ in m.observer.flushes] == [backend.name]
    assert m.observer.budget == []


def test_events_already_consolidated_are_not_sent_again() -> None:
    m = InMemoryMemoryd()
    backend = FlakyBackend()
    flusher = m.flusher(backend)
    flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    again = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()
    assert (again.kind, again.events) == (FlushKind.NOTHING_NEW, 0)
    assert backend.calls == 1


def test_out_of_credit_defers_without_calling_the_backend() -> None:
    m = InMemoryMemoryd()
    spend(m, "ada", 100)
    backend = FlakyBackend()
    flusher = m.flusher(backend, BudgetPolicy.DEFER)
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    assert result.kind is FlushKind.DEFERRED
    assert "credit exhausted (balance 0 micro-USD)" in result.reason
    assert backend.calls == 0
    assert m.memory.load_state(key_of("ada")).version == 0
    assert m.memory.already_consolidated(key_of("ada"), (e.event_id for e in EVENTS)) == frozenset()
    (run,) = m.runs.runs(key_of("ada"))
    assert (run.run.status, (run.run.run_id,)) == (RunStatus.DEFERRED, result.run_ids)
    assert m.observer.budget == ["defer"]


def test_a_deferral_read_again_is_one_run_and_redriven_records_another() -> None:
    m = InMemoryMemoryd()
    spend(m, "ada", 100)
    flusher = m.flusher(FlakyBackend(), BudgetPolicy.DEFER)
    first = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    # Read again after a crash before the offsets were committed: the same records.
    again = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    # Redriven from the dead-letter topic: the same events in new records.
    redriven = flusher.flush(key_of("ada"), buffered(EVENTS, partition=2), attempt=0)
    flusher.close()

    assert first.run_ids == again.run_ids != redriven.run_ids
    runs = [r.run for r in m.runs.runs(key_of("ada"))]
    assert [r.run_id for r in runs] == [*first.run_ids, *redriven.run_ids]
    assert {r.status for r in runs} == {RunStatus.DEFERRED}


def test_out_of_credit_can_consolidate_without_indexing() -> None:
    m = InMemoryMemoryd()
    spend(m, "ada", 100)
    flusher = m.flusher(FlakyBackend(), BudgetPolicy.SKIP_EMBEDDINGS)
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    assert result.kind is FlushKind.CONSOLIDATED
    assert result.skip_embeddings
    (run,) = m.runs.runs(key_of("ada"))
    assert run.run.output is not None
    assert run.run.output["budget_action"] == "skip_embeddings"
    assert m.memory.pending_backlog().count == len(m.memory.facts(key_of("ada"))) > 0
    assert m.index.count() == 0
    assert m.memory.pending_index(skip_out_of_credit=True) == []
    assert m.observer.budget == ["skip_embeddings"]


def test_a_budget_action_is_counted_once_for_a_flush_tried_again() -> None:
    m = InMemoryMemoryd()
    spend(m, "ada", 100)
    backend = FlakyBackend([TransientBackendError("timed out")])
    flusher = m.flusher(backend, BudgetPolicy.SKIP_EMBEDDINGS)
    with pytest.raises(TransientBackendError):
        flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=1)
    flusher.close()

    assert (result.kind, backend.calls) == (FlushKind.CONSOLIDATED, 2)
    assert m.observer.budget == ["skip_embeddings"]


def test_credit_left_is_no_budget_action() -> None:
    m = InMemoryMemoryd()
    m.memory.set_credit(key_of("ada"), 1_000)
    flusher = m.flusher(FlakyBackend(), BudgetPolicy.DEFER)
    assert flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0).kind is FlushKind.CONSOLIDATED
    flusher.close()
    assert m.observer.budget == []


def test_an_index_outage_leaves_the_facts_pending() -> None:
    m = InMemoryMemoryd()
    flusher = m.flusher(FlakyBackend(), index=BrokenIndex())  # type: ignore[arg-type]
    assert flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0).kind is FlushKind.CONSOLIDATED
    flusher.close()
    assert m.observer.index_failures == 1
    pending = m.memory.pending_backlog().count
    assert pending == len(m.memory.facts(key_of("ada"))) > 0
    with pytest.raises(VectorIndexUnavailable):  # still down: the gauge shows the backlog
        m.indexer(BrokenIndex()).drain_pending()  # type: ignore[arg-type]
    assert m.observer.pending_facts == pending
    assert m.observer.index_failures == 2  # the drain's failed write too
    assert m.indexer().drain_pending() == pending  # the drain picks them up
    assert m.memory.pending_backlog().count == 0
    assert m.observer.pending_facts == 0


@pytest.mark.parametrize("raw", [None, "not json {"])
def test_a_failure_is_recorded_as_its_own_run(raw: str | None) -> None:
    m = InMemoryMemoryd()
    flusher = m.flusher(FlakyBackend())
    once, again = (Rejection("consolidate", "gave up", "refused", raw) for _ in range(2))
    for rejection in (once, once, again):  # `once` recorded again: a retried record
        assert flusher.record_failure(key_of("ada"), buffered(EVENTS), 3, rejection) == set()
    flusher.close()
    runs = [r.run for r in m.runs.runs(key_of("ada"))]
    assert [r.run_id for r in runs] == [once.run_id, again.run_id]  # one per occurrence
    assert {(r.status, r.error, r.raw_response, r.attempt) for r in runs} == {
        (RunStatus.FAILED, "gave up", raw, 3)
    }
    assert m.memory.load_state(key_of("ada")).version == 0


def test_events_before_an_erasures_cut_off_are_forgotten_under_the_lock() -> None:
    m = InMemoryMemoryd()
    backend = FlakyBackend()
    flusher = m.flusher(backend)
    events = [make_event("ada", f"I like topic {i}") for i in range(3)]
    m.db.cutoffs[SUBJECTS(key_of("ada"))] = {("context-events", 0): 2}
    result = flusher.flush(key_of("ada"), buffered(events), attempt=0)
    all_gone = flusher.flush(key_of("ada"), buffered(events[:2]), attempt=0)
    flusher.close()
    assert (result.kind, result.events, result.forgotten) == (FlushKind.CONSOLIDATED, 1, 2)
    assert [o.event.content for o in backend.requests[0].observations] == ["I like topic 2"]
    assert (all_gone.kind, all_gone.forgotten) == (FlushKind.FORGOTTEN, 2)
    assert backend.calls == 1


def test_a_memory_being_erased_waits() -> None:
    m = InMemoryMemoryd()
    backend = FlakyBackend()
    flusher = m.flusher(backend)
    m.db.erasing.add(key_of("ada"))
    with pytest.raises(MemoryBeingErased):
        flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()
    assert backend.calls == 0


def test_a_fact_stated_again_after_it_was_contradicted_keeps_its_earlier_evidence() -> None:
    m = InMemoryMemoryd()
    earlier = uuid.uuid4()
    lisbon = make_fact(
        "ada",
        "The user lives in Lisbon",
        status=FactStatus.CONTRADICTED,
        source_event_ids=(earlier,),
        reinforce_count=2,
    )
    m.seed("ada", [lisbon])
    flusher = m.flusher(FlakyBackend())
    event = make_event("ada", "I live in Lisbon")
    flusher.flush(key_of("ada"), buffered([event]), attempt=0)
    flusher.close()

    [row] = m.memory.facts_with_ids(key_of("ada"), [lisbon.fact_id])
    assert row.status is FactStatus.ACTIVE
    assert row.provenance.source_event_ids == (earlier, event.event_id)
    assert row.reinforce_count == 3  # stated once more
    # The run's recorded effect (what replay folds) says the same.
    (_, run) = m.runs.runs(key_of("ada"))
    assert run.run.output is not None
    [applied] = [
        f["after"]
        for f in run.run.output["applied"]["facts"]
        if f["after"]["fact_id"] == str(lisbon.fact_id)
    ]
    assert applied["source_event_ids"] == [str(earlier), str(event.event_id)]


class Costly(FlakyBackend):
    """Answers as the offline backend does, with the tokens a model's call would report."""

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        return replace(super().consolidate(request), usage=USAGE)


def test_an_answer_the_memory_moved_past_is_not_applied_but_its_call_is_booked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    flusher = m.flusher(Costly())
    apply = m.memory.apply

    def another_run_first(update: MemoryUpdate) -> None:
        apply(seed_update(m.memory, "ada", []))  # commits between the read and this apply
        apply(update)

    monkeypatch.setattr(m.memory, "apply", another_run_first)
    with pytest.raises(StaleMemoryVersion):
        flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    runs = [logged.run for logged in m.runs.runs(key_of("ada"))]
    [discarded] = [r for r in runs if r.status is RunStatus.DISCARDED]
    assert discarded.output is not None
    assert "not applied: memory" in discarded.output["discarded"]
    assert discarded.usage == USAGE
    assert set(discarded.input_event_ids) == {e.event_id for e in EVENTS}
    booked = [e for e in m.db.ledger.values() if e.run_id == discarded.run_id]
    assert [(e.operation, e.units) for e in booked] == [("llm", USAGE.total)]
    assert m.observer.charged_runs == [discarded]


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "in-commit"])
def test_a_call_whose_write_failed_is_booked_once_whether_or_not_it_committed(
    monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    m = InMemoryMemoryd()
    backend = Costly()
    flusher = m.flusher(backend)
    apply = m.memory.apply
    failures = [DatabaseUnavailable("server closed the connection unexpectedly")]

    def connection_lost(update: MemoryUpdate) -> None:
        if failures:
            if committed:
                apply(update)
            raise failures.pop()
        apply(update)

    monkeypatch.setattr(m.memory, "apply", connection_lost)
    with pytest.raises(DatabaseUnavailable):
        flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    m.now += timedelta(seconds=5)
    retried = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)  # the processor's retry
    flusher.close()

    runs = [logged.run for logged in m.runs.runs(key_of("ada"))]
    statuses = sorted(r.status.value for r in runs)
    llm = [e for e in m.db.ledger.values() if e.operation == "llm"]
    # Committed: the retry finds the events consolidated. Not: it applies the answer kept
    # from the first try. Either way one call, booked once with the run that landed.
    kind = FlushKind.NOTHING_NEW if committed else FlushKind.CONSOLIDATED
    assert retried.kind is kind
    assert backend.calls == 1
    assert statuses == ["succeeded"]
    assert [e.units for e in llm] == [USAGE.total]


def test_a_flush_that_raises_is_timed_too() -> None:
    m = InMemoryMemoryd()
    flusher = m.flusher(FlakyBackend([TransientBackendError("timed out")]))
    with pytest.raises(TransientBackendError):
        flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()
    assert [backend for backend, _ in m.observer.flushes] == ["offline"]
