"""A recorded maintenance run made again to an image of the memory (a shadow replay's)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from domain.model import Fact, FactStatus, FactType, MemoryState, RunRecord
from processors.maintenance import (
    DuplicatePolicy,
    LifecyclePolicy,
    RuledChange,
    duplicate_changes,
    lifecycle_changes,
    maintenance_update,
)
from processors.recorded_maintenance import is_maintenance, recorded_changes, recorded_update
from tests.support.builders import make_fact
from tests.support.fakes import BagOfWordsEmbedder

NOW = datetime(2027, 6, 1, 12, 0, tzinfo=UTC)
STATE = MemoryState("ada", "org-a", working_memory="W", scaffold={"k": 1}, version=4)


def fact(content: str, age_days: float, **changes: object) -> Fact:
    return make_fact("ada", content, at=NOW - timedelta(days=age_days), **changes)


def recorded(job: str, changes: Sequence[RuledChange]) -> RunRecord:
    update = maintenance_update(job, STATE, changes, NOW, {"stale_after_days": 180})
    assert update is not None
    return update.run


def by_id(facts: Sequence[Fact]) -> dict[uuid.UUID, Fact]:
    return {f.fact_id: f for f in facts}


DUPLICATES = [
    fact("I work at Initech in Lisbon", 3, confidence=0.9, reinforce_count=2),
    fact("I work at Initech, in Lisbon", 2, confidence=0.7),
    fact("I prefer tea over coffee", 1),
]
AGING = [
    fact("I live in Lisbon", 400),  # never recalled: stale
    fact("Lunch with Bob today", 30, fact_type=FactType.EPISODIC),  # stale
    fact("I use Python", 200, status=FactStatus.STALE),  # stale long enough: archived
    fact("I like jazz", 10),  # untouched
]


def test_the_decisions_made_again_on_the_memory_they_were_made_on_are_the_run_itself() -> None:
    dedupe = duplicate_changes(DUPLICATES, NOW, BagOfWordsEmbedder(), DuplicatePolicy(0.9))
    lifecycle = lifecycle_changes(AGING, NOW, LifecyclePolicy())
    assert {c.rule.value for c in dedupe} == {"duplicate", "absorbed"}
    assert {c.rule.value for c in lifecycle} == {"never_recalled", "ephemeral", "stale_expired"}
    for job, changes, facts in (("dedupe", dedupe, DUPLICATES), ("lifecycle", lifecycle, AGING)):
        run = recorded(job, changes)
        assert is_maintenance(run)
        assert recorded_changes(run, by_id(facts)) == changes
        again = recorded_update(run, STATE, by_id(facts))
        assert again is not None
        assert again.run == run


def test_a_decision_about_a_fact_the_image_does_not_hold_as_it_was_is_left_out() -> None:
    lifecycle = recorded("lifecycle", lifecycle_changes(AGING, NOW, LifecyclePolicy()))
    lisbon, lunch, python, _ = AGING
    image = by_id([replace(lunch, status=FactStatus.ARCHIVED), replace(python, pinned=True)])
    assert recorded_changes(lifecycle, image) == []
    assert recorded_update(lifecycle, STATE, image) is None
    [left] = recorded_changes(lifecycle, by_id([lisbon]))
    assert (left.change.after.fact_id, left.change.after.status) == (
        lisbon.fact_id,
        FactStatus.STALE,
    )
    # A duplicate whose stronger fact the image lacks stays; so does a stronger one that
    # absorbs nothing there.
    dedupe = duplicate_changes(DUPLICATES, NOW, BagOfWordsEmbedder(), DuplicatePolicy(0.9))
    strong, weak, _ = DUPLICATES
    assert recorded_changes(recorded("dedupe", dedupe), by_id([weak])) == []
    assert recorded_changes(recorded("dedupe", dedupe), by_id([strong])) == []
