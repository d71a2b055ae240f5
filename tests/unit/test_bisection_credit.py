"""A bisected batch reads the credit line again before each further call, counting the calls
the batch made so far (a probe's answer held back for reuse as well): spent, DEFER parks what
no run took yet and SKIP_EMBEDDINGS carries on as out of credit."""

from __future__ import annotations

from consumers.flush import BudgetPolicy
from consumers.flush_result import FlushKind
from domain.model import RunStatus
from processors.cost import ModelPrice, PriceTable
from tests.support.builders import buffered
from tests.support.inmemory import InMemoryMemoryd
from tests.unit.test_flush_split import ADA, USAGE, ChokesOn, notes, runs_by_status

PRICES = PriceTable({}, default=ModelPrice(input_usd_per_mtok=1.0, output_usd_per_mtok=10.0))
FAILED_CALL = PRICES.llm_cost_micro_usd("any", USAGE)  # what an unusable answer costs


def spent(m: InMemoryMemoryd) -> int:
    return sum(e.cost_micro_usd for e in m.db.ledger.values())


def test_a_batch_whose_failed_call_spends_the_credit_is_deferred_not_bisected() -> None:
    m = InMemoryMemoryd()
    m.memory.set_credit(ADA, FAILED_CALL)
    events = notes(8, poison_at=3)
    backend = ChokesOn()
    flusher = m.flusher(backend, prices=PRICES)
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert backend.calls == 1
    assert result.kind is FlushKind.DEFERRED
    assert set(result.deferred) == {e.event_id for e in events}
    assert "credit exhausted (balance 0 micro-USD while bisecting)" in result.reason
    assert runs_by_status(m) == {RunStatus.FAILED: [8], RunStatus.DEFERRED: [8]}
    assert m.observer.budget == ["defer"]


def test_a_probe_answer_held_for_reuse_counts_against_the_credit() -> None:
    """[A, poison]: A's probe is not booked while it may become A's run, yet it was paid for;
    with it the credit is spent, so the poison is not probed and both events are parked."""
    m = InMemoryMemoryd()
    m.memory.set_credit(ADA, FAILED_CALL + 1)  # less than A's probe costs
    a, poison = notes(2, poison_at=1)
    backend = ChokesOn()
    flusher = m.flusher(backend, prices=PRICES)
    result = flusher.flush(ADA, buffered([a, poison]), attempt=0)
    flusher.close()

    assert backend.calls == 2  # the batch, and A's probe
    assert result.kind is FlushKind.DEFERRED
    assert set(result.deferred) == {a.event_id, poison.event_id}
    statuses = runs_by_status(m)
    assert statuses == {RunStatus.FAILED: [2], RunStatus.DISCARDED: [1], RunStatus.DEFERRED: [2]}
    (probe,) = [r.run for r in m.runs.runs(ADA) if r.run.status is RunStatus.DISCARDED]
    assert probe.cost_micro_usd > 1
    assert spent(m) == FAILED_CALL + probe.cost_micro_usd  # the probe's answer, booked once
    assert m.memory.load_state(ADA).version == 0


def test_skip_embeddings_bisects_on_and_marks_the_runs_after_the_credit_ran_out() -> None:
    m = InMemoryMemoryd()
    m.memory.set_credit(ADA, FAILED_CALL)
    events = notes(4, poison_at=3)
    flusher = m.flusher(ChokesOn(), BudgetPolicy.SKIP_EMBEDDINGS, prices=PRICES)
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, 3)
    assert result.skip_embeddings
    (update,) = result.updates
    assert (update.run.output or {})["budget_action"] == "skip_embeddings"
    assert m.memory.pending_index(skip_out_of_credit=True) == []
    assert m.observer.budget == ["skip_embeddings"]


def test_credit_left_after_every_call_changes_nothing() -> None:
    m = InMemoryMemoryd()
    m.memory.set_credit(ADA, 1_000_000_000)
    events = notes(8, poison_at=5)
    flusher = m.flusher(ChokesOn(), prices=PRICES)
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert (result.kind, result.events, result.skip_embeddings) == (
        FlushKind.CONSOLIDATED,
        7,
        False,
    )
    assert [r.event_ids for r in result.rejected] == [(events[5].event_id,)]
    assert m.observer.budget == []
