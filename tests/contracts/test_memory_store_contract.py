"""The memory store contract (`MemoryStore`, `IndexOutbox`), run unchanged against the
in-memory store and Postgres; the last test holds the fold of the run log to the live tables."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from domain.ids import MemoryKey, ledger_entry_id_for
from domain.model import (
    MAX_LEARNED_INFO,
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FlushReads,
    LedgerEntry,
    MemoryUpdate,
    RunStatus,
)
from domain.ports import PendingBacklog
from processors.consolidate import Consolidator
from processors.cost import PriceTable
from processors.fold import fold_runs, live_image
from processors.gate import WriteGate
from processors.offline import OfflineBackend
from processors.schema import REQUEST_STATUSES, ConsolidationRequest
from store.candidate_ranking import CONSOLIDATION_STATUSES
from store.errors import (
    EventsAlreadyConsolidated,
    MemoryBusy,
    MemoryLockLost,
    StaleMemoryVersion,
    StoreError,
)
from tests.contracts.conftest import SUBJECTS, Stores
from tests.support.builders import (
    BASE_TIME,
    key_of,
    make_event,
    make_fact,
    seed,
    seed_update,
)

LATER = BASE_TIME + timedelta(hours=1)
ADA, BOB = key_of("ada"), key_of("bob")


def entry(update: MemoryUpdate, cost: int, detail: str = "") -> LedgerEntry:
    run = update.run
    return LedgerEntry(
        ledger_entry_id_for(run.run_id, "llm", detail),
        run.user_id,
        run.organization_id,
        run.run_id,
        "llm",
        "m",
        10,
        cost,
        BASE_TIME,
    )


def test_a_new_memory_is_empty(stores: Stores) -> None:
    state = stores.memory.load_state(ADA)
    assert (state.user_id, state.organization_id, state.version) == ("ada", "org-a", 0)
    assert (state.working_memory, dict(state.scaffold), state.learned_info) == ("", {}, ())
    assert stores.memory.facts(ADA) == []
    assert stores.memory.balance(ADA) is None
    assert stores.memory.already_consolidated(ADA, [uuid.uuid4()]) == frozenset()
    assert stores.runs.runs(ADA) == []


def test_apply_writes_the_whole_run(stores: Stores) -> None:
    berlin = make_fact("ada", "Ada lives in Berlin")
    held = make_fact("ada", "Ada may move to Oslo", status=FactStatus.HELD)
    update = seed_update(
        stores.memory,
        "ada",
        [berlin, held],
        working_memory="Ada is moving",
        learned_info=["prefers email"],
        connections={"mail": ("Acme pays in EUR",)},
    )
    update = replace(update, state=replace(update.state, scaffold={"Location": ["Berlin"]}))
    stores.memory.apply(update)

    state = stores.memory.load_state(ADA)
    assert (state.working_memory, state.version, state.learned_info) == (
        "Ada is moving",
        1,
        ("prefers email",),
    )
    assert dict(state.scaffold) == {"Location": ["Berlin"]}
    assert [f.content for f in stores.memory.facts(ADA)] == ["Ada lives in Berlin"]
    assert {f.content for f in stores.memory.facts(ADA, REQUEST_STATUSES)} == {
        "Ada lives in Berlin",
        "Ada may move to Oslo",
    }
    assert stores.memory.already_consolidated(ADA, update.consumed_event_ids) == frozenset(
        update.consumed_event_ids
    )
    assert [r.run.run_id for r in stores.runs.runs(ADA)] == [update.run.run_id]
    (mail,) = stores.memory.connections(ADA, ["mail", "calendar"])
    assert (mail.connection_id, mail.learned_info) == ("mail", ("Acme pays in EUR",))


def test_a_stale_or_repeated_run_writes_nothing(stores: Stores) -> None:
    first = seed(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    stale = seed_update(stores.memory, "ada", [make_fact("ada", "Ada likes tea")])
    stale = replace(stale, run=replace(stale.run, base_version=0))
    with pytest.raises(StaleMemoryVersion):
        stores.memory.apply(stale)
    again = seed_update(stores.memory, "ada", [make_fact("ada", "Ada likes tea")])
    again = replace(again, run=replace(again.run, input_event_ids=first.run.input_event_ids))
    with pytest.raises(EventsAlreadyConsolidated):
        stores.memory.apply(again)
    assert stores.memory.load_state(ADA).version == 1
    assert [f.content for f in stores.memory.facts(ADA)] == ["Ada lives in Berlin"]
    assert [r.run.run_id for r in stores.runs.runs(ADA)] == [first.run.run_id]


def test_the_same_user_id_in_two_organizations_is_two_memories(stores: Stores) -> None:
    theirs = key_of("ada", "org-b")
    ours_fact = make_fact("ada", "Ada lives in Berlin")
    their_fact = make_fact("ada", "Ada lives in Berlin", org="org-b")
    assert ours_fact.fact_id != their_fact.fact_id
    ours = seed(stores.memory, "ada", [ours_fact], working_memory="Ada of org-a")
    seed(stores.memory, "ada", [their_fact], org="org-b", working_memory="Ada of org-b")
    # The same event id, consumed by each memory once: one memory's id never blocks another's.
    again = seed_update(stores.memory, "ada", [], org="org-b")
    stores.memory.apply(
        replace(again, run=replace(again.run, input_event_ids=ours.run.input_event_ids))
    )
    assert stores.memory.load_state(ADA).working_memory == "Ada of org-a"
    assert stores.memory.load_state(theirs).working_memory == "Ada of org-b"
    assert stores.memory.load_state(theirs).version == 2
    assert [f.fact_id for f in stores.memory.facts(ADA)] == [ours_fact.fact_id]
    assert [f.organization_id for f in stores.memory.facts(theirs)] == ["org-b"]
    assert stores.memory.already_consolidated(ADA, ours.run.input_event_ids) == frozenset(
        ours.run.input_event_ids
    )
    stores.memory.set_credit(theirs, 10)
    assert stores.memory.balance(ADA) is None
    assert [r.run.organization_id for r in stores.runs.runs(theirs)] == ["org-b", "org-b"]


def test_a_run_that_writes_into_another_memory_is_refused(stores: Stores) -> None:
    update = seed_update(
        stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin", org="org-b")]
    )
    with pytest.raises(StoreError, match="writes into"):
        stores.memory.apply(update)
    assert stores.memory.load_state(ADA).version == 0
    assert stores.memory.facts(key_of("ada", "org-b")) == []


def test_an_erasures_cut_offs_are_found_by_the_memorys_digest(stores: Stores) -> None:
    assert stores.memory.forgotten_before(SUBJECTS(ADA)) == {}
    stores.cut(ADA, "events", 2, 17)
    assert stores.memory.forgotten_before(SUBJECTS(ADA)) == {("events", 2): 17}
    assert stores.memory.forgotten_before(SUBJECTS(key_of("ada", "org-b"))) == {}
    assert stores.memory.memory_erasure_open(ADA) is False


def test_a_flushs_reads_together_are_the_reads_one_by_one(stores: Stores) -> None:
    facts = [
        make_fact("ada", "Ada lives in Berlin"),
        make_fact("ada", "Ada may like jazz", status=FactStatus.HELD),
        make_fact("ada", "Ada lived in Rome", status=FactStatus.CONTRADICTED),
    ]
    first = seed(stores.memory, "ada", facts)
    stores.cut(ADA, "events", 2, 17)
    stores.memory.set_credit(ADA, 1_000)
    stores.open_erasure(BOB)
    consumed, unseen = first.run.input_event_ids[0], uuid.uuid4()

    def locked_reads(key: MemoryKey, subject: str, ids: list[uuid.UUID]) -> FlushReads:
        with stores.memory.locked_reads(key, subject, ids) as reads:
            return reads

    for key, subject in ((ADA, SUBJECTS(ADA)), (BOB, SUBJECTS(BOB)), (ADA, SUBJECTS(BOB))):
        reads = locked_reads(key, subject, [consumed, unseen])
        assert reads.erasure_open is stores.memory.memory_erasure_open(key)
        assert reads.cutoffs == stores.memory.forgotten_before(subject)
        assert reads.consumed == stores.memory.already_consolidated(key, [consumed, unseen])
        assert reads.state == stores.memory.load_state(key)
        assert reads.balance == stores.memory.balance(key)
        assert reads.known_facts == len(stores.memory.facts(key, CONSOLIDATION_STATUSES))
        stamp = stores.reads.memory_stamps([key]).get(key)
        assert reads.generation == (None if stamp is None else stamp.generation)
    reads = locked_reads(ADA, SUBJECTS(ADA), [consumed, unseen])
    assert reads.generation is not None  # a memory's first run gives it one
    assert (reads.erasure_open, dict(reads.cutoffs)) == (False, {("events", 2): 17})
    assert (reads.consumed, reads.state.version, reads.balance) == ({consumed}, 1, 1_000)
    assert reads.known_facts == 2  # the active and the held one
    assert locked_reads(BOB, SUBJECTS(BOB), []).erasure_open is True
    nobody = locked_reads(key_of("ada", "org-b"), "", [])
    assert (nobody.state.version, nobody.generation) == (0, None)


def test_a_flushs_reads_see_what_the_lock_holder_before_it_wrote(stores: Stores) -> None:
    """The reads go out with the lock request: they must run once it is granted, not before."""
    seed(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    holding = threading.Event()
    seen: list[int] = []

    def read_after() -> None:
        holding.wait(30)
        with stores.memory.locked_reads(ADA, SUBJECTS(ADA), []) as reads:
            seen.append(reads.state.version)

    reader = threading.Thread(target=read_after)
    reader.start()
    with stores.memory.memory_lock(ADA):
        holding.set()
        time.sleep(0.2)  # the reader's lock request and reads are waiting by now
        seed(stores.memory, "ada", [make_fact("ada", "Ada moved to Paris")])
        assert seen == []
    reader.join(timeout=30)
    assert seen == [2]


def test_a_failed_run_is_recorded_and_booked_once(stores: Stores) -> None:
    update = seed_update(stores.memory, "ada", [])
    failed = replace(update.run, status=RunStatus.FAILED, error="unparseable answer")
    entry = LedgerEntry(
        ledger_entry_id_for(failed.run_id, "llm"), "ada", failed.organization_id,
        failed.run_id, "llm", "gemini-2.5-flash", 1_290, 7, failed.started_at,
    )  # fmt: skip
    stores.memory.set_credit(ADA, 1_000)
    stores.memory.record_run(failed, [entry])
    stores.memory.record_run(failed, [entry])
    (logged,) = stores.runs.runs(ADA)
    assert (logged.run.status, logged.run.error) == (RunStatus.FAILED, "unparseable answer")
    assert stores.memory.load_state(ADA).version == 0  # a failed run changes no memory
    assert stores.memory.balance(ADA) == 993  # its call's cost, booked once


def test_a_run_applied_is_known_by_its_id_and_start(stores: Stores) -> None:
    update = seed_update(stores.memory, "ada", [])
    run = update.run
    assert not stores.memory.run_applied(run.run_id, run.started_at)
    stores.memory.apply(update)
    assert stores.memory.run_applied(run.run_id, run.started_at)
    # The same events planned again later (a retry's run) is another run.
    assert not stores.memory.run_applied(run.run_id, run.started_at + timedelta(seconds=1))
    failed = replace(run, run_id=uuid.uuid4(), status=RunStatus.FAILED)
    stores.memory.record_run(failed)
    assert not stores.memory.run_applied(failed.run_id, failed.started_at)


def _rewrite(stores: Stores, fact: Fact, kind: FactChangeKind, **changes: object) -> Fact:
    update = seed_update(stores.memory, fact.user_id, [], at=LATER)
    after = replace(fact, updated_at=LATER, **changes)  # type: ignore[arg-type]
    stores.memory.apply(replace(update, fact_changes=(FactChange(kind, after, fact),)))
    (stored,) = stores.memory.facts_by_id([fact.fact_id])
    return stored


def test_a_run_overwrites_what_it_owns_and_keeps_the_rest(stores: Stores) -> None:
    seed(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin", message_id="m1")])
    (first,) = stores.memory.facts(ADA)
    stored = _rewrite(
        stores,
        replace(first, created_by_run=uuid.uuid4(), recall_count=7),
        FactChangeKind.REINFORCE,
        confidence=0.123456789,
        reinforce_count=1,
        last_reinforced_at=LATER,
        provenance=replace(first.provenance, message_id=None),
    )
    assert (stored.confidence, stored.reinforce_count, stored.updated_at) == (
        0.12345679,  # a 32-bit real, as Postgres stores it
        1,
        LATER,
    )
    # Origin, creation and the read path's counters stay; every write counts in version.
    assert stored.created_by_run == first.created_by_run
    assert stored.created_at == first.created_at
    assert stored.recall_count == 0
    assert stored.provenance == first.provenance
    assert stored.version == first.version + 1


def test_a_run_never_changes_a_pinned_fact(stores: Stores) -> None:
    seed(stores.memory, "ada", [make_fact("ada", "Ada's daughter is Mia", pinned=True)])
    (pinned,) = stores.memory.facts(ADA)
    stored = _rewrite(stores, pinned, FactChangeKind.CONTRADICT, status=FactStatus.CONTRADICTED)
    assert stored == pinned


def test_connection_info_is_appended_run_after_run(stores: Stores) -> None:
    seed(stores.memory, "ada", [], connections={"mail": ("one",)})
    seed(stores.memory, "ada", [], connections={"mail": ("two",), "cal": ("three",)})
    found = stores.memory.connections(ADA, ["mail", "cal", "none"])
    assert [(c.connection_id, c.learned_info) for c in found] == [
        ("cal", ("three",)),
        ("mail", ("one", "two")),
    ]
    assert stores.memory.connections(ADA, []) == []


def test_a_connection_keeps_its_latest_learned_info(stores: Stores) -> None:
    lines = tuple(f"line {i}" for i in range(MAX_LEARNED_INFO + 50))
    seed(stores.memory, "ada", [], connections={"mail": lines[:150]})
    seed(stores.memory, "ada", [], connections={"mail": lines[150:]})
    (mail,) = stores.memory.connections(ADA, ["mail"])
    assert mail.learned_info == lines[-MAX_LEARNED_INFO:]


def test_credit_and_ledger(stores: Stores) -> None:
    update = seed_update(stores.memory, "ada", [])
    stores.memory.apply(replace(update, ledger=(entry(update, 300), entry(update, 300))))
    assert stores.memory.balance(ADA) is None  # no credit line: unlimited
    stores.memory.set_credit(ADA, 1_000)
    assert stores.memory.balance(ADA) == 700  # the same entry id is booked once
    stores.memory.set_credit(ADA, 200)
    assert stores.memory.balance(ADA) == -100


def test_the_index_outbox(stores: Stores) -> None:
    early = make_fact("ada", "Ada lives in Berlin")
    late = make_fact("ada", "Ada likes tea", at=LATER)
    seed(stores.memory, "ada", [late, early])
    seed(stores.memory, "bob", [make_fact("bob", "Bob likes chess")])
    # Three facts wait; the oldest change among them is the backlog's age.
    assert stores.memory.pending_backlog() == PendingBacklog(count=3, oldest=BASE_TIME)
    pending = stores.memory.pending_index(limit=2)
    assert [f.content for f in pending] == ["Ada lives in Berlin", "Bob likes chess"]

    asked: list[Sequence[Fact]] = []

    def ledger_for(marked: Sequence[Fact]) -> list[LedgerEntry]:
        asked.append(list(marked))
        return []

    stale = replace(pending[1], version=pending[1].version + 5)  # not the stored version
    marked = stores.memory.mark_indexed([pending[0], stale], LATER, ledger_for)
    assert [f.content for f in marked] == ["Ada lives in Berlin"]
    # Marked once: a second indexer racing over the same versions books nothing.
    assert stores.memory.mark_indexed([pending[0]], LATER, ledger_for) == []
    assert [len(a) for a in asked] == [1, 0]
    assert stores.memory.pending_backlog().count == 2
    (indexed,) = stores.memory.facts_by_id([pending[0].fact_id])
    assert indexed.indexed_at == LATER
    # A new version of an indexed fact is pending again.
    _rewrite(stores, indexed, FactChangeKind.UPDATE, salience=0.9)
    assert stores.memory.pending_backlog().count == 3


def test_the_outbox_can_leave_users_out_of_credit(stores: Stores) -> None:
    update = seed_update(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    stores.memory.apply(replace(update, ledger=(entry(update, 500),)))
    bob_at = BASE_TIME + timedelta(minutes=5)
    seed(stores.memory, "bob", [make_fact("bob", "Bob likes chess", at=bob_at)])
    stores.memory.set_credit(ADA, 500)
    assert len(stores.memory.pending_index()) == 2
    assert [f.user_id for f in stores.memory.pending_index(skip_out_of_credit=True)] == ["bob"]
    # The backlog counted as the drain sees it: Ada's fact is held, not waiting.
    assert stores.memory.pending_backlog() == PendingBacklog(count=2, oldest=BASE_TIME)
    held_back = stores.memory.pending_backlog(skip_out_of_credit=True)
    assert held_back == PendingBacklog(count=1, oldest=bob_at)
    stores.memory.set_credit(BOB, 0)
    # None waits.
    assert stores.memory.pending_backlog(skip_out_of_credit=True) == PendingBacklog(0, None)


def test_facts_by_id_ignores_unknown_ids(stores: Stores) -> None:
    fact = make_fact("ada", "Ada lives in Berlin")
    seed(stores.memory, "ada", [fact])
    found = stores.memory.facts_by_id([fact.fact_id, uuid.uuid4(), fact.fact_id])
    assert [f.fact_id for f in found] == [fact.fact_id]
    assert stores.memory.facts_by_id([]) == []


def test_the_memory_lock_lets_one_holder_in_at_a_time(stores: Stores) -> None:
    inside = 0
    most = 0
    guard = threading.Lock()

    def hold(reading: bool) -> None:
        nonlocal inside, most
        lock = (
            stores.memory.locked_reads(ADA, "", []) if reading else stores.memory.memory_lock(ADA)
        )
        with lock:
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.05)
            with guard:
                inside -= 1

    # A flush's locked reads and an erasure's bare lock exclude each other alike.
    threads = [threading.Thread(target=hold, args=(i % 2 == 1,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert most == 1


def test_locked_reads_that_may_not_wait_refuse_a_held_memory_and_leave_it_unlocked(
    stores: Stores,
) -> None:
    seed(stores.memory, "ada", [make_fact("ada", "Ada lives in Berlin")])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with stores.memory.memory_lock(ADA):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        with pytest.raises(MemoryBusy), stores.memory.locked_reads(ADA, "", [], wait=False):
            pass
        # Another memory's lock is free, and so is the same user id in another organization.
        with stores.memory.locked_reads(BOB, "", [], wait=False) as reads:
            assert reads.state.version == 0
        with stores.memory.locked_reads(key_of("ada", "org-b"), "", [], wait=False) as reads:
            assert reads.state.version == 0
    finally:
        release.set()
        holder.join(timeout=30)
    with stores.memory.locked_reads(ADA, SUBJECTS(ADA), [], wait=False) as reads:
        assert reads.state.version == 1
    # The refused try left nothing held: a waiting lock is granted at once.
    done = threading.Event()

    def lock_again() -> None:
        with stores.memory.memory_lock(ADA):
            done.set()

    again = threading.Thread(target=lock_again)
    again.start()
    again.join(timeout=30)
    assert done.is_set()


def test_a_bounded_wait_for_a_held_memory_gives_up_in_time_holding_nothing(
    stores: Stores,
) -> None:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with stores.memory.memory_lock(ADA):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        with pytest.raises(MemoryBusy), stores.memory.memory_lock(ADA, wait_s=0.3):
            pytest.fail("the memory's lock was granted while another held it")
        assert 0.25 <= time.monotonic() - started < 5
        with stores.memory.memory_lock(BOB, wait_s=0.3):
            pass  # another memory's lock is free
    finally:
        release.set()
        holder.join(timeout=30)
    # Given up, it holds nothing: another bounded wait gets the lock at once.
    with stores.memory.memory_lock(ADA, wait_s=0.3):
        pass


def test_the_memory_lock_checks_out_as_held_until_its_block_ends(stores: Stores) -> None:
    with stores.memory.memory_lock(ADA) as held:
        held.check()
        held.check()  # as often as its holder asks
    # Given back, it is not the holder's any more: a step it fences must not run.
    with pytest.raises(MemoryLockLost):
        held.check()


def test_folding_the_run_log_gives_the_live_tables(stores: Stores) -> None:
    """The store's upsert and the fold's merge_fact follow one rule (domain.upsert)."""
    consolidator = Consolidator(WriteGate(None), PriceTable({}))
    backend = OfflineBackend()
    batches = [
        [make_event("ada", "I live in Berlin"), make_event("ada", "I like green tea")],
        [make_event("ada", "I live in Berlin", minutes=5)],  # reinforces the first fact
        [make_event("ada", "Actually I moved to Lisbon", minutes=9)],
    ]
    for events in batches:
        state = stores.memory.load_state(ADA)
        active = tuple(stores.memory.facts(ADA, REQUEST_STATUSES))
        request = ConsolidationRequest.build(state, active, events, events[-1].occurred_at)
        update = consolidator.plan(
            request,
            backend.consolidate(request),
            run_id=uuid.uuid4(),
            backend=backend.name,
            prompt_version=backend.prompt_version,
            started_at=request.now,
            duration_ms=1,
        )
        stores.memory.apply(update)

    folded = fold_runs(stores.runs.runs(ADA))
    live = live_image(
        stores.memory.load_state(ADA), stores.memory.facts(ADA, tuple(FactStatus)), []
    )
    assert folded.version == live.version == 3
    assert any(f.reinforce_count for f in live.facts.values())
    assert folded.facts.keys() == live.facts.keys()
    for fact_id, fact in live.facts.items():
        assert replace(folded.facts[fact_id], indexed_at=None) == replace(fact, indexed_at=None)
    assert folded.state() == replace(live.state(), updated_at=folded.updated_at)
