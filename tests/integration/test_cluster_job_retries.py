"""A cluster job whose run failed is due again a few minutes after the failure, not a whole
interval after it started; so is one a crash left running, a few minutes after its last
heartbeat; one that succeeded waits its interval."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from psycopg_pool import ConnectionPool

from memoryd import wiring
from store.write import cluster_jobs
from store.write.cluster_jobs import RETRY_AFTER_FAILURE, ClusterJobs
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
EVERY = timedelta(hours=6)
SECOND = timedelta(seconds=1)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_a_failed_run_is_retried_after_minutes_and_a_success_waits_its_interval(
    deployment: Deployment,
) -> None:
    clock = Clock()

    def fail() -> None:
        clock.now += timedelta(minutes=2)  # fails two minutes into the run
        raise RuntimeError("Postgres went away")

    def check(c: wiring.Core) -> list[str]:
        jobs = ClusterJobs(c.pool, clock)
        with pytest.raises(RuntimeError):
            jobs.run_if_due("maintenance-lifecycle", EVERY, fail)
        failed_at = clock.now
        seen = []
        for at in (
            failed_at + RETRY_AFTER_FAILURE - SECOND,
            failed_at + RETRY_AFTER_FAILURE,  # and this run succeeds
            failed_at + 2 * RETRY_AFTER_FAILURE,
            failed_at + RETRY_AFTER_FAILURE + EVERY,
        ):
            clock.now = at
            outcome = jobs.run_if_due("maintenance-lifecycle", EVERY, lambda: None)
            seen.append("ran" if outcome.ran else outcome.skipped)
        # A job whose interval is shorter than the retry delay keeps its interval.
        clock.now = T0
        with pytest.raises(RuntimeError):
            jobs.run_if_due("telemetry", timedelta(seconds=12), fail)
        clock.now += timedelta(seconds=12)
        outcome = jobs.run_if_due("telemetry", timedelta(seconds=12), lambda: None)
        seen.append("ran" if outcome.ran else outcome.skipped)
        return seen

    assert deployment.with_core(check) == ["not due", "ran", "not due", "ran", "ran"]


def test_a_run_a_crash_left_running_is_due_again_minutes_after_it_started(
    migrated_pool: ConnectionPool,
) -> None:
    with migrated_pool.connection() as conn:  # its process was killed mid-run, its lock went too
        conn.execute(
            "INSERT INTO scheduled_jobs (job, last_started_at, first_started_at, last_outcome)"
            " VALUES ('maintenance-dedupe', %s, %s, 'running')",
            (T0, T0),
        )
    clock = Clock()
    jobs = ClusterJobs(migrated_pool, clock)
    seen = []
    for at in (T0 + RETRY_AFTER_FAILURE - SECOND, T0 + RETRY_AFTER_FAILURE):
        clock.now = at
        outcome = jobs.run_if_due("maintenance-dedupe", EVERY, lambda: None)
        seen.append("ran" if outcome.ran else outcome.skipped)
    assert seen == ["not due", "ran"]


def test_a_run_still_beating_is_not_started_again_whatever_its_lock(
    migrated_pool: ConnectionPool,
) -> None:
    # Its lock connection dropped (the lock is free) while its process goes on beating.
    beat = T0 + timedelta(minutes=30)
    with migrated_pool.connection() as conn:
        conn.execute(
            "INSERT INTO scheduled_jobs (job, last_started_at, first_started_at, last_outcome,"
            " last_heartbeat_at) VALUES ('maintenance-lifecycle', %s, %s, 'running', %s)",
            (T0, T0, beat),
        )
    clock = Clock()
    jobs = ClusterJobs(migrated_pool, clock)
    seen = []
    for at in (beat + RETRY_AFTER_FAILURE - SECOND, beat + RETRY_AFTER_FAILURE):
        clock.now = at
        outcome = jobs.run_if_due("maintenance-lifecycle", EVERY, lambda: None)
        seen.append("ran" if outcome.ran else outcome.skipped)
    assert seen == ["not due", "ran"]


def test_a_running_job_writes_its_heartbeat(
    migrated_pool: ConnectionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_jobs, "HEARTBEAT_EVERY", timedelta(milliseconds=20))
    clock = Clock()
    later = T0 + timedelta(minutes=7)

    def heartbeat() -> object:
        with migrated_pool.connection() as conn:
            row = conn.execute(
                "SELECT last_heartbeat_at FROM scheduled_jobs WHERE job = 'maintenance-index'"
            ).fetchone()
        return row[0] if row else None

    def work() -> object:
        assert heartbeat() == T0  # written with the start
        clock.now = later
        beaten = threading.Event()
        for _ in range(500):  # up to 10 s on a loaded machine
            if heartbeat() == later:
                beaten.set()
                break
            beaten.wait(0.02)
        return beaten.is_set()

    outcome = ClusterJobs(migrated_pool, clock).run_if_due("maintenance-index", EVERY, work)
    assert outcome.result is True
