"""An erasure whose memory lock was lost midway stops before its Chroma delete.

The lock is a session lock: when its connection drops (a network blip, a server restart, a
pooler), the session ends and the lock with it, while the erasure goes on through its other
connections. Here the test ends that session between the erasure's Postgres step and its
Chroma delete. Taken over meanwhile, the erasure was finished by another process and the
memory started again, with the same fact learned anew: the stale erasure must not delete
the new memory's vector (Chroma deletes by organization and user, or by fact id, which is
the same for the same text). Not taken over, the erasure stays open, and resumed it
completes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import replace
from typing import Any, cast

import pytest

from domain.erasure import ErasureStatus
from memoryd import wiring
from memoryd.erasure import Eraser, ErasureRequest
from store.errors import DatabaseUnavailable, MemoryLockLost
from store.write.erasure_log import PostgresErasureLog
from tests.support.builders import key_of, make_fact, seed_update
from tests.support.deployment import Deployment, end_memory_lock_session, seed_core

pytestmark = pytest.mark.integration

ADA = key_of("ada")
FACT = make_fact("ada", "Ada lives in Porto")
REQUEST = ErasureRequest("test", "asked by the user")


class AfterPostgresStep:
    """The erasure log, but once its Postgres step (`erase_memory`, `erase_fact`) returned,
    `then` runs: the moment before the erasure's Chroma delete."""

    def __init__(self, log: PostgresErasureLog, then: Callable[[], None]) -> None:
        self._log, self._then = log, then

    def erase_memory(self, *args: Any) -> dict[str, Any]:
        removed = self._log.erase_memory(*args)
        self._then()
        return removed

    def erase_fact(self, *args: Any) -> dict[str, Any]:
        removed = self._log.erase_fact(*args)
        self._then()
        return removed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def end_lock_session(superuser_dsn: str, dsn: str) -> None:
    """End the session that holds ADA's memory lock, as a dropped connection would."""
    end_memory_lock_session(superuser_dsn, dsn, ADA)


def erase(eraser: Eraser, scope: str) -> None:
    if scope == "memory":
        eraser.forget(ADA, REQUEST)
    else:
        eraser.erase_fact(ADA, FACT.fact_id, REQUEST)


@pytest.mark.parametrize("scope", ["memory", "fact"])
def test_an_erasure_taken_over_after_losing_its_lock_leaves_the_restarted_memory_s_vector(
    deployment: Deployment, postgres_dsn: str, scope: str
) -> None:
    def race(c: wiring.Core) -> tuple[int, bool, list[ErasureStatus]]:
        seed_core(c, "ada", [FACT])
        with closing(wiring.publisher(c.settings)) as pub:
            eraser = wiring.eraser(c, pub)

            def taken_over() -> None:
                end_lock_session(postgres_dsn, deployment.dsn)
                # Another process finishes the open erasure (the lock is free now), and the
                # user comes back: the same fact is learned and indexed again.
                assert len(eraser.resume_pending()) == 1
                seed_core(c, "ada", [FACT])

            log = cast("PostgresErasureLog", AfterPostgresStep(c.erasures, taken_over))
            with pytest.raises(DatabaseUnavailable):
                erase(replace(eraser, erasures=log), scope)
        statuses = [r.status for r in c.erasures.receipts(c.subjects(ADA))]
        held = any(f.fact_id == FACT.fact_id for f in c.memory.facts(ADA))
        return len(c.index.embeddings([FACT.fact_id])), held, statuses

    vectors, held, statuses = deployment.with_core(race)
    assert (vectors, held) == (1, True)  # the restarted memory has its fact, and its vector
    assert statuses == [ErasureStatus.COMPLETED]  # by the process that took it over


