"""A cluster job's age is since it last succeeded, whatever its last run did: one that keeps
failing, or that a crash left running, grows old and MemorydMaintenanceStale can fire."""

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

    def check(c: wiring.Core) -> dict[str, float | None]:
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
        admin = runtime.kafka_admin(c.settings)
        try:
            replace(runtime.cluster_telemetry(c, admin, jobs), clock=clock).measure()
        finally:
            admin.close()
        age = "memoryd_cluster_job_age_seconds"
        return {
            job: c.registry.get_sample_value(age, {"cluster_job": job})
            for job in ("maintenance-dedupe", "maintenance-lifecycle", "maintenance-retention")
        }

    hours = {job: age and age / 3600 for job, age in deployment.with_core(check).items()}
    assert hours == {
        "maintenance-dedupe": 30.0,  # since it last succeeded, though its last run failed
        "maintenance-lifecycle": 29.0,  # never succeeded: since its first start
        "maintenance-retention": 28.0,  # left running by a crash
    }
