"""The read model contract (`ReadModel`), run unchanged against the in-memory read model and
Postgres. Keyword search is held to what plain words give both: matching, scope, limits."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest

from domain.model import Fact, FactStatus, LedgerEntry
from domain.reads import ContextLogRow, Recall, Scope
from tests.contracts.conftest import Stores
from tests.support.builders import BASE_TIME, make_fact, seed

ADA = Scope("ada")


def mark_all_indexed(stores: Stores, facts: Sequence[Fact]) -> None:
    def nothing(_: Sequence[Fact]) -> list[LedgerEntry]:
        return []

    stored = stores.memory.facts_by_id([f.fact_id for f in facts])
    stores.memory.mark_indexed(stored, BASE_TIME, nothing)


def contents(facts: Sequence[Fact]) -> set[str]:
    return {f.content for f in facts}


def test_memory_version_and_injection(stores: Stores) -> None:
    assert stores.reads.memory_version("ada") is None
    assert stores.reads.injection("ada") is None
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
    assert stores.reads.memory_version("ada") == 1
    injection = stores.reads.injection("ada")
    assert injection is not None
    assert (injection.state.working_memory, injection.state.learned_info) == (
        "Ada is busy",
        ("prefers email",),
    )
    assert dict(injection.connections) == {"mail": ("Acme pays in EUR",)}
    assert [f.fact_id for f in injection.pinned] == [pinned.fact_id]  # active pins only
    assert stores.reads.memory_version("bob") is None


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
    other_org = replace(ADA, organization_id="org-b")
    assert stores.reads.keyword_search(other_org, "bees", 10) == []
    assert len(stores.reads.keyword_search(ADA, "bees chess", 2)) == 2
    assert stores.reads.keyword_search(ADA, "volcano", 10) == []
    assert stores.reads.keyword_search(ADA, "bees", 0) == []
    assert stores.reads.keyword_search(replace(ADA, statuses=()), "bees", 10) == []


def test_keyword_search_ranks_more_shared_words_first(stores: Stores) -> None:
    seed(
        stores.memory,
        "ada",
        [make_fact("ada", "Ada keeps bees"), make_fact("ada", "Ada keeps bees on the roof")],
    )
    (best, _) = stores.reads.keyword_search(ADA, "bees roof", 10)
    assert best.content == "Ada keeps bees on the roof"


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
    assert stores.reads.facts_in_scope(Scope("bob"), ids) == []
    assert stores.reads.facts_in_scope(ADA, []) == []


def test_recalls_add_up(stores: Stores) -> None:
    berlin = make_fact("ada", "Ada lives in Berlin")
    seed(stores.memory, "ada", [berlin])
    later = BASE_TIME + timedelta(minutes=5)
    stores.reads.record_recalls(
        [
            Recall(berlin.fact_id, later),
            Recall(berlin.fact_id, BASE_TIME),
            Recall(uuid.uuid4(), later),
        ]
    )
    stores.reads.record_recalls([])
    (stored,) = stores.memory.facts_by_id([berlin.fact_id])
    assert (stored.recall_count, stored.last_recalled_at) == (2, later)


@pytest.mark.parametrize("times", [1, 2])
def test_context_logs_are_written_once(stores: Stores, times: int) -> None:
    row = ContextLogRow(
        log_id=uuid.uuid4(),
        user_id="ada",
        organization_id="org-a",
        query="where does ada live?",
        rewritten_query=None,
        memory_version=1,
        budget="balanced",
        connection_ids=("mail",),
        injected={"working_memory_chars": 10},
        retrieved=[{"fact_id": "x"}],
        latency_ms=3.5,
        degraded=False,
        degraded_reason=None,
        created_at=BASE_TIME,
    )
    for _ in range(times):
        stores.reads.write_context_logs([row])
    stores.reads.write_context_logs([])
    (logged,) = stores.reads.context_logs("ada")
    assert (logged["log_id"], logged["query"], logged["degraded"]) == (
        row.log_id,
        row.query,
        False,
    )
