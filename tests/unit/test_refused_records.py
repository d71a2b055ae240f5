"""Every answer a flush got is kept while the database refuses its writes, usable or not, and
the retry of the same batch takes them instead of calling: across the refused tries and the one
that lands, a batch costs the calls of one flush, each booked once. Here the record of a failed
or discarded run is refused too, not only a run's write."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from consumers.flush_result import FlushKind, FlushResult
from domain.model import RunStatus, TokenUsage
from processors.errors import UnusableAnswer
from processors.schema import BackendResponse, ConsolidationRequest
from producers.contract import ContextEvent
from store.errors import DatabaseRefused
from tests.support.builders import BASE_TIME, buffered, key_of, make_event, seed_update
from tests.support.fakes import FlakyBackend
from tests.support.inmemory import InMemoryMemoryd

ADA = key_of("ada")
POISON = "POISON"
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)
READ_ONLY = "cannot execute INSERT in a read-only transaction"
REFUSED_TRIES = 5


class Counting(FlakyBackend):
    """Answers each call with a model's tokens; unusably when an observation is poison."""

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        return replace(super().consolidate(request), usage=USAGE)

    def before(self, request: ConsolidationRequest) -> None:
        if any(POISON in o.event.content for o in request.observations):
            raise UnusableAnswer("output is not JSON", raw_response="{", usage=USAGE)


def notes(n: int, poison_at: int) -> list[ContextEvent]:
    return [
        make_event("ada", f"{POISON} blob" if i == poison_at else f"I read chapter {i}", minutes=i)
        for i in range(n)
    ]


def refuse(
    m: InMemoryMemoryd,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    times: int,
    which: Callable[[Any], bool] = lambda _: True,
) -> list[int]:
    """The store refuses the first `times` calls of `method` whose first argument is `which`,
    as a read-only database does. Returns how many refusals are left."""
    write = getattr(m.memory, method)
    left = [times]

    def refused(first: Any, *rest: Any) -> Any:
        if left[0] and which(first):
            left[0] -= 1
            raise DatabaseRefused(READ_ONLY)
        return write(first, *rest)

    monkeypatch.setattr(m.memory, method, refused)
    return left


def through_outage(
    m: InMemoryMemoryd, backend: Counting, events: list[ContextEvent]
) -> FlushResult:
    """Flush until a try is not refused, as the processor does, waiting out each refusal."""
    flusher = m.flusher(backend)
    try:
        for _ in range(REFUSED_TRIES + 1):
            try:
                return flusher.flush(ADA, buffered(events), attempt=0)
            except DatabaseRefused:
                m.now += timedelta(seconds=5)
        raise AssertionError("every try was refused")
    finally:
        flusher.close()


def one_flush(events: list[ContextEvent]) -> tuple[int, list[bool]]:
    """The calls one flush with no outage makes, and its probes' answers (usable or not)."""
    backend, m = Counting(), InMemoryMemoryd()
    flusher = m.flusher(backend)
    flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()
    return backend.calls, m.observer.probes


def calls_of_one_flush(events: list[ContextEvent]) -> int:
    return one_flush(events)[0]


def assert_each_call_booked_once(m: InMemoryMemoryd, calls: int) -> None:
    runs = [logged.run for logged in m.runs.runs(ADA) if logged.run.usage.total]  # calls'
    booked = [(e.run_id, e.units) for e in m.db.ledger.values() if e.operation == "llm"]
    assert len(booked) == calls
    assert sorted(booked, key=str) == sorted(((r.run_id, r.usage.total) for r in runs), key=str)


def is_failed(run: Any) -> bool:
    return bool(run.status is RunStatus.FAILED)


def is_discarded(run: Any) -> bool:
    return bool(run.status is RunStatus.DISCARDED)


def test_an_unusable_answer_whose_failed_run_is_refused_is_not_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    [poison] = notes(1, poison_at=0)
    left = refuse(m, monkeypatch, "record_run", REFUSED_TRIES)
    backend = Counting()
    result = through_outage(m, backend, [poison])
    assert left == [0]  # the outage was waited out to its end

    assert result.kind is FlushKind.REJECTED
    assert backend.calls == 1
    assert [r.status for r in (logged.run for logged in m.runs.runs(ADA))] == [RunStatus.FAILED]
    assert_each_call_booked_once(m, 1)


def later_failed_runs() -> Callable[[Any], bool]:
    """Picks the failed runs after the first (the whole batch's)."""
    seen = [0]

    def which(run: Any) -> bool:
        seen[0] += is_failed(run)
        return is_failed(run) and seen[0] > 1

    return which


def every_write() -> Callable[[Any], bool]:
    return lambda _: True


