"""A cluster job whose run failed is due again a few minutes after the failure, not a whole
interval after it started; so is one a crash left running; one that succeeded waits its
interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from psycopg_pool import ConnectionPool

from memoryd import wiring
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
