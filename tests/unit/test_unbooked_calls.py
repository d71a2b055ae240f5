"""A call answered and then given up without a run is in no ledger: one error line says so,
in the same words whichever path gave it up, with its tokens, its memory and why."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime

import pytest

from consumers.kept_answers import KeptAnswer, KeptAnswers
from consumers.unapplied_runs import UnappliedRuns
from domain.model import MemoryState, TokenUsage
from processors.cost import PriceTable
from processors.schema import ConsolidationRequest
from store.errors import StoreError
from tests.support.builders import BASE_TIME, key_of, make_event
from tests.support.fakes import FlakyBackend
from tests.support.inmemory import InMemoryMemoryd

USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)


def answer(user: str) -> KeptAnswer:
    request = ConsolidationRequest.build(
        MemoryState.empty(key_of(user)), (), [make_event(user, "I live in Lisbon")], BASE_TIME
    )
    response = replace(FlakyBackend().consolidate(request), usage=USAGE)
    return KeptAnswer(request, response, duration_ms=120, degraded=None, generation=None)


def unbooked_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str, str]]:
    return [
        (r.levelno, r.getMessage(), r.__dict__["user_id"])
        for r in caplog.records
        if "not booked" in r.getMessage()
    ]


def test_a_kept_answer_evicted_unbooked_says_so(caplog: pytest.LogCaptureFixture) -> None:
    kept = KeptAnswers(limit=1)
    with caplog.at_level(logging.ERROR):
        for user in ("ada", "bob"):  # two flushes refused: Ada's answer makes room for Bob's
            kept.begin(key_of(user), None)
            kept.made(answer(user))
            kept.keep(key_of(user))
    assert unbooked_lines(caplog) == [
        (logging.ERROR, "a call's 340 token(s) are not booked: too many answers kept", "ada")
    ]


def test_a_discarded_run_the_store_failed_to_record_says_so_alike(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = InMemoryMemoryd()

    def unreachable(_run_id: object, _started_at: datetime) -> bool:
        raise StoreError("connection lost")

    monkeypatch.setattr(m.memory, "run_applied", unreachable)
    runs = UnappliedRuns(m.memory, FlakyBackend(), PriceTable({}), m.observer)
    lost = answer("ada")
    with caplog.at_level(logging.ERROR):
        runs.discarded_unless_applied(lost.request, 0, BASE_TIME, lost.response, 120, "stale")
    assert unbooked_lines(caplog) == [
        (logging.ERROR, "a call's 340 token(s) are not booked: connection lost", "ada")
    ]


@pytest.mark.parametrize(
    ("forgotten", "why"),
    [
        (False, "its batch left this processor before the call was written"),
        (True, "some of its events were forgotten since the call"),
    ],
)
def test_a_kept_answer_not_taken_says_why_it_is_not_booked(
    caplog: pytest.LogCaptureFixture, forgotten: bool, why: str
) -> None:
    """An answer kept for a batch whose partitions left, met by the memory's next flush of
    other events, is not one an erasure forgot: the line must not send an operator after one."""
    kept, key, refused = KeptAnswers(), key_of("ada"), answer("ada")
    kept.begin(key, None)
    kept.made(refused)
    kept.keep(key)  # the write was refused; then the partition left
    (event_id,) = refused.request.event_ids
    batch = [event_id] if forgotten else [make_event("ada", "I moved to Porto").event_id]
    m = InMemoryMemoryd()
    kept.begin(key, None)
    with caplog.at_level(logging.ERROR):
        kept.settle(
            key, 1, batch, [], UnappliedRuns(m.memory, FlakyBackend(), PriceTable({}), m.observer)
        )
    assert unbooked_lines(caplog) == [
        (logging.ERROR, f"a call's 340 token(s) are not booked: {why}", "ada")
    ]
