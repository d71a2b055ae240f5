"""Maintenance leaves a memory alone while an erasure of it, or of one of its facts, is open:
merging a fact being erased into another would have its erasure redact the other's evidence."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from domain.erasure import ErasureScope
from domain.ids import MemoryKey
from domain.model import FactStatus
from memoryd import wiring
from memoryd.ops.config import MaintenanceSettings
from memoryd.ops.maintenance import MaintenanceRunner
from store.write.maintenance_queries import (
    DUPLICATE_LOOKBACK,
    MaintenanceQueries,
    MaintenanceRunRow,
)
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment, seed_core

pytestmark = pytest.mark.integration

ADA = key_of("ada")


def test_a_memory_an_erasure_held_back_is_deduplicated_once_it_completes(
    deployment: Deployment,
) -> None:
    # Written long before the first sweep: the sweeps after it look only at memories changed
    # since their window, so only the skip itself can bring ada's memory back.
    at = datetime.now(UTC) - timedelta(days=2)
    porto = make_fact("ada", "Ada lives in Porto", reinforce_count=2, at=at)
    again = make_fact("ada", "Ada lives in Porto, Portugal", at=at)
    bob = [
        make_fact("bob", "Bob lives in Oslo", at=at),
        make_fact("bob", "Bob lives in Oslo, Norway", at=at),
    ]

    def check(c: wiring.Core) -> tuple[list[dict[str, int]], list[str], list[MaintenanceRunRow]]:
        seed_core(c, "ada", [porto, again])
        seed_core(c, "bob", bob)
        c.erasures.start(
            uuid.uuid4(),
            subject="subject-of-ada",
            scope=ErasureScope.FACT,
            key=ADA,
            fact_id=again.fact_id,
            actor="test",
            reason="the user asked",
        )
        runner = MaintenanceRunner(c, MaintenanceSettings(duplicate_threshold=0.6))
        changes = [runner.run("dedupe").changes]
        ada_statuses = sorted(f.status.value for f in c.memory.facts(ADA, tuple(FactStatus)))
        with c.pool.connection() as conn:  # the erasure completes (its pending row goes)
            conn.execute("DELETE FROM erasure_pending")
        changes += [runner.run("dedupe").changes, runner.run("dedupe").changes]
        return changes, ada_statuses, MaintenanceQueries(c.pool).runs("dedupe")

    changes, ada_statuses, runs = deployment.with_core(check)
    assert changes == [
        {"duplicate": 1, "absorbed": 1},  # bob's memory only
        {"duplicate": 1, "absorbed": 1},  # ada's, once the erasure is done
        {},
    ]
    assert ada_statuses == ["active", "active"]
    assert [r.skipped for r in runs] == [1, 0, 0]


def test_the_duplicate_sweep_looks_back_past_the_last_ones_start(deployment: Deployment) -> None:
    # A flush stamps its facts when it starts and commits later: facts committed while the
    # last sweep ran can carry a time before that sweep's start.
    last_sweep = datetime.now(UTC)
    during = last_sweep - DUPLICATE_LOOKBACK / 2
    before = last_sweep - DUPLICATE_LOOKBACK * 2

    def check(c: wiring.Core) -> list[MemoryKey]:
        for user, at in (("ada", during), ("bob", before)):
            seed_core(
                c, user, [make_fact(user, f"{user} a", at=at), make_fact(user, f"{user} b", at=at)]
            )
        return MaintenanceQueries(c.pool).duplicate_candidates(last_sweep)

    assert deployment.with_core(check) == [ADA]
