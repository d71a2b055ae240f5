"""Fact lifecycle operations of one run: what each op does, to which facts, with what history."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain.ids import MemoryKey, fact_id_for
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FactType,
    GateCounts,
)
from processors.gate import WriteGate
from processors.lifecycle import REINFORCE_CONFIDENCE_STEP, FactLedger
from processors.maintenance import LifecyclePolicy, lifecycle_rule
from processors.schema import FactOp, FactProposal, Observation
from producers.contract import ContextEvent, EventType, Source, SourceMetadata
from tests.support.builders import make_fact

EARLIER = datetime(2026, 11, 1, tzinfo=UTC)
NOW = datetime(2026, 11, 2, tzinfo=UTC)
RUN = uuid.UUID(int=7)
EVENT = ContextEvent(
    event_id=uuid.UUID(int=42),
    user_id="ada",
    organization_id="org-a",
    event_type=EventType.FACT,
    content="I moved to the design team",
    source_metadata=SourceMetadata(source=Source.INTERACTIVE, message_id="m-1"),
    occurred_at=NOW,
)


def fact(
    content: str,
    kind: FactType = FactType.PROFILE,
    *,
    status: FactStatus = FactStatus.ACTIVE,
    pinned: bool = False,
    **extra: Any,
) -> Fact:
    return make_fact(
        "ada",
        content,
        at=EARLIER,
        fact_type=kind,
        status=status,
        pinned=pinned,
        confidence=0.8,
        source_event_ids=(uuid.UUID(int=1),),
        indexed_at=EARLIER,
        **extra,
    )


def ledger(*active: Fact, unshown: tuple[Fact, ...] = ()) -> FactLedger:
    return FactLedger(
        key=MemoryKey("org-a", "ada"),
        run_id=RUN,
        now=NOW,
        active=active,
        observations=[Observation("E1", EVENT)],
        gate=WriteGate(None),
        unshown=unshown,
    )


def propose(op: FactOp, content: str, target: Fact | None = None, **extra: Any) -> FactProposal:
    return FactProposal(
        op=op,
        content=content,
        target_fact_id=None if target is None else str(target.fact_id),
        evidence=["E1"],
        **{"confidence": 0.9, "salience": 0.6, **extra},
    )


def by_id(changes: tuple[FactChange, ...]) -> dict[uuid.UUID, FactChange]:
    return {c.after.fact_id: c for c in changes}


ENGINEERING = fact("The user works in engineering.")
LOOP = fact("The user must send the Q3 report by Friday.", FactType.OPEN_LOOP)
PINNED = fact("The user is allergic to peanuts.", pinned=True)


def test_add_creates_a_fact_with_provenance_and_no_history() -> None:
    run = ledger()
    run.apply(propose(FactOp.ADD, "The user works in design."))
    [change] = run.changes()
    assert (change.kind, change.before) == (FactChangeKind.ADD, None)
    new = change.after
    assert new.fact_id == fact_id_for(MemoryKey("org-a", "ada"), "The user works in design.", None)
    assert (new.status, new.created_by_run, new.created_at) == (FactStatus.ACTIVE, RUN, NOW)
    assert new.provenance.source_event_ids == (EVENT.event_id,)
    assert new.provenance.message_id == "m-1"
    assert run.counts() == GateCounts(allowed=1)


def test_a_doubtful_add_is_held() -> None:
    run = ledger()
    run.apply(propose(FactOp.ADD, "The user may work in design.", confidence=0.5))
    [change] = run.changes()
    assert change.after.status is FactStatus.HELD
    assert run.counts() == GateCounts(held=1)


def test_update_changes_the_fact_in_place_and_keeps_what_it_was() -> None:
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.UPDATE, "The user works in platform engineering.", ENGINEERING))
    run.apply(propose(FactOp.UPDATE, "The user leads platform engineering.", ENGINEERING))
    [change] = run.changes()
    assert change.kind is FactChangeKind.UPDATE
    assert change.before == ENGINEERING  # the state before the run, not after the first op
    after = change.after
    assert after.fact_id == ENGINEERING.fact_id
    assert after.content == "The user leads platform engineering."
    assert (after.version, after.indexed_at, after.updated_at) == (3, None, NOW)
    assert after.provenance.source_event_ids == (uuid.UUID(int=1), EVENT.event_id)


def test_reinforce_counts_and_firms_up_a_fact() -> None:
    held = fact("The user likes jazz.", status=FactStatus.HELD)
    run = ledger(ENGINEERING, held)
    run.apply(propose(FactOp.REINFORCE, "Works in engineering", ENGINEERING, confidence=0.5))
    run.apply(propose(FactOp.REINFORCE, "Likes jazz", held))
    changes = by_id(run.changes())
    eng = changes[ENGINEERING.fact_id]
    assert eng.kind is FactChangeKind.REINFORCE
    assert (eng.after.reinforce_count, eng.after.last_reinforced_at) == (1, NOW)
    assert eng.after.confidence == pytest.approx(0.8 + REINFORCE_CONFIDENCE_STEP)
    assert eng.after.content == ENGINEERING.content
    # A held fact observed again has earned its place.
    assert changes[held.fact_id].after.status is FactStatus.ACTIVE


def test_contradict_supersedes_the_target_with_the_new_fact() -> None:
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.CONTRADICT, "The user works in design.", ENGINEERING))
    changes = by_id(run.changes())
    new_id = fact_id_for(MemoryKey("org-a", "ada"), "The user works in design.", None)
    assert set(changes) == {ENGINEERING.fact_id, new_id}
    new, old = changes[new_id], changes[ENGINEERING.fact_id]
    assert (new.kind, new.before, new.after.status) == (
        FactChangeKind.CONTRADICT,
        None,
        FactStatus.ACTIVE,
    )
    assert old.kind is FactChangeKind.CONTRADICT
    assert old.before == ENGINEERING
    assert (old.after.status, old.after.superseded_by) == (FactStatus.CONTRADICTED, new_id)
    assert old.after.version == ENGINEERING.version + 1


def test_a_doubtful_contradiction_is_held_and_supersedes_nothing() -> None:
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.CONTRADICT, "The user might work in design.", ENGINEERING,
                      confidence=0.5))  # fmt: skip
    [change] = run.changes()
    assert change.after.status is FactStatus.HELD
    assert change.after.fact_id != ENGINEERING.fact_id


def test_a_doubtful_update_is_held_beside_the_fact_it_would_rewrite() -> None:
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.UPDATE, "The user might lead design.", ENGINEERING, confidence=0.5))
    [change] = run.changes()
    assert change.after.status is FactStatus.HELD
    assert change.after.fact_id != ENGINEERING.fact_id
    assert change.after.content == "The user might lead design."
    assert run.counts() == GateCounts(held=1)
    assert run.decisions[-1].verdict == "hold"


def test_a_contradiction_that_repeats_another_fact_reinforces_that_one() -> None:
    design = fact("The user works in design.")
    run = ledger(ENGINEERING, design)
    run.apply(propose(FactOp.CONTRADICT, "the user WORKS in design", ENGINEERING))
    changes = by_id(run.changes())
    assert changes[design.fact_id].after.reinforce_count == 1
    assert changes[ENGINEERING.fact_id].after.superseded_by == design.fact_id


BERLIN = "The user lives in Berlin."
PARIS = "The user lives in Paris."


@pytest.mark.parametrize("op", [FactOp.CONTRADICT, FactOp.ADD])
def test_going_back_to_what_an_updated_fact_said_rewrites_it(op: FactOp) -> None:
    # Updated in place from Berlin to Paris, the fact keeps the id of its first content.
    moved = replace(fact(BERLIN), content=PARIS, version=2)
    run = ledger(moved)
    run.apply(propose(op, BERLIN, moved if op is FactOp.CONTRADICT else None))
    [change] = run.changes()
    assert (change.kind, change.before) == (FactChangeKind.UPDATE, moved)
    after = change.after
    assert (after.fact_id, after.content) == (moved.fact_id, BERLIN)
    assert after.status is FactStatus.ACTIVE
    assert (after.reinforce_count, after.version, after.indexed_at) == (0, 3, None)
    assert run.counts() == GateCounts(allowed=1)


def test_the_same_content_with_other_case_and_spacing_reinforces() -> None:
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.ADD, "the user  WORKS in engineering."))
    [change] = run.changes()
    assert change.kind is FactChangeKind.REINFORCE
    assert change.after.content == ENGINEERING.content


def test_a_doubtful_return_to_an_updated_facts_first_content_changes_nothing() -> None:
    moved = replace(fact(BERLIN), content=PARIS, version=2)
    run = ledger(moved)
    run.apply(propose(FactOp.CONTRADICT, BERLIN, moved, confidence=0.5))
    assert run.changes() == ()
    assert run.decisions[-1].verdict == "discard"


def test_close_loop_archives_an_open_loop() -> None:
    run = ledger(LOOP)
    run.apply(propose(FactOp.CLOSE_LOOP, "The Q3 report was sent.", LOOP))
    [change] = run.changes()
    assert (change.kind, change.before) == (FactChangeKind.CLOSE_LOOP, LOOP)
    assert change.after.status is FactStatus.ARCHIVED


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (ENGINEERING, "not an open loop"),
        (fact("Unknown loop", FactType.OPEN_LOOP), "not an active fact"),  # not in the ledger
    ],
)
def test_close_loop_only_closes_an_active_open_loop(target: Fact, reason: str) -> None:
    run = ledger(ENGINEERING, LOOP)
    run.apply(propose(FactOp.CLOSE_LOOP, "Done with it.", target))
    assert run.changes() == ()
    assert reason in run.decisions[-1].reason
    assert run.counts() == GateCounts(discarded=1)


@pytest.mark.parametrize(
    "op", [FactOp.UPDATE, FactOp.CONTRADICT, FactOp.REINFORCE, FactOp.CLOSE_LOOP]
)
def test_a_pinned_fact_is_never_changed(op: FactOp) -> None:
    pinned_loop = replace(LOOP, pinned=True)
    run = ledger(PINNED, pinned_loop)
    target = pinned_loop if op is FactOp.CLOSE_LOOP else PINNED
    run.apply(propose(op, "The user is no longer allergic to peanuts.", target))
    changed = by_id(run.changes())
    assert PINNED.fact_id not in changed
    assert pinned_loop.fact_id not in changed
    # A competing statement is kept, held, for a human to look at; a reinforce is dropped.
    if op is FactOp.REINFORCE:
        assert changed == {}
    else:
        [competing] = changed.values()
        assert competing.after.status is FactStatus.HELD


@pytest.mark.parametrize(
    "content", ["The user is allergic to peanuts.", "the user is ALLERGIC to peanuts"]
)
def test_repeating_a_pinned_fact_changes_nothing(content: str) -> None:
    run = ledger(PINNED)
    run.apply(propose(FactOp.ADD, content))
    assert run.changes() == ()
    assert run.decisions[-1].verdict == "discard"


def test_a_target_that_is_not_active_is_read_as_an_add() -> None:
    contradicted = fact("The user works in sales.", status=FactStatus.CONTRADICTED)
    run = ledger(ENGINEERING)
    run.apply(propose(FactOp.UPDATE, "The user works in marketing.", contradicted))
    run.apply(FactProposal(op=FactOp.UPDATE, content="The user owns a boat.",
                           target_fact_id="not-a-uuid"))  # fmt: skip
    kinds = {c.after.content: c.kind for c in run.changes()}
    assert kinds == {
        "The user works in marketing.": FactChangeKind.ADD,
        "The user owns a boat.": FactChangeKind.ADD,
    }


def test_every_proposal_leaves_a_decision() -> None:
    run = ledger(ENGINEERING)
    for p in [
        propose(FactOp.ADD, "tiny"),
        propose(FactOp.ADD, "The user is based in Lisbon."),
        propose(FactOp.ADD, "The user works in engineering"),
        propose(FactOp.ADD, "The user maybe likes tea.", confidence=0.45),
    ]:
        run.apply(p)
    assert [d.verdict for d in run.decisions] == ["discard", "allow", "reinforce", "hold"]
    assert run.counts() == GateCounts(allowed=1, held=1, discarded=1, reinforced=1)


DESIGN = "The user works in design."


def test_a_stored_fact_stated_again_goes_on_with_its_evidence_and_counters() -> None:
    # Contradicted earlier and not shown to this run: its row continues, not written over.
    stored = fact(
        DESIGN,
        status=FactStatus.CONTRADICTED,
        superseded_by=ENGINEERING.fact_id,
        reinforce_count=3,
        last_reinforced_at=EARLIER,
        version=4,
    )
    run = ledger(ENGINEERING, unshown=(stored,))
    proposal = propose(FactOp.CONTRADICT, DESIGN, ENGINEERING)
    assert run.derived_id(proposal) == stored.fact_id
    run.apply(proposal)
    change = by_id(run.changes())[stored.fact_id]
    assert (change.kind, change.before) == (FactChangeKind.CONTRADICT, stored)
    again = change.after
    assert (again.status, again.superseded_by) == (FactStatus.ACTIVE, None)
    assert again.provenance.source_event_ids == (uuid.UUID(int=1), EVENT.event_id)
    assert (again.reinforce_count, again.last_reinforced_at) == (4, NOW)  # ages from now
    assert (again.created_at, again.created_by_run) == (stored.created_at, stored.created_by_run)
    assert (again.version, again.indexed_at, again.observed_at) == (5, None, NOW)
    assert again.confidence == 0.9
    assert by_id(run.changes())[ENGINEERING.fact_id].after.superseded_by == stored.fact_id


def test_an_active_fact_the_run_was_not_shown_is_reinforced_when_stated_again() -> None:
    stored = fact(DESIGN, reinforce_count=1)
    run = ledger(unshown=(stored,))
    run.apply(propose(FactOp.ADD, DESIGN))
    [change] = run.changes()
    assert (change.kind, change.before) == (FactChangeKind.REINFORCE, stored)
    assert change.after.reinforce_count == 2
    assert change.after.provenance.source_event_ids == (uuid.UUID(int=1), EVENT.event_id)
    assert run.counts() == GateCounts(reinforced=1)


def test_a_merged_duplicate_stated_again_counts_afresh() -> None:
    # The sweep gave its reinforcements to the fact it was merged into.
    stored = fact(
        DESIGN, status=FactStatus.ARCHIVED, superseded_by=ENGINEERING.fact_id, reinforce_count=3
    )
    run = ledger(unshown=(stored,))
    run.apply(propose(FactOp.ADD, DESIGN))
    [change] = run.changes()
    assert (change.kind, change.before) == (FactChangeKind.ADD, stored)
    again = change.after
    assert (again.status, again.superseded_by) == (FactStatus.ACTIVE, None)
    assert (again.reinforce_count, again.last_reinforced_at) == (0, NOW)
    assert again.provenance.source_event_ids == (uuid.UUID(int=1), EVENT.event_id)


def test_a_stale_fact_stated_again_is_not_aged_out_by_its_old_evidence() -> None:
    long_ago = EARLIER - timedelta(days=400)
    stored = replace(fact(DESIGN, status=FactStatus.STALE), created_at=long_ago)
    run = ledger(unshown=(stored,))
    run.apply(propose(FactOp.ADD, DESIGN))
    [change] = run.changes()
    assert change.after.status is FactStatus.ACTIVE
    assert lifecycle_rule(change.after, NOW + timedelta(days=1), LifecyclePolicy()) is None
    assert lifecycle_rule(replace(change.after, last_reinforced_at=None), NOW, LifecyclePolicy())


def observed(label: str, n: int, connection: str | None) -> Observation:
    meta = SourceMetadata(source=Source.TOOL, connection_id=connection, message_id=f"m-{n}")
    event = EVENT.model_copy(update={"event_id": uuid.UUID(int=n), "source_metadata": meta})
    return Observation(label, event)


MIXED = [
    observed("E1", 1, None),
    observed("E2", 2, "mail"),
    observed("E3", 3, "crm"),
    observed("E4", 4, "crm"),
]


@pytest.mark.parametrize(
    ("evidence", "connection"),
    [
        (["E1"], None),
        (["E1", "E2"], "mail"),  # learned partly inside mail: shown only with mail
        (["E2", "E1"], "mail"),  # whatever the order the backend listed it in
        (["E2", "E3", "E4"], "crm"),  # most of the evidence
        (["E4", "E2", "E3"], "crm"),
        (["E2", "E3"], "crm"),  # a tie: by name
        (["E3", "E2", "E1"], "crm"),
    ],
)
def test_a_facts_connection_does_not_depend_on_the_order_of_its_evidence(
    evidence: list[str], connection: str | None
) -> None:
    run = FactLedger(
        key=MemoryKey("org-a", "ada"),
        run_id=RUN,
        now=NOW,
        active=(),
        observations=MIXED,
        gate=WriteGate(None),
    )
    content = "The user renews the Acme contract in May."
    run.apply(propose(FactOp.ADD, content).model_copy(update={"evidence": evidence}))
    [change] = run.changes()
    assert change.after.provenance.connection_id == connection
    assert change.after.fact_id == fact_id_for(MemoryKey("org-a", "ada"), content, connection)
    by_event = {o.label: o.event.source_metadata for o in MIXED}
    source = next(by_event[e] for e in evidence if by_event[e].connection_id == connection)
    assert change.after.provenance.message_id == source.message_id
    assert set(change.after.provenance.source_event_ids) == {
        uuid.UUID(int=int(e[1:])) for e in evidence
    }


@pytest.mark.parametrize(
    ("known_in", "said_in", "reinforced"),
    [
        ("mail", None, False),  # a chat statement is not folded into mail's knowledge
        ("mail", "crm", False),  # nor one connection's into another's
        ("mail", "mail", True),
        (None, "mail", True),  # what every turn knows already covers a connection's
        (None, None, True),
    ],
)
def test_a_duplicate_reinforces_only_a_fact_shown_wherever_the_statement_would_be(
    known_in: str | None, said_in: str | None, reinforced: bool
) -> None:
    content = "The user renews the Acme contract in May."
    known = make_fact("ada", content, connection_id=known_in, at=EARLIER)
    run = FactLedger(
        key=MemoryKey("org-a", "ada"),
        run_id=RUN,
        now=NOW,
        active=(known,),
        observations=[observed("E1", 1, said_in)],
        gate=WriteGate(None),
    )
    run.apply(propose(FactOp.ADD, content + " ").model_copy(update={"evidence": ["E1"]}))
    [change] = run.changes()
    if reinforced:
        assert change.after.fact_id == known.fact_id
        assert change.after.reinforce_count == known.reinforce_count + 1
    else:
        assert change.kind is FactChangeKind.ADD
        assert change.after.provenance.connection_id == said_in
        assert known.fact_id != change.after.fact_id


def test_a_contradiction_naming_a_pinned_fact_the_run_was_not_shown_supersedes_with_it() -> None:
    # The correction says what a pinned fact already says: the target gives way to that fact,
    # which stays as the user pinned it.
    pinned = fact(DESIGN, pinned=True)
    run = ledger(ENGINEERING, unshown=(pinned,))
    run.apply(propose(FactOp.CONTRADICT, DESIGN, ENGINEERING))
    changed = by_id(run.changes())
    assert pinned.fact_id not in changed
    assert changed[ENGINEERING.fact_id].after.superseded_by == pinned.fact_id
    assert changed[ENGINEERING.fact_id].after.status is FactStatus.CONTRADICTED