@pytest.mark.parametrize(
    ("n", "poison_at", "method", "times", "which", "calls"),
    [
        # The batch's failed run is recorded, a later probe's is refused: the retry goes
        # through the bisection again on the answers kept, without a call, up to where it
        # stopped.
        pytest.param(8, 5, "record_run", REFUSED_TRIES, later_failed_runs, 7, id="probe-failed"),
        # A held probe answer whose discarded run is refused is booked once.
        pytest.param(8, 5, "record_run", REFUSED_TRIES, lambda: is_discarded, 7, id="held-probe"),
        # [A, poison]: A's probe answer is its run; that run's write is refused: not bisected
        # again.
        pytest.param(2, 1, "apply", REFUSED_TRIES, every_write, 3, id="reused-probe"),
        # Three clean groups answer as probes (several answered: each probe answer is recorded
        # as discarded), then the run of them together is refused: the retry's bisection takes
        # the kept probe answers instead of asking again, and applies the kept run.
        pytest.param(8, 5, "apply", 1, every_write, 7, id="run-after-probes"),
    ],
)
def test_a_bisection_through_refused_writes_costs_the_calls_of_one_flush(
    monkeypatch: pytest.MonkeyPatch,
    n: int,
    poison_at: int,
    method: str,
    times: int,
    which: Callable[[], Callable[[Any], bool]],
    calls: int,
) -> None:
    events = notes(n, poison_at=poison_at)
    m = InMemoryMemoryd()
    left = refuse(m, monkeypatch, method, times, which())
    backend = Counting()
    result = through_outage(m, backend, events)
    assert left == [0]  # the outage was waited out to its end

    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, n - 1)
    assert backend.calls == calls_of_one_flush(events) == calls
    assert_each_call_booked_once(m, backend.calls)
    # A probe's answer taken from the kept ones is no backend call: not counted again.
    assert m.observer.probes == one_flush(events)[1]


def test_an_unusable_answer_the_retry_does_not_take_is_booked_as_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = InMemoryMemoryd()
    [poison] = notes(1, poison_at=0)
    left = refuse(m, monkeypatch, "record_run", 1)
    backend = Counting()
    flusher = m.flusher(backend)
    with pytest.raises(DatabaseRefused):
        flusher.flush(ADA, buffered([poison]), attempt=0)
    m.memory.apply(seed_update(m.memory, "ada", []))  # another run lands first
    result = flusher.flush(ADA, buffered([poison]), attempt=0)
    flusher.close()

    assert left == [0]
    assert result.kind is FlushKind.REJECTED
    assert backend.calls == 2  # asked again on the memory as it is now
    failed = [logged.run for logged in m.runs.runs(ADA) if is_failed(logged.run)]
    assert [r.started_at for r in failed] == [BASE_TIME, m.now]  # the kept one is booked
    assert_each_call_booked_once(m, 2)


def test_a_discarded_probe_answer_is_not_applied_by_the_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """[A, poison]: the probe of A answers and is held; the poison probe's failed run is
    refused once (a dropped connection: the next write goes through). The held answer must
    not be recorded as discarded as the bisection ends, and then applied by the retry as its
    run: the call would be booked twice. It stays kept, and the retry applies it once."""
    events = notes(2, poison_at=1)
    m = InMemoryMemoryd()
    failed = [0]

    def the_second_failed(run: Any) -> bool:
        failed[0] += is_failed(run)
        return is_failed(run) and failed[0] == 2

    left = refuse(m, monkeypatch, "record_run", 1, the_second_failed)
    backend = Counting()
    flusher = m.flusher(backend)
    with pytest.raises(DatabaseRefused):
        flusher.flush(ADA, buffered(events), attempt=0)
    result = flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()
    assert left == [0]
    assert (result.kind, result.events) == (FlushKind.CONSOLIDATED, 1)
    assert backend.calls == calls_of_one_flush(events) == 3
    booked = [(e.run_id, e.units) for e in m.db.ledger.values() if e.operation == "llm"]
    runs = [(lg.run.run_id, lg.run.status, lg.run.usage.total) for lg in m.runs.runs(ADA)]
    assert len(booked) == backend.calls, (booked, runs)


def test_answers_kept_at_close_are_logged_unbooked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A flush whose write is refused keeps its answer; the processor then stops (shutdown
    during the outage): the call was paid and is never booked, which the log says."""
    events = notes(2, poison_at=99)
    m = InMemoryMemoryd()
    refuse(m, monkeypatch, "apply", 1)
    backend = Counting()
    flusher = m.flusher(backend)
    with pytest.raises(DatabaseRefused):
        flusher.flush(ADA, buffered(events), attempt=0)
    flusher.close()
    assert backend.calls == 1
    assert not list(m.runs.runs(ADA))
    assert any("not booked" in r.getMessage() for r in caplog.records), caplog.text


def test_an_answer_a_failed_write_discarded_is_charged_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write failing with an error of no database kind (a planning bug, an unmapped driver
    error): the answer is recorded as discarded, and the cost metrics count its call once."""
    m = InMemoryMemoryd()
    write = m.memory.apply
    failures = [1]

    def fails_once(*args: Any) -> Any:
        if failures[0]:
            failures[0] -= 1
            raise RuntimeError("a bug")
        return write(*args)

    monkeypatch.setattr(m.memory, "apply", fails_once)
    backend = Counting()
    flusher = m.flusher(backend)
    with pytest.raises(RuntimeError):
        flusher.flush(ADA, buffered(notes(2, poison_at=99)), attempt=0)
    flusher.close()
    assert backend.calls == 1
    charged = [r.run_id for r in m.observer.charged_runs if r.usage.total]
    assert len(charged) == 1
    assert_each_call_booked_once(m, 1)
