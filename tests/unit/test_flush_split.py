"""A batch the model cannot answer usably is bisected: on the in-memory stores, what runs are
recorded, what is booked, what is consolidated and what the runtime dead-letters."""

from __future__ import annotations

import pytest

from consumers.flush_result import FlushKind
from domain.model import RunStatus, TokenUsage
from processors.errors import TransientBackendError, UnusableAnswer
from processors.schema import ConsolidationRequest
from producers.contract import ContextEvent
from tests.support.builders import buffered, key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import TOPIC, InMemoryMemoryd, step_until

POISON = "POISON"
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)
ADA = key_of("ada")


class ChokesOn(FlakyBackend):
    """Answers unusably any batch with a poison observation (or more than `max_size`
    observations); `transient_after` calls, it is rate limited instead."""

    def __init__(self, max_size: int = 100, transient_after: int | None = None) -> None:
        super().__init__()
        self.max_size = max_size
        self.transient_after = transient_after

    def before(self, request: ConsolidationRequest) -> None:
        if self.transient_after is not None and self.calls > self.transient_after:
            raise TransientBackendError("429")
        texts = [o.event.content for o in request.observations]
        if any(POISON in t for t in texts) or len(texts) > self.max_size:
            raise UnusableAnswer("output is not JSON", raw_response="{", usage=USAGE)


def notes(n: int, poison_at: int | None = None) -> list[ContextEvent]:
    return [
        make_event("ada", f"{POISON} blob" if i == poison_at else f"I read chapter {i}", minutes=i)
        for i in range(n)
    ]


def runs_by_status(m: InMemoryMemoryd) -> dict[RunStatus, list[int]]:
    """Status → the sizes of its runs, in log order."""
    out: dict[RunStatus, list[int]] = {}
    for logged in m.runs.runs(ADA):
        out.setdefault(logged.run.status, []).append(len(logged.run.input_event_ids))
    return out


@pytest.mark.parametrize("poison_at", [0, 5, 7])
def test_one_poison_event_is_split_off_and_the_rest_is_one_run(poison_at: int) -> None:
    m = InMemoryMemoryd()
    events = notes(8, poison_at)
    backend = ChokesOn()
    flusher = m.flusher(backend)
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, 7)
    ((rejected_ids, reason),) = [(r.event_ids, r.reason) for r in result.rejected]
    assert rejected_ids == (events[poison_at].event_id,)
    assert "output is not JSON" in reason
    assert "bisected out of a batch of 8" in reason
    statuses = runs_by_status(m)
    assert statuses[RunStatus.SUCCEEDED] == [7]
    assert statuses[RunStatus.FAILED][0] == 8  # the whole batch, first
    assert statuses[RunStatus.FAILED][-1] == 1  # the poison alone, last
    assert RunStatus.DISCARDED in statuses  # usable probes, recorded, not applied
    assert m.memory.load_state(ADA).version == 1
    assert m.observer.probes.count(False) >= 1
    assert m.observer.probes.count(True) >= 1


def test_every_call_is_booked_once_against_its_own_run() -> None:
    m = InMemoryMemoryd()
    backend = ChokesOn()
    flusher = m.flusher(backend)
    flusher.flush(ADA, buffered(notes(8, poison_at=2)), attempt=0)
    flusher.close()

    runs = [logged.run for logged in m.runs.runs(ADA)]
    assert len(runs) == backend.calls
    booked = {e.run_id: e.units for e in m.db.ledger.values() if e.operation == "llm"}
    assert booked == {r.run_id: r.usage.total for r in runs}
    unapplied = [r for r in runs if r.status is not RunStatus.SUCCEEDED]
    failed = [r for r in unapplied if r.status is RunStatus.FAILED]
    assert {r.usage for r in failed} == {USAGE}
    assert [r.run_id for r in m.observer.charged_runs] == [r.run_id for r in unapplied]


def test_a_lone_event_the_model_cannot_answer_is_rejected_with_its_failed_run() -> None:
    m = InMemoryMemoryd()
    [event] = notes(1, poison_at=0)
    flusher = m.flusher(ChokesOn())
    result = flusher.flush(ADA, buffered([event]), attempt=0)
    flusher.close()

    assert (result.kind, result.events, result.updates) == (FlushKind.REJECTED, 0, ())
    assert [r.event_ids for r in result.rejected] == [(event.event_id,)]
    assert runs_by_status(m) == {RunStatus.FAILED: [1]}


def test_events_that_fail_only_together_are_consolidated_apart() -> None:
    m = InMemoryMemoryd()
    events = notes(8)
    flusher = m.flusher(ChokesOn(max_size=4))
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert (result.kind, result.events, result.rejected) == (FlushKind.CONSOLIDATED, 8, ())
    assert sum(len(u.run.input_event_ids) for u in result.updates) == 8
    assert len(result.updates) > 1  # all together failed again: one run per clean group
    assert m.memory.load_state(ADA).version == len(result.updates)


def test_a_transient_error_while_bisecting_keeps_the_whole_batch() -> None:
    m = InMemoryMemoryd()
    events = notes(8, poison_at=6)
    flusher = m.flusher(ChokesOn(transient_after=2))
    with pytest.raises(TransientBackendError):
        flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()

    assert m.memory.already_consolidated(ADA, (e.event_id for e in events)) == frozenset()
    assert RunStatus.SUCCEEDED not in runs_by_status(m)


def test_the_runtime_dead_letters_only_the_split_off_event() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    events = notes(6, poison_at=4)
    for e in events:
        consumer.produce(0, e.to_bytes(), e.kafka_key)
    processor = m.processor(consumer, ChokesOn(), letters)
    processor.start()

    step_until(processor, lambda: consumer.committed.get(0) == 6)
    processor.shutdown()

    (letter,) = letters.letters
    assert (letter.stage, letter.offset) == ("consolidate", 4)
    assert "bisected out of a batch of 5" in letter.reason  # the in-memory app's max_batch
    done = m.memory.already_consolidated(ADA, (e.event_id for e in events))
    assert done == {e.event_id for i, e in enumerate(events) if i != 4}


def test_the_probe_of_the_only_clean_event_is_its_run_paid_for_once() -> None:
    """[A, poison]: the probe of A asks what A's consolidation would ask, on the same memory,
    so its answer is applied: three calls (the batch, A, the poison), not four."""
    m = InMemoryMemoryd()
    a, poison = notes(2, poison_at=1)
    backend = ChokesOn()
    flusher = m.flusher(backend)
    result = flusher.flush(ADA, buffered([a, poison]), attempt=0)
    flusher.close()

    assert backend.calls == 3
    assert [r.observations[0].event.event_id for r in backend.requests[1:]] == [
        a.event_id,
        poison.event_id,
    ]
    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, 1)
    assert [r.event_ids for r in result.rejected] == [(poison.event_id,)]
    assert runs_by_status(m) == {RunStatus.FAILED: [2, 1], RunStatus.SUCCEEDED: [1]}
    runs = [logged.run for logged in m.runs.runs(ADA)]
    booked = [(e.run_id, e.units) for e in m.db.ledger.values() if e.operation == "llm"]
    assert sorted(booked, key=str) == sorted(((r.run_id, r.usage.total) for r in runs), key=str)
    (succeeded,) = result.updates
    assert succeeded.run.usage.total > 0  # the probe's call, booked with the run it became
    assert m.observer.probes == [True, False]
    assert m.memory.load_state(ADA).version == 1
