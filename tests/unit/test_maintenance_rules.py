"""The maintenance rules, as tables: lifecycle transitions, due dates, the duplicate sweep."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest

from domain.ids import MemoryKey, fact_id_for
from domain.model import (
    Fact,
    FactChangeKind,
    FactStatus,
    FactType,
    MemoryState,
    Provenance,
    RunStatus,
    SurfacePolicy,
)
from processors.maintenance import (
    DuplicatePolicy,
    LifecyclePolicy,
    Rule,
    due_date,
    duplicate_changes,
    lifecycle_changes,
    lifecycle_rule,
    maintenance_update,
)
from tests.support.fakes import BagOfWordsEmbedder

NOW = datetime(2027, 6, 1, 12, 0, tzinfo=UTC)
POLICY = LifecyclePolicy(
    stale_after=timedelta(days=180),
    archive_after=timedelta(days=90),
    ephemeral_stale_after=timedelta(days=14),
    open_loop_silent_after=timedelta(days=60),
    open_loop_grace=timedelta(days=1),
)


def days_ago(n: float) -> datetime:
    return NOW - timedelta(days=n)


def fact(
    content: str = "I work at Initech",
    kind: FactType = FactType.PROFILE,
    *,
    age: float = 1,
    status: FactStatus = FactStatus.ACTIVE,
    connection: str | None = None,
    events: tuple[int, ...] = (1,),
    **extra: Any,
) -> Fact:
    return Fact(
        fact_id=fact_id_for(MemoryKey("org-a", "ada"), content, connection),
        user_id="ada",
        organization_id="org-a",
        content=content,
        fact_type=kind,
        surface=SurfacePolicy.SPEAK,
        status=status,
        confidence=extra.pop("confidence", 0.8),
        salience=extra.pop("salience", 0.5),
        provenance=Provenance(
            context_type="fact",
            source="interactive",
            connection_id=connection,
            source_event_ids=tuple(uuid.UUID(int=e) for e in events),
        ),
        created_by_run=uuid.UUID(int=9),
        created_at=days_ago(age),
        updated_at=extra.pop("updated_at", days_ago(age)),
        **extra,
    )


# (case, fact, the rule expected at NOW)
LIFECYCLE_TABLE: list[tuple[str, Fact, Rule | None]] = [
    ("young fact", fact(age=10), None),
    ("old, never recalled", fact(age=181), Rule.NEVER_RECALLED),
    ("exactly at the age", fact(age=180), Rule.NEVER_RECALLED),
    ("old but recalled", fact(age=400, recall_count=3, last_recalled_at=days_ago(300)), None),
    ("old but reinforced lately", fact(age=400, last_reinforced_at=days_ago(20)), None),
    ("old and pinned", fact(age=400, pinned=True), None),
    ("held facts are left alone", fact(age=400, status=FactStatus.HELD), None),
    (
        "episodic, quiet 15 days",
        fact("Lunch with Bo today", FactType.EPISODIC, age=15),
        Rule.EPHEMERAL,
    ),
    (
        "episodic, recalled, quiet 15 days",
        fact("Lunch with Bo today", FactType.EPISODIC, age=15, recall_count=2),
        Rule.EPHEMERAL,
    ),
    (
        "episodic, reinforced 3 days ago",
        fact("Lunch with Bo", FactType.EPISODIC, age=30, last_reinforced_at=days_ago(3)),
        None,
    ),
    (
        "stale for 91 days",
        fact(age=400, status=FactStatus.STALE, updated_at=days_ago(91)),
        Rule.STALE_EXPIRED,
    ),
    ("stale for 30 days", fact(age=400, status=FactStatus.STALE, updated_at=days_ago(30)), None),
    (
        "stale and pinned",
        fact(age=400, status=FactStatus.STALE, pinned=True, updated_at=days_ago(200)),
        None,
    ),
    ("archived stays archived", fact(age=900, status=FactStatus.ARCHIVED), None),
    ("contradicted stays", fact(age=900, status=FactStatus.CONTRADICTED), None),
    (
        "open loop past its date",
        fact("Send the deck to Grace by May 20", FactType.OPEN_LOOP, age=30),
        Rule.LOOP_PAST_DUE,
    ),
    (
        "open loop due today is still open (grace)",
        fact("Send the deck to Grace by June 1", FactType.OPEN_LOOP, age=30),
        None,
    ),
    (
        "open loop with an ISO date passed",
        fact("Renew the passport before 2027-05-01", FactType.OPEN_LOOP, age=50),
        Rule.LOOP_PAST_DUE,
    ),
    (
        "open loop silent 61 days",
        fact("Call the plumber", FactType.OPEN_LOOP, age=61),
        Rule.LOOP_SILENT,
    ),
    (
        "open loop recalled lately is not silent",
        fact("Call the plumber", FactType.OPEN_LOOP, age=90, last_recalled_at=days_ago(5)),
        None,
    ),
    (
        "open loop due on the calendar's last day is open",
        fact("Keep the lease until 9999-12-31", FactType.OPEN_LOOP, age=30),
        None,
    ),
    (
        "open loop never recalled is not staled by age alone",
        fact("Call the plumber", FactType.OPEN_LOOP, age=59),
        None,
    ),
]


@pytest.mark.parametrize(
    ("fact_", "expected"),
    [(f, e) for _, f, e in LIFECYCLE_TABLE],
    ids=[c for c, _, _ in LIFECYCLE_TABLE],
)
def test_lifecycle_rule(fact_: Fact, expected: Rule | None) -> None:
    assert lifecycle_rule(fact_, NOW, POLICY) is expected


@pytest.mark.parametrize(
    ("rule", "status", "kind"),
    [
        (Rule.NEVER_RECALLED, FactStatus.STALE, FactChangeKind.EXPIRE),
        (Rule.EPHEMERAL, FactStatus.STALE, FactChangeKind.EXPIRE),
        (Rule.STALE_EXPIRED, FactStatus.ARCHIVED, FactChangeKind.ARCHIVE),
        (Rule.LOOP_PAST_DUE, FactStatus.ARCHIVED, FactChangeKind.CLOSE_LOOP),
        (Rule.LOOP_SILENT, FactStatus.ARCHIVED, FactChangeKind.CLOSE_LOOP),
    ],
)
def test_each_rule_moves_the_fact_out_of_its_own_reach(
    rule: Rule, status: FactStatus, kind: FactChangeKind
) -> None:
    facts = [f for _, f, e in LIFECYCLE_TABLE if e is rule]
    changes = lifecycle_changes(facts, NOW, POLICY)
    assert {c.rule for c in changes} == {rule}
    for c in changes:
        assert c.change.kind is kind
        assert c.change.after.status is status
        assert c.change.after.version == c.change.before.version + 1  # type: ignore[union-attr]
        assert c.change.after.updated_at == NOW
        assert c.change.after.indexed_at is None
    # The second pass over the result changes nothing (stale facts need archive_after first).
    assert lifecycle_changes([c.change.after for c in changes], NOW, POLICY) == []


DUE_TABLE = [
    ("ship by December 15", datetime(2026, 11, 1, tzinfo=UTC), "2026-12-15"),
    ("ship by January 10", datetime(2026, 11, 1, tzinfo=UTC), "2027-01-10"),
    ("ship by 10th of Jan 2026", datetime(2026, 11, 1, tzinfo=UTC), "2026-01-10"),
    ("renew before 2027-03-01", datetime(2026, 11, 1, tzinfo=UTC), "2027-03-01"),
    ("from Dec 1 to Dec 20", datetime(2026, 11, 1, tzinfo=UTC), "2026-12-20"),
    ("on Sept. 3rd, 2027", datetime(2026, 11, 1, tzinfo=UTC), "2027-09-03"),
    ("call Bo next Friday", datetime(2026, 11, 1, tzinfo=UTC), None),
    ("meet on February 30", datetime(2026, 11, 1, tzinfo=UTC), None),
    ("may I ask Grace", datetime(2026, 11, 1, tzinfo=UTC), None),
    # Case-insensitive matching must stay ASCII: "ı" and "ſ" fold to "i" and "s" in Unicode.
    ("call by Aprıl 5", datetime(2026, 11, 1, tzinfo=UTC), None),
    ("pay ſept 3", datetime(2026, 11, 1, tzinfo=UTC), None),
    ("keep until 9999-12-31", datetime(2026, 11, 1, tzinfo=UTC), "9999-12-31"),
]


@pytest.mark.parametrize(
    ("content", "written", "expected"), DUE_TABLE, ids=[c for c, _, _ in DUE_TABLE]
)
def test_due_date(content: str, written: datetime, expected: str | None) -> None:
    due = due_date(content, written)
    assert (None if due is None else due.date().isoformat()) == expected


@pytest.mark.parametrize("hours", [-8, 0, 9])
def test_a_due_date_does_not_depend_on_the_zone_a_time_is_read_in(hours: int) -> None:
    # Postgres hands timestamps back in its session's TimeZone. Written on the evening of
    # 2026-12-31 in UTC-8, already 2027 in UTC: "December 31" is the end of 2027 everywhere.
    written = datetime(2027, 1, 1, 2, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=hours)))
    assert due_date("renew by December 31", written) == datetime.combine(
        date(2027, 12, 31), time.max, tzinfo=UTC
    )
    loop = replace(fact("Renew the lease by December 31", FactType.OPEN_LOOP), created_at=written)
    assert lifecycle_rule(loop, datetime(2027, 1, 3, tzinfo=UTC), POLICY) is None


def test_duplicates_merge_into_the_stronger_fact_and_keep_its_provenance() -> None:
    strong = fact("I work at Initech in Lisbon", confidence=0.9, events=(1,), reinforce_count=2)
    weak = fact("I work at Initech, in Lisbon", confidence=0.7, events=(2, 3))
    other = fact("I prefer tea over coffee", events=(4,))
    scoped = fact("I work at Initech in Lisbon", connection="mail", events=(5,))
    changes = duplicate_changes(
        [weak, strong, other, scoped], NOW, BagOfWordsEmbedder(), DuplicatePolicy(threshold=0.9)
    )
    by_rule = {c.rule: c.change for c in changes}
    assert set(by_rule) == {Rule.DUPLICATE, Rule.ABSORBED}
    superseded, absorbing = by_rule[Rule.DUPLICATE].after, by_rule[Rule.ABSORBED].after
    assert superseded.fact_id == weak.fact_id
    assert superseded.status is FactStatus.ARCHIVED
    assert superseded.superseded_by == strong.fact_id
    assert superseded.provenance.source_event_ids == weak.provenance.source_event_ids
    assert absorbing.fact_id == strong.fact_id
    assert absorbing.status is FactStatus.ACTIVE
    assert absorbing.provenance.source_event_ids == tuple(uuid.UUID(int=i) for i in (1, 2, 3))
    assert absorbing.reinforce_count == 3
    # The connection-scoped twin is in another scope: never merged with the global fact.
    assert scoped.fact_id not in {c.change.after.fact_id for c in changes}
    # Second sweep over the result: nothing left to merge.
    after = {f.fact_id: f for f in (weak, strong, other, scoped)}
    after |= {c.change.after.fact_id: c.change.after for c in changes}
    assert (
        duplicate_changes(list(after.values()), NOW, BagOfWordsEmbedder(), DuplicatePolicy(0.9))
        == []
    )


def test_a_pinned_duplicate_is_never_superseded_nor_changed() -> None:
    pinned = fact("I work at Initech in Lisbon", pinned=True, confidence=0.5)
    loud = fact("I work at Initech, in Lisbon", confidence=0.99)
    changes = duplicate_changes([pinned, loud], NOW, BagOfWordsEmbedder(), DuplicatePolicy(0.9))
    assert [(c.rule, c.change.after.fact_id) for c in changes] == [(Rule.DUPLICATE, loud.fact_id)]
    assert changes[0].change.after.superseded_by == pinned.fact_id


def test_the_run_of_a_maintenance_job_folds_like_a_consolidation_run() -> None:
    state = MemoryState("ada", "org-a", working_memory="W", scaffold={"k": 1}, version=7)
    changes = lifecycle_changes([fact(age=400)], NOW, POLICY)
    update = maintenance_update("lifecycle", state, changes, NOW, {"stale_after_days": 180})
    assert update is not None
    run = update.run
    assert (run.base_version, update.state.version) == (7, 8)
    assert run.status is RunStatus.SUCCEEDED
    assert run.input_event_ids == ()
    assert run.output is not None
    assert run.output["applied"]["version"] == 8
    assert run.output["applied"]["working_memory"] == "W"
    assert run.output["maintenance"]["rules"][0]["rule"] == "never_recalled"
    again = maintenance_update("lifecycle", state, changes, NOW, {})
    assert again is not None
    assert again.run.run_id == run.run_id  # a retry is the same run
    assert maintenance_update("lifecycle", state, [], NOW, {}) is None
    assert replace(state, version=8) == replace(update.state, updated_at=None)