@pytest.mark.parametrize("scope", ["memory", "fact"])
def test_an_erasure_that_lost_its_lock_stays_open_and_resumed_completes(
    deployment: Deployment, postgres_dsn: str, scope: str
) -> None:
    def run(c: wiring.Core) -> tuple[int, ErasureStatus]:
        seed_core(c, "ada", [FACT])
        with closing(wiring.publisher(c.settings)) as pub:
            eraser = wiring.eraser(c, pub)
            lose = AfterPostgresStep(
                c.erasures, lambda: end_lock_session(postgres_dsn, deployment.dsn)
            )
            with pytest.raises(DatabaseUnavailable) as raised:
                erase(replace(eraser, erasures=cast("PostgresErasureLog", lose)), scope)
            # Stopped after Postgres, before Chroma: open, its vector left for the resumption.
            [record] = c.erasures.receipts(c.subjects(ADA))
            assert record.status is ErasureStatus.POSTGRES_ERASED
            assert len(c.index.embeddings([FACT.fact_id])) == 1
            assert isinstance(raised.value, MemoryLockLost)
            [receipt] = eraser.resume_pending()
            assert receipt.erasure_id == record.erasure_id
            done = c.erasures.get(record.erasure_id)
            assert done is not None
        return len(c.index.embeddings([FACT.fact_id])), done.status

    assert deployment.with_core(run) == (0, ErasureStatus.COMPLETED)


def test_an_erasure_that_lost_its_lock_while_tombstoning_moves_no_cut_off(
    deployment: Deployment, postgres_dsn: str
) -> None:
    """Cut-offs moved by a stale erasure would hide the events of a memory started again
    since; the erasure records its tombstone only while it holds the lock."""

    def run(c: wiring.Core) -> tuple[int, ErasureStatus]:
        seed_core(c, "ada", [FACT])
        with closing(wiring.publisher(c.settings)) as pub:
            eraser = wiring.eraser(c, pub)

            def ends_once_the_lock_is_lost() -> Mapping[int, int]:  # the tombstone is written
                end_lock_session(postgres_dsn, deployment.dsn)
                return eraser.end_offsets()

            with pytest.raises(DatabaseUnavailable) as raised:
                replace(eraser, end_offsets=ends_once_the_lock_is_lost).forget(ADA, REQUEST)
            [record] = c.erasures.receipts(c.subjects(ADA))
            assert record.status is ErasureStatus.STARTED
            assert c.memory.forgotten_before(c.subjects(ADA)) == {}
            assert isinstance(raised.value, MemoryLockLost)
            [receipt] = eraser.resume_pending()  # it tombstones again, as after a crash
            assert receipt.erasure_id == record.erasure_id
            done = c.erasures.get(record.erasure_id)
            assert done is not None
        return c.index.count(ADA), done.status

    assert deployment.with_core(run) == (0, ErasureStatus.COMPLETED)


class AfterAudit:
    """The erasure log, but once the erasure is audited, `then` runs: before its Postgres step."""

    def __init__(self, log: PostgresErasureLog, then: Callable[[], None]) -> None:
        self._log, self._then = log, then

    def start(self, *args: Any, **kwargs: Any) -> Any:
        record = self._log.start(*args, **kwargs)
        self._then()
        return record

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def test_a_fact_erasure_that_lost_its_lock_before_its_postgres_step_does_not_take_it(
    deployment: Deployment, postgres_dsn: str
) -> None:
    """A flush is not held back by a fact erasure: with the erasure's lock gone, one takes it
    and plans on W as it is. Had the erasure redacted W meanwhile, that flush would write the
    text back (its apply checks the version, which a fact erasure leaves) and the erasure would
    complete with the text in W. It stops before its Postgres step instead, and resumed after
    the flush, redacts what the flush wrote too."""
    told = "Ada lives in Porto, and she reads a lot"

    def run(c: wiring.Core) -> tuple[list[ErasureStatus], str]:
        seed_core(c, "ada", [FACT], working_memory=told)
        plans: list[Any] = []

        def lost_then_a_flush_plans() -> None:
            end_lock_session(postgres_dsn, deployment.dsn)
            with c.memory.memory_lock(ADA):
                plans.append(seed_update(c.memory, "ada", [], working_memory=f"{told}; tea"))

        with closing(wiring.publisher(c.settings)) as pub:
            eraser = wiring.eraser(c, pub)
            log = cast("PostgresErasureLog", AfterAudit(c.erasures, lost_then_a_flush_plans))
            with pytest.raises(MemoryLockLost):
                replace(eraser, erasures=log).erase_fact(ADA, FACT.fact_id, REQUEST)
            c.memory.apply(plans[0])  # the flush applies, not refused
            eraser.resume_pending()
        statuses = [r.status for r in c.erasures.receipts(c.subjects(ADA))]
        return statuses, c.memory.load_state(ADA).working_memory

    statuses, working_memory = deployment.with_core(run)
    assert statuses == [ErasureStatus.COMPLETED]
    assert "Porto" not in working_memory
    assert "tea" in working_memory
