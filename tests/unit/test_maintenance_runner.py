"""A maintenance run over many memories: one memory the store refuses to change is left for
the next run while the others are maintained; an outage stops the run, and its record still
counts what the run had committed; a run another process superseded stops, and records
nothing."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from domain.ids import MemoryKey
from domain.model import FactStatus, MemoryUpdate
from memoryd.ops.config import MaintenanceSettings
from memoryd.ops.maintenance import MaintenanceRunner
from store.errors import DatabaseUnavailable, JobFenced, StoreError
from store.inmemory import InMemoryDatabase, InMemoryMemoryStore
from store.write.maintenance_queries import MaintenanceRunRow
from tests.support.builders import BASE_TIME, key_of, make_fact, seed
from tests.support.fakes import BagOfWordsEmbedder

NOW = BASE_TIME + timedelta(days=400)  # every seeded fact is old and was never recalled
USERS = ("ada", "bob", "carol")


class Queries:
    """MaintenanceQueries over nothing: every memory is a candidate, no erasure is open."""

    def __init__(self, keys: Sequence[MemoryKey]) -> None:
        self.keys = list(keys)
        self.runs: list[MaintenanceRunRow] = []

    def lifecycle_candidates(self, **_: datetime) -> list[MemoryKey]:
        return self.keys

    def erasure_open(self, _key: MemoryKey) -> bool:
        return False

    def record_run(self, row: MaintenanceRunRow) -> None:
        self.runs.append(row)


class RefusingStore(InMemoryMemoryStore):
    """Refuses, once told to, to apply a run to one memory."""

    refused: tuple[MemoryKey, StoreError] | None = None

    def apply(self, update: MemoryUpdate) -> None:
        if self.refused is not None and update.state.key == self.refused[0]:
            raise self.refused[1]
        super().apply(update)


def runner_over(error: StoreError) -> tuple[MaintenanceRunner, RefusingStore, Queries]:
    store = RefusingStore(InMemoryDatabase(clock=lambda: NOW))
    for user in USERS:
        seed(store, user, [make_fact(user, f"{user} lives by the sea")])
    store.refused = (key_of("bob"), error)
    core: Any = SimpleNamespace(
        memory=store, clock=lambda: NOW, embedder=BagOfWordsEmbedder(), pool=None
    )
    queries = Queries([key_of(u) for u in USERS])
    return MaintenanceRunner(core, MaintenanceSettings(), queries=queries), store, queries


def statuses(store: InMemoryMemoryStore) -> dict[str, str]:
    return {user: store.facts(key_of(user), tuple(FactStatus))[0].status.value for user in USERS}


def test_a_memory_the_store_refuses_is_left_and_the_others_are_maintained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runner, store, queries = runner_over(StoreError("fact id(s) belong to another memory"))

    report = runner.run("lifecycle")

    assert (report.users, report.changes, report.skipped) == (2, {"never_recalled": 2}, 1)
    assert statuses(store) == {"ada": "stale", "bob": "active", "carol": "stale"}
    (row,) = queries.runs
    assert (row.outcome, row.users, row.changes, row.skipped) == (
        "succeeded",
        2,
        {"never_recalled": 2},
        1,
    )
    (logged,) = [r for r in caplog.records if r.levelname == "ERROR"]
    assert (logged.organization_id, logged.user_id) == ("org-a", "bob")


def test_an_outage_stops_the_run_and_its_record_counts_what_it_committed() -> None:
    runner, store, queries = runner_over(DatabaseUnavailable("connection lost"))

    with pytest.raises(DatabaseUnavailable):
        runner.run("lifecycle")

    assert statuses(store) == {"ada": "stale", "bob": "active", "carol": "active"}
    (row,) = queries.runs
    assert (row.outcome, row.users, row.changes, row.error) == (
        "failed",
        1,
        {"never_recalled": 1},
        "connection lost",
    )


def test_a_superseded_run_stops_at_its_first_refused_write_and_records_nothing() -> None:
    # Its lock lost, another process runs the job now: that run maintains the rest and records.
    runner, store, queries = runner_over(JobFenced("cluster job maintenance-lifecycle: run 1"))

    with pytest.raises(JobFenced):
        runner.run("lifecycle")

    assert statuses(store) == {"ada": "stale", "bob": "active", "carol": "active"}
    assert queries.runs == []
