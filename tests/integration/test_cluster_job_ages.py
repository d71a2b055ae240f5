"""A cluster job's age is since it last succeeded, whatever its last run did: one that keeps
failing, or that a crash left running, grows old and MemorydMaintenanceStale can fire. A run a
crash left running (no heartbeat for minutes) counts as failed, as one that raised does."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from memoryd import wiring
from memoryd.ops import runtime
from store.write.cluster_jobs import ClusterJobs
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def fail() -> None:
    raise RuntimeError("the job failed")


def test_job_ages_count_from_the_last_success_or_the_first_start(deployment: Deployment) -> None:
    clock = Clock()

    def check(c: wiring.Core) -> dict[str, tuple[float | None, float | None]]:
        jobs = ClusterJobs(c.pool, clock)
        jobs.run_if_due("maintenance-dedupe", HOUR, lambda: None)  # succeeds at T0
        for job in ("maintenance-dedupe", "maintenance-lifecycle"):  # then fail at T0 + 1 h
            clock.now = T0 + HOUR
            with pytest.raises(RuntimeError):
                jobs.run_if_due(job, HOUR, fail)
        clock.now = T0 + 2 * HOUR
        with c.pool.connection() as conn:  # a crash in the middle of a run
            conn.execute(
                "INSERT INTO scheduled_jobs (job, last_started_at, first_started_at, last_outcome)"
                " VALUES ('maintenance-retention', %s, %s, 'running')",
                (clock.now, clock.now),
            )
        clock.now = T0 + 30 * HOUR
        with c.pool.connection() as conn:  # still running, its heartbeat a moment old
            conn.execute(
                "INSERT INTO scheduled_jobs (job, last_started_at, first_started_at, last_outcome,"
                " last_heartbeat_at) VALUES ('maintenance-index', %s, %s, 'running', %s)",
                (T0, T0, clock.now - timedelta(seconds=20)),
            )
        admin = runtime.kafka_admin(c.settings)
        try:
            replace(runtime.cluster_telemetry(c, admin, jobs), clock=clock).measure()
        finally:
            admin.close()
        age, failed = "memoryd_cluster_job_age_seconds", "memoryd_cluster_job_failed"
        return {
            job: (
                c.registry.get_sample_value(age, {"cluster_job": job}),
                c.registry.get_sample_value(failed, {"cluster_job": job}),
            )
            for job in (
                "maintenance-dedupe",
                "maintenance-lifecycle",
                "maintenance-retention",
                "maintenance-index",
            )
        }

    seen = deployment.with_core(check)
    hours = {job: age and age / 3600 for job, (age, _) in seen.items()}
    assert hours == {
        "maintenance-dedupe": 30.0,  # since it last succeeded, though its last run failed
        "maintenance-lifecycle": 29.0,  # never succeeded: since its first start
        "maintenance-retention": 28.0,  # left running by a crash
        "maintenance-index": 30.0,  # running since T0, never succeeded
    }
    assert {job: failed for job, (_, failed) in seen.items()} == {
        "maintenance-dedupe": 1.0,
        "maintenance-lifecycle": 1.0,
        "maintenance-retention": 1.0,  # its process is gone: no heartbeat for 28 hours
        "maintenance-index": 0.0,  # still beating
    }
