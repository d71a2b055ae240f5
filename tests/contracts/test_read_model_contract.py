"""The read model contract (`ReadModel`), run unchanged against the in-memory read model and
Postgres. Keyword search is held to what plain words give both: matching, scope, limits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus, LedgerEntry
from domain.reads import ContextLogRow, FactCounters, Scope
from tests.contracts.conftest import Stores
from tests.support.builders import BASE_TIME, key_of, log_row, make_fact, seed

ADA = Scope(key_of("ada"))


def mark_all_indexed(stores: Stores, facts: Sequence[Fact]) -> None:
    def nothing(_: Sequence[Fact]) -> list[LedgerEntry]:
        return []

    stored = stores.memory.facts_by_id([f.fact_id for f in facts])
    stores.memory.mark_indexed(stored, BASE_TIME, nothing)


def contents(facts: Sequence[Fact]) -> set[str]:
    return {f.content for f in facts}


def test_memory_stamp_and_injection(stores: Stores) -> None:
    assert stores.reads.memory_stamp(key_of("ada")) is None
    assert stores.reads.injection(key_of("ada")) is None
    pinned = make_fact("ada", "Ada's daughter is Mia", pinned=True)
    seed(
        stores.memory,
        "ada",
        [
            pinned,
            make_fact("ada", "Ada lives in Berlin"),
            make_fact("ada", "Ada's old pin", pinned=True, status=FactStatus.ARCHIVED),
        ],
        working_memory="Ada is busy",
        learned_info=["prefers email"],
        connections={"mail": ("Acme pays in EUR",)},
    )
    stamp = stores.reads.memory_stamp(key_of("ada"))
    assert stamp is not None
    assert stamp.version == 1
    injection = stores.reads.injection(key_of("ada"))
    assert injection is not None
    assert injection.stamp == stamp
    assert (injection.state.working_memory, injection.state.learned_info) == (
        "Ada is busy",
        ("prefers email",),
    )
    assert dict(injection.connections) == {"mail": ("Acme pays in EUR",)}
    assert [f.fact_id for f in injection.pinned] == [pinned.fact_id]  # active pins only
    assert stores.reads.memory_stamp(key_of("bob")) is None
    assert stores.reads.memory_stamp(key_of("ada", "org-b")) is None
    assert stores.reads.memory_stamps([key_of("ada"), key_of("bob")]) == {key_of("ada"): stamp}
    # Another run keeps the generation and moves the version.
    seed(stores.memory, "ada", [])
    after = stores.reads.memory_stamp(key_of("ada"))
    assert after is not None
    assert (after.generation, after.version) == (stamp.generation, 2)


def test_the_same_user_id_in_another_organization_reads_nothing_of_ours(stores: Stores) -> None:
    pinned = make_fact("ada", "Ada keeps bees", pinned=True)
    seed(stores.memory, "ada", [pinned], working_memory="ours")
    theirs = MemoryKey("org-b", "ada")
    assert stores.reads.injection(theirs) is None
    assert stores.reads.keyword_search(Scope(theirs), "bees", 10) == []
    their_fact = make_fact("ada", "Ada keeps bees", org="org-b")
    seed(stores.memory, "ada", [their_fact], org="org-b", working_memory="theirs")
    injection = stores.reads.injection(theirs)
    assert injection is not None
    assert (injection.state.working_memory, injection.pinned) == ("theirs", ())
    (found,) = stores.reads.keyword_search(Scope(theirs), "bees", 10)
    assert found.organization_id == "org-b"


def test_keyword_search_finds_shared_words_within_scope(stores: Stores) -> None:
    seed(
        stores.memory,
        "ada",
        [
            make_fact("ada", "Ada keeps bees on the roof"),
            make_fact("ada", "Ada plays chess on Sundays"),
            make_fact("ada", "Ada keeps notes about bees in Jira", connection_id="jira"),
            make_fact("ada", "Ada once kept bees", status=FactStatus.ARCHIVED),
            make_fact("ada", "Ada emailed about bees", context_type="email"),
        ],
    )
    seed(stores.memory, "bob", [make_fact("bob", "Bob keeps bees too")])
    assert contents(stores.reads.keyword_search(ADA, "bees", 10)) == {
        "Ada keeps bees on the roof",
        "Ada emailed about bees",
    }
    with_jira = replace(ADA, connection_ids=("jira",))
    assert "Ada keeps notes about bees in Jira" in contents(
        stores.reads.keyword_search(with_jira, "bees", 10)
    )
    archived = replace(ADA, statuses=(FactStatus.ARCHIVED,))
    assert contents(stores.reads.keyword_search(archived, "bees", 10)) == {"Ada once kept bees"}
    emails = replace(ADA, context_types=("email",))
    assert contents(stores.reads.keyword_search(emails, "bees", 10)) == {"Ada emailed about bees"}
    other_org = replace(ADA, key=key_of("ada", "org-b"))
    assert stores.reads.keyword_search(other_org, "bees", 10) == []
    assert len(stores.reads.keyword_search(ADA, "bees chess", 2)) == 2
    assert stores.reads.keyword_search(ADA, "volcano", 10) == []
    assert stores.reads.keyword_search(ADA, "bees", 0) == []
    together = [
        (ADA, "bees"),
        (with_jira, "bees"),
        (replace(ADA, statuses=()), "bees"),
        (other_org, "bees"),
        (ADA, "chess"),
        (ADA, "volcano"),
    ]
    for limit in (0, 1, 10):
        assert stores.reads.keyword_searches(together, limit) == [
            stores.reads.keyword_search(scope, text, limit) for scope, text in together
        ]
    assert stores.reads.keyword_searches([], 10) == []
    assert stores.reads.keyword_search(replace(ADA, statuses=()), "bees", 10) == []


def test_keyword_search_ranks_more_shared_words_first(stores: Stores) -> None:
    seed(
        stores.memory,
        "ada",
        [make_fact("ada", "Ada keeps bees"), make_fact("ada", "Ada keeps bees on the roof")],
    )
    (best, _) = stores.reads.keyword_search(ADA, "bees roof", 10)
    assert best.content == "Ada keeps bees on the roof"


def test_keyword_search_weighs_a_word_rare_in_the_memory_above_common_ones(stores: Stores) -> None:
    # Okapi BM25 with this memory's document frequencies: "Ada" and "keeps" are in nearly every
    # fact, "roof" in one, so the roof outranks a fact sharing two common words with the query.
    common = [make_fact("ada", f"Ada keeps {thing}") for thing in ("bees", "goats", "notes")]
    roof = make_fact("ada", "The roof leaks")
    seed(stores.memory, "ada", [*common, roof])
    ranked = stores.reads.keyword_search(ADA, "Ada keeps roof", 10)
    assert ranked[0].content == "The roof leaks"
    assert len(ranked) == 4


def test_indexed_ids_and_facts_in_scope(stores: Stores) -> None:
    berlin = make_fact("ada", "Ada lives in Berlin")
    tea = make_fact("ada", "Ada likes tea")
    jira = make_fact("ada", "Ada uses Jira", connection_id="jira")
    seed(stores.memory, "ada", [berlin, tea, jira])
    assert stores.reads.indexed_ids(ADA, 10) == []
    mark_all_indexed(stores, [berlin, jira])
    assert stores.reads.indexed_ids(ADA, 10) == [berlin.fact_id]
    assert set(stores.reads.indexed_ids(replace(ADA, connection_ids=("jira",)), 10)) == {
        berlin.fact_id,
        jira.fact_id,
    }
    assert len(stores.reads.indexed_ids(replace(ADA, connection_ids=("jira",)), 1)) == 1

    ids = [berlin.fact_id, tea.fact_id, jira.fact_id, uuid.uuid4()]
    assert contents(stores.reads.facts_in_scope(ADA, ids)) == {berlin.content, tea.content}
    assert stores.reads.facts_in_scope(Scope(key_of("bob")), ids) == []
    assert stores.reads.facts_in_scope(Scope(key_of("ada", "org-b")), ids) == []
    assert stores.reads.facts_in_scope(ADA, []) == []


def generation_of(stores: Stores, key: MemoryKey) -> uuid.UUID:
    injection = stores.reads.injection(key)
    assert injection is not None
    return injection.generation


def test_a_turns_recalls_are_counted_once_with_its_audit_row(stores: Stores) -> None:
    berlin, tea = make_fact("ada", "Ada lives in Berlin"), make_fact("ada", "Ada likes tea")
    seed(stores.memory, "ada", [berlin, tea])
    generation = generation_of(stores, ADA.key)
    later = BASE_TIME + timedelta(minutes=5)
    first = log_row(ADA.key, generation=generation, recalled=[berlin], at=later)
    second = log_row(ADA.key, generation=generation, recalled=[berlin, tea])
    stores.reads.write_context_logs([first, second, first])
    stores.reads.write_context_logs([second])  # a retried turn (same log id)
    stores.reads.write_context_logs([])
    # Another generation's turn (the memory was erased since) writes and counts nothing.
    stores.reads.write_context_logs([log_row(ADA.key, generation=uuid.uuid4(), recalled=[tea])])
    stored = {f.fact_id: f for f in stores.memory.facts_by_id([berlin.fact_id, tea.fact_id])}
    assert (stored[berlin.fact_id].recall_count, stored[berlin.fact_id].last_recalled_at) == (
        2,
        later,
    )
    assert (stored[tea.fact_id].recall_count, stored[tea.fact_id].last_recalled_at) == (
        1,
        BASE_TIME,
    )
    assert len(stores.reads.context_logs(ADA.key)) == 2


def test_a_recall_of_a_fact_gone_since_is_skipped(stores: Stores) -> None:
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(stores.memory, "ada", [berlin])
    gone = make_fact("ada", "Ada lived in Rome")
    row = log_row(ADA.key, generation=generation_of(stores, ADA.key), recalled=[gone, berlin])
    stores.reads.write_context_logs([row])
    (stored,) = stores.memory.facts_by_id([berlin.fact_id])
    assert stored.recall_count == 1
    assert stores.memory.facts_by_id([gone.fact_id]) == []


def test_fact_counters_are_the_stored_versions_and_recalls_of_facts_in_scope(
    stores: Stores,
) -> None:
    berlin = make_fact("ada", "Ada lives in Berlin")
    tea = make_fact("ada", "Ada likes tea")
    jira = make_fact("ada", "Ada uses Jira", connection_id="jira")
    seed(stores.memory, "ada", [berlin, tea, jira])
    (unrecalled,) = stores.memory.facts_by_id([berlin.fact_id])
    later = BASE_TIME + timedelta(minutes=5)
    generation = generation_of(stores, ADA.key)
    stores.reads.write_context_logs(
        [log_row(ADA.key, generation=generation, recalled=[berlin], at=later) for _ in range(2)]
    )
    ids = [berlin.fact_id, tea.fact_id, jira.fact_id, uuid.uuid4()]
    counters = stores.reads.fact_counters(ADA, ids)
    assert counters == {
        berlin.fact_id: FactCounters(berlin.version, 2, later),
        tea.fact_id: FactCounters(tea.version, 0, None),
    }
    # The row read before the recalls, with the counters read after: the row as stored now.
    assert [counters[berlin.fact_id].applied_to(unrecalled)] == stores.memory.facts_by_id(
        [berlin.fact_id]
    )
    assert set(stores.reads.fact_counters(replace(ADA, connection_ids=("jira",)), ids)) == {
        berlin.fact_id,
        tea.fact_id,
        jira.fact_id,
    }
    assert stores.reads.fact_counters(Scope(key_of("ada", "org-b")), ids) == {}
    assert stores.reads.fact_counters(replace(ADA, statuses=(FactStatus.HELD,)), ids) == {}
    assert stores.reads.fact_counters(ADA, []) == {}


def ada_row(**changes: object) -> ContextLogRow:
    return replace(log_row(ADA.key, generation=None), **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("times", [1, 2])
def test_context_logs_are_written_once(stores: Stores, times: int) -> None:
    seed(stores.memory, "ada", [])
    injection = stores.reads.injection(key_of("ada"))
    assert injection is not None
    row = ada_row(generation=injection.generation)
    for _ in range(times):
        stores.reads.write_context_logs([row])
    stores.reads.write_context_logs([])
    (logged,) = stores.reads.context_logs(key_of("ada"))
    assert (logged["log_id"], logged["query"], logged["degraded"]) == (
        row.log_id,
        row.query,
        False,
    )


def test_a_context_log_of_another_generation_is_not_written(stores: Stores) -> None:
    """A turn that read a memory since erased: its audit row, written later, is dropped."""
    seed(stores.memory, "ada", [])
    stores.reads.write_context_logs([ada_row(generation=uuid.uuid4())])
    assert stores.reads.context_logs(key_of("ada")) == []
    # A turn on a memory that did not exist yet is written (nothing is being erased).
    stores.reads.write_context_logs([ada_row(user_id="newcomer", generation=None)])
    assert len(stores.reads.context_logs(key_of("newcomer"))) == 1
