"""An answer whose write the database refused is kept for the retry of the same batch: the
backend is not asked again while the refusals last, and the call is booked once, with the run
that lands. What the memory went through meanwhile decides whether the answer still fits."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from consumers.flush_result import FlushKind
from domain.model import MemoryUpdate, RunStatus, TokenUsage
from processors.schema import BackendResponse, ConsolidationRequest
from store.errors import DatabaseRefused
from tests.support.builders import buffered, key_of, make_event, seed_update
from tests.support.fakes import FlakyBackend
from tests.support.inmemory import InMemoryMemoryd

EVENTS = [make_event("ada", "I live in Lisbon"), make_event("ada", "I like green tea")]
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)
READ_ONLY = "applying run refused: cannot execute INSERT in a read-only transaction"


class Costly(FlakyBackend):
    """Answers as the offline backend does, with the tokens a model's call would report."""

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        return replace(super().consolidate(request), usage=USAGE)


def refusing(m: InMemoryMemoryd, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    """The store refuses the first `times` writes of a run, as a read-only database does."""
    apply = m.memory.apply
    left = [times]

    def refused(update: MemoryUpdate) -> None:
        if left[0]:
            left[0] -= 1
            raise DatabaseRefused(READ_ONLY)
        apply(update)

    monkeypatch.setattr(m.memory, "apply", refused)


def outage(m: InMemoryMemoryd, flusher_flush: object, tries: int) -> None:
    for _ in range(tries):
        with pytest.raises(DatabaseRefused):
            flusher_flush()  # type: ignore[operator]
        m.now += timedelta(seconds=5)  # the processor waits the outage out


def llm_units(m: InMemoryMemoryd) -> list[int]:
    return [e.units for e in m.db.ledger.values() if e.operation == "llm"]


def statuses(m: InMemoryMemoryd) -> list[str]:
    return sorted(logged.run.status.value for logged in m.runs.runs(key_of("ada")))


def test_retries_through_refused_writes_call_the_backend_once_and_book_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    backend = Costly()
    flusher = m.flusher(backend)
    refusing(m, monkeypatch, times=4)
    first_try = m.now
    outage(m, lambda: flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0), tries=4)
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    assert result.kind is FlushKind.CONSOLIDATED
    assert backend.calls == 1
    assert statuses(m) == ["succeeded"]
    assert llm_units(m) == [USAGE.total]
    [run] = [logged.run for logged in m.runs.runs(key_of("ada"))]
    assert run.started_at == first_try  # the run is the call's, made before the outage
    assert m.observer.charged_runs == []  # nothing recorded as unapplied


def test_an_answer_the_memory_moved_past_meanwhile_is_booked_as_discarded_not_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    backend = Costly()
    flusher = m.flusher(backend)
    refusing(m, monkeypatch, times=1)
    outage(m, lambda: flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0), tries=1)
    m.memory.apply(seed_update(m.memory, "ada", []))  # another run lands first
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    assert result.kind is FlushKind.CONSOLIDATED
    assert backend.calls == 2  # planned again on the memory as it is now
    runs = [logged.run for logged in m.runs.runs(key_of("ada"))]
    [discarded] = [r for r in runs if r.status is RunStatus.DISCARDED]
    assert discarded.usage == USAGE
    assert set(discarded.input_event_ids) == {e.event_id for e in EVENTS}
    assert sorted(llm_units(m)) == [USAGE.total, USAGE.total]


def test_an_answer_from_before_an_erasure_is_neither_applied_nor_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    m.memory.apply(seed_update(m.memory, "ada", []))  # a memory of an earlier batch
    backend = Costly()
    flusher = m.flusher(backend)
    refusing(m, monkeypatch, times=1)
    outage(m, lambda: flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0), tries=1)
    m.db.generations[key_of("ada")] = uuid.uuid4()  # what a fact erasure does, at one version
    result = flusher.flush(key_of("ada"), buffered(EVENTS), attempt=0)
    flusher.close()

    assert result.kind is FlushKind.CONSOLIDATED
    assert backend.calls == 2
    runs = [logged.run for logged in m.runs.runs(key_of("ada"))]
    [run] = [r for r in runs if set(r.input_event_ids) == {e.event_id for e in EVENTS}]
    assert run.status is RunStatus.SUCCEEDED
    assert run.started_at == m.now  # the new call's answer, not the kept one
    assert llm_units(m) == [USAGE.total]
