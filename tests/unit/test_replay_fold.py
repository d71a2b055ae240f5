"""The fold of the run log, memory at a time, shadow batching and the memory diff: pure logic."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from consumers.batch_retry import BatchRetry
from consumers.replay import (
    ShadowBatch,
    batches_by_size,
    batches_like_live,
    shadow_consolidate,
)
from consumers.replay_result import ShadowResult
from domain.model import (
    MAX_LEARNED_INFO,
    Fact,
    FactChangeKind,
    FactStatus,
    FactType,
    LoggedRun,
    Provenance,
    RunStatus,
)
from domain.retry import Backoff
from domain.upsert import merge_fact
from processors.consolidate import Consolidator
from processors.cost import PriceTable
from processors.diff import VERIFY_FIELDS, diff_memory
from processors.errors import BackendError, TransientBackendError
from processors.fold import FoldedMemory, FoldError, fold_runs, runs_until
from processors.gate import WriteGate
from processors.offline import OfflineBackend
from processors.retraction import RetractingConsolidator, RetractionAwareBackend
from producers.contract import ContextEvent, EventType, FactRetraction
from tests.support.builders import key_of, make_event, make_fact, make_run
from tests.support.fakes import BagOfWordsEmbedder, FlakyBackend

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
USER = "ada"


def fact(content: str, at: datetime = T0, **changes: Any) -> Fact:
    return make_fact(
        USER,
        content,
        at=at,
        confidence=0.85,
        salience=0.7,
        created_by_run=uuid.uuid5(uuid.NAMESPACE_OID, f"run-{at.isoformat()}"),
        **changes,
    )


def run(
    seq: int,
    *,
    version: int,
    facts: Sequence[tuple[FactChangeKind, Fact]] = (),
    w: str = "",
    user: str = USER,
    minutes: int | None = None,
    **kw: Any,
) -> LoggedRun:
    at = T0 + timedelta(minutes=seq if minutes is None else minutes)
    return make_run(user, seq=seq, version=version, facts=facts, working_memory=w, at=at, **kw)


LISBON = fact("The user lives in Lisbon")
PORTO = fact("The user lives in Porto", T0 + timedelta(minutes=2))
LOOP = fact("Send the checklist to Grace", fact_type=FactType.OPEN_LOOP)
LISBON_AGAIN = replace(LISBON, reinforce_count=1, confidence=0.9)


def history() -> list[LoggedRun]:
    """Add, reinforce, a failed run, contradict, close a loop, connection info twice."""
    return [
        run(
            1,
            version=1,
            facts=[(FactChangeKind.ADD, LISBON), (FactChangeKind.ADD, LOOP)],
            w="Lives in Lisbon.",
            scaffold={"Location": "Lisbon"},
            connections={"mail": ["Acme pays in EUR"]},
        ),
        run(
            2,
            version=2,
            facts=[(FactChangeKind.REINFORCE, LISBON_AGAIN)],
            w="Lives in Lisbon, really.",
            scaffold={"Location": "Lisbon"},
            learned=["Her manager is Grace"],
        ),
        run(3, version=3, status=RunStatus.FAILED, base=2),
        run(
            4,
            version=3,
            facts=[
                (FactChangeKind.CONTRADICT, PORTO),
                (
                    FactChangeKind.CONTRADICT,
                    replace(
                        LISBON_AGAIN, status=FactStatus.CONTRADICTED, superseded_by=PORTO.fact_id
                    ),
                ),
                (FactChangeKind.CLOSE_LOOP, replace(LOOP, status=FactStatus.ARCHIVED)),
            ],
            w="Moved to Porto.",
            scaffold={"Location": "Porto"},
            learned=["Her manager is Grace"],
            connections={"mail": ["Invoices go to finance@acme"]},
        ),
    ]


def test_fold_rebuilds_every_tier_from_the_applied_effects() -> None:
    memory = fold_runs(history())

    assert memory.version == 3
    assert memory.runs_folded == 3
    assert memory.last_seq == 4
    assert memory.working_memory == "Moved to Porto."
    assert memory.scaffold == {"Location": "Porto"}
    assert memory.learned_info == ("Her manager is Grace",)
    assert memory.connections == {"mail": ("Acme pays in EUR", "Invoices go to finance@acme")}
    lisbon, porto, loop = (memory.facts[f.fact_id] for f in (LISBON, PORTO, LOOP))
    assert (lisbon.status, lisbon.superseded_by) == (FactStatus.CONTRADICTED, PORTO.fact_id)
    assert lisbon.reinforce_count == 1
    assert lisbon.confidence == 0.9
    assert lisbon.version == 3  # the row counts every upsert: add, reinforce, contradict
    assert lisbon.created_at == T0
    assert porto.status is FactStatus.ACTIVE
    assert porto.version == 1
    assert loop.status is FactStatus.ARCHIVED
    assert [f.fact_id for f in memory.facts_in((FactStatus.ACTIVE,))] == [PORTO.fact_id]


def test_fold_keeps_a_connections_latest_learned_info_as_the_store_does() -> None:
    lines = [f"line {i}" for i in range(MAX_LEARNED_INFO + 50)]
    memory = fold_runs(
        [
            run(1, version=1, connections={"mail": lines[:150]}),
            run(2, version=2, connections={"mail": lines[150:]}),
        ]
    )
    assert memory.connections == {"mail": tuple(lines[-MAX_LEARNED_INFO:])}


def test_fold_is_deterministic_and_can_resume_where_it_stopped() -> None:
    runs = history()
    whole = fold_runs(runs)
    assert fold_runs(runs) == whole
    for k in range(1, len(runs)):
        assert fold_runs(runs[k:], fold_runs(runs[:k])) == whole


def test_a_later_upsert_keeps_the_row_identity_origin_and_read_counters() -> None:
    stored = replace(LISBON, recall_count=4, version=2)
    again = replace(
        LISBON,
        created_by_run=uuid.uuid4(),
        created_at=T0 + timedelta(days=1),
        provenance=Provenance("correction", "autonomous", source_event_ids=(uuid.uuid4(),)),
        confidence=0.1 + 0.2,
    )
    merged = merge_fact(stored, again)
    assert (merged.created_by_run, merged.created_at) == (stored.created_by_run, T0)
    assert merged.provenance.context_type == "fact"
    assert merged.provenance.source_event_ids == again.provenance.source_event_ids
    assert merged.recall_count == 4
    assert merged.version == 3
    assert merged.confidence == 0.3  # what Postgres `real` gives back
    pinned = replace(stored, pinned=True)
    assert merge_fact(pinned, again) == pinned


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ([run(2, version=1), run(1, version=2)], "seq 1 after seq 2"),
        ([run(1, version=1), run(2, version=3, base=2)], "a run is missing"),
        ([run(1, version=1), run(2, version=2, user="bob")], "of org-a/bob"),
        # The same user id in another organization is another memory: never folded in.
        ([run(1, version=1), run(2, version=2, org="org-b")], "of org-b/ada"),
        ([replace(run(1, version=1), run=replace(run(1, version=1).run, output={}))], "no applied"),
        (
            [
                replace(
                    run(1, version=1),
                    run=replace(run(1, version=1).run, output={"applied": {"version": 1}}),
                )
            ],
            "malformed",
        ),
    ],
)
def test_a_log_that_does_not_fold_is_refused(runs: list[LoggedRun], message: str) -> None:
    with pytest.raises(FoldError, match=message):
        fold_runs(runs)


def test_nothing_to_fold_needs_a_start() -> None:
    with pytest.raises(FoldError):
        fold_runs([])
    empty = FoldedMemory(user_id=USER)
    assert fold_runs([], empty) == empty


@pytest.mark.parametrize(
    ("minutes", "expected_seqs"),
    [(0, []), (1, [1]), (3, [1, 2, 3]), (10, [1, 2, 3, 4])],
)
def test_runs_until_is_the_prefix_committed_by_then(minutes: int, expected_seqs: list[int]) -> None:
    chosen = runs_until(history(), T0 + timedelta(minutes=minutes))
    assert [r.seq for r in chosen] == expected_seqs


def test_memory_at_a_time_between_runs() -> None:
    memory = fold_runs(runs_until(history(), T0 + timedelta(minutes=2, seconds=30)))
    assert memory.version == 2
    assert memory.scaffold == {"Location": "Lisbon"}
    assert PORTO.fact_id not in memory.facts


def events(n: int, minutes: Sequence[int] | None = None) -> list[ContextEvent]:
    stamps = minutes or range(n)
    return [make_event(USER, f"I like topic number {i}", minutes=m) for i, m in enumerate(stamps)]


@pytest.mark.parametrize(
    ("n", "max_batch", "sizes"),
    [(0, 3, []), (1, 3, [1]), (3, 3, [3]), (7, 3, [3, 3, 1]), (5, 1, [1, 1, 1, 1, 1])],
)
def test_batches_by_size_cut_the_log_in_order(n: int, max_batch: int, sizes: list[int]) -> None:
    log = events(n)
    batches = batches_by_size(log, max_batch)
    assert [len(b.events) for b in batches] == sizes
    assert [e for b in batches for e in b.events] == log


def test_a_batch_clock_is_its_latest_event_and_never_goes_back() -> None:
    batches = batches_by_size(events(4, [5, 9, 1, 2]), 2)
    assert [b.now for b in batches] == [T0 + timedelta(minutes=9)] * 2
    with pytest.raises(ValueError, match="max_batch"):
        batches_by_size(events(1), 0)


def test_batches_like_live_follow_the_succeeded_runs_then_the_rest() -> None:
    log = events(5)
    ids = [e.event_id for e in log]

    def logged(seq: int, taken: list[uuid.UUID], status: RunStatus) -> LoggedRun:
        base = run(seq, version=seq, status=status)
        return replace(base, run=replace(base.run, input_event_ids=tuple(taken)))

    shown = [uuid.uuid4(), uuid.uuid4()]
    third = logged(3, [ids[2], uuid.uuid4()], RunStatus.SUCCEEDED)  # one id the log lacks
    output = {**(third.run.output or {}), "candidates": {"shown": [str(i) for i in shown]}}
    runs = [
        logged(1, [ids[1], ids[0]], RunStatus.SUCCEEDED),
        logged(2, [ids[2]], RunStatus.FAILED),
        replace(third, run=replace(third.run, output=output)),
    ]
    batches = batches_like_live(log, runs, max_batch=10)
    assert [[e.event_id for e in b.events] for b in batches] == [
        [ids[1], ids[0]],
        [ids[2]],
        [ids[3], ids[4]],
    ]
    assert batches[0].now == runs[0].run.started_at
    # A run that recorded its candidates is replayed with them, in order; an older run that
    # did not, and events no run took, get a search like a live flush.
    assert [b.shown for b in batches] == [None, tuple(shown), None]


def test_diff_reports_facts_on_each_side_changed_fields_and_tiers() -> None:
    left = fold_runs(history())
    right = replace(
        left,
        working_memory="Lives in Porto.",
        scaffold={"Location": "Porto", "Title": "Designer"},
        learned_info=("Her manager is Grace", "Likes tea"),
        connections={"mail": ("Acme pays in EUR",)},
        facts={
            **{k: v for k, v in left.facts.items() if k != LOOP.fact_id},
            PORTO.fact_id: replace(left.facts[PORTO.fact_id], status=FactStatus.HELD),
            fact("Likes tea").fact_id: fact("Likes tea"),
        },
    )
    diff = diff_memory(left, right)
    assert not diff.identical
    assert [f.fact_id for f in diff.only_left] == [LOOP.fact_id]
    assert [f.content for f in diff.only_right] == ["Likes tea"]
    assert [(d.fact_id, dict(d.fields)) for d in diff.changed] == [
        (PORTO.fact_id, {"status": ("active", "held")})
    ]
    assert diff.working_memory == ("Moved to Porto.", "Lives in Porto.")
    assert diff.scaffold == {"Title": (None, "Designer")}
    assert diff.learned_info == ((), ("Likes tea",))
    assert diff.connections == {"mail": (("Invoices go to finance@acme",), ())}
    assert diff_memory(left, left).identical


def test_verify_compares_what_a_run_writes_a_shadow_diff_what_a_fact_says() -> None:
    left = fold_runs(history())
    porto = left.facts[PORTO.fact_id]
    evidence = replace(porto.provenance, source_event_ids=(uuid.uuid4(),))
    # Changed behind the run log's back: its evidence, its subject, its version.
    changed = replace(porto, provenance=evidence, subject="Grace", version=porto.version + 7)
    right = replace(left, facts={**left.facts, PORTO.fact_id: changed})
    [verified] = diff_memory(left, right, VERIFY_FIELDS).changed
    assert set(verified.fields) == {"source_event_ids", "subject", "version"}
    [shadowed] = diff_memory(left, right).changed
    assert set(shadowed.fields) == {"subject"}


def test_a_pointer_to_an_erased_successor_is_cleared_as_the_live_erasure_clears_it() -> None:
    # Porto was erased: its entries left the log, Lisbon's pointer to it stayed in run 4's.
    erased = [
        replace(r, run=replace(r.run, output=_without(r.run.output, PORTO.fact_id)))
        for r in history()
    ]
    folded = fold_runs(erased)
    assert PORTO.fact_id not in folded.facts
    lisbon = folded.facts[LISBON.fact_id]
    assert (lisbon.status, lisbon.superseded_by) == (FactStatus.CONTRADICTED, None)
    assert fold_runs(history()).facts[LISBON.fact_id].superseded_by == PORTO.fact_id


def _without(output: Mapping[str, Any] | None, fact_id: uuid.UUID) -> dict[str, Any]:
    out = dict(output or {})
    if "applied" in out:
        applied = dict(out["applied"])
        applied["facts"] = [f for f in applied["facts"] if f["after"]["fact_id"] != str(fact_id)]
        out["applied"] = applied
    return out


def consolidator() -> Consolidator:
    return Consolidator(WriteGate(BagOfWordsEmbedder()), PriceTable({}))


def test_shadow_consolidation_folds_like_the_log_and_is_reproducible() -> None:
    log = [
        make_event(USER, "I work in engineering at Initech", minutes=0),
        make_event(USER, "I prefer short answers", EventType.PREFERENCE, minutes=1),
        make_event(USER, "Actually I moved to design", EventType.CORRECTION, minutes=2),
        make_event(USER, "I prefer short answers", EventType.PREFERENCE, minutes=3),
    ]
    embedder = BagOfWordsEmbedder()
    backend = OfflineBackend(embedder)
    batches = batches_by_size(log, 2)
    first = shadow_consolidate(key_of(USER), batches, backend, consolidator(), embedder=embedder)
    again = shadow_consolidate(key_of(USER), batches, backend, consolidator(), embedder=embedder)

    assert first.memory == again.memory
    assert len(first.runs) == 2
    assert not first.failed
    assert first.memory.version == 2
    assert first.memory.organization_id == "org-a"
    assert first.prompt_tokens > 0
    logged = [LoggedRun(i + 1, r.started_at, r) for i, r in enumerate(first.runs)]
    assert fold_runs(logged) == first.memory
    statuses = {f.content: f.status for f in first.memory.facts.values()}
    assert FactStatus.CONTRADICTED in statuses.values(), statuses
    # The second batch was shown the facts the first made (the search found them), and its
    # run says so, so a replay of it can show the same ones.
    shown = (first.runs[1].output or {})["candidates"]
    assert shown["known"] == 2
    assert len(shown["shown"]) == 2


def test_a_batch_of_a_live_run_is_shown_the_facts_that_run_recorded() -> None:
    """Shadow replay of live batches reproduces live memory only if each batch sees what its
    live run saw: the recorded candidates, not a new search."""
    embedder = BagOfWordsEmbedder()
    backend = OfflineBackend(embedder)
    first = make_event(USER, "I work in engineering at Initech", minutes=0)
    correction = make_event(USER, "Actually I moved to design", EventType.CORRECTION, minutes=2)
    searched = [
        ShadowBatch((first,), first.occurred_at),
        ShadowBatch((correction,), correction.occurred_at),
    ]
    recorded_none = [searched[0], ShadowBatch((correction,), correction.occurred_at, shown=())]

    with_search = shadow_consolidate(
        key_of(USER), searched, backend, consolidator(), embedder=embedder
    )
    as_recorded = shadow_consolidate(
        key_of(USER), recorded_none, backend, consolidator(), embedder=embedder
    )

    def statuses(result: ShadowResult) -> list[FactStatus]:
        return sorted(f.status for f in result.memory.facts.values())

    assert statuses(with_search) == [FactStatus.ACTIVE, FactStatus.CONTRADICTED]
    # Shown nothing, the correction could only add: as the live run that recorded it did.
    assert statuses(as_recorded) == [FactStatus.ACTIVE, FactStatus.ACTIVE]
    assert (as_recorded.runs[1].output or {})["candidates"] == {"shown": [], "known": 1}


def test_a_live_run_s_retraction_is_replayed_though_its_record_leaves_the_target_out() -> None:
    # A run records what its backend was shown: never the facts its retractions take back.
    # Replayed on those alone, the retraction found no target and the fact stayed active.
    embedder = BagOfWordsEmbedder()
    backend = RetractionAwareBackend(OfflineBackend(embedder))
    planner = RetractingConsolidator(WriteGate(embedder), PriceTable({}))
    told = make_event(USER, "I work in engineering at Initech", minutes=0)
    made = shadow_consolidate(
        key_of(USER), [ShadowBatch((told,), told.occurred_at)], backend, planner, embedder=embedder
    )
    (fact,) = made.memory.facts.values()
    taken_back = make_event(
        USER, FactRetraction(fact_id=fact.fact_id).model_dump_json(), EventType.FACT_RETRACTION,
        minutes=1,
    )  # fmt: skip
    live = [
        ShadowBatch((told,), told.occurred_at, shown=()),
        ShadowBatch((taken_back,), taken_back.occurred_at, shown=()),
    ]
    replayed = shadow_consolidate(key_of(USER), live, backend, planner, embedder=embedder)
    (after,) = replayed.memory.facts.values()
    assert after.fact_id == fact.fact_id
    assert after.status is FactStatus.ARCHIVED  # deleted by the user


def test_shadow_retries_transient_errors_and_skips_batches_the_backend_cannot_do() -> None:
    log = events(3)
    batches = [ShadowBatch((e,), e.occurred_at) for e in log]
    backend = FlakyBackend(
        [
            TransientBackendError("429"),
            None,  # batch 1 on its second attempt
            BackendError("unparseable"),  # batch 2: skipped
            TransientBackendError("503"),
            TransientBackendError("503"),
            TransientBackendError("503"),  # batch 3: out of attempts
        ]
    )
    slept: list[float] = []
    retry = BatchRetry(attempts=3, backoff=Backoff(1.0, 8.0, jitter=0.0), asked_max_s=120.0)
    result = shadow_consolidate(
        key_of(USER), batches, backend, consolidator(), sleep=slept.append, retry=retry
    )

    assert backend.calls == 6
    assert slept == [1.0, 1.0, 2.0]
    assert [r.input_event_ids for r in result.runs] == [(log[0].event_id,)]
    assert result.runs[0].attempt == 1
    assert [(f.event_ids, f.error) for f in result.failed] == [
        ((log[1].event_id,), "unparseable"),
        ((log[2].event_id,), "503"),
    ]
    assert result.memory.version == 1
