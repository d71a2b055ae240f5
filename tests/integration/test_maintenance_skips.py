"""The memories each maintenance job's last run left for the next one are a gauge of the
cluster telemetry: a memory that fails every run shows, not only in the log."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from memoryd import wiring
from memoryd.ops import runtime
from store.write.cluster_jobs import ClusterJobs
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def test_the_memories_each_jobs_last_run_left_are_measured(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> dict[str, float | None]:
        queries = MaintenanceQueries(c.pool)
        for job, skipped in (("dedupe", 2), ("lifecycle", 1), ("dedupe", 1), ("lifecycle", 0)):
            queries.record_run(
                MaintenanceRunRow(uuid.uuid4(), job, T0, "succeeded", 1, {}, {}, None, skipped)
            )
        admin = runtime.kafka_admin(c.settings)
        try:
            runtime.cluster_telemetry(c, admin, ClusterJobs(c.pool, c.clock)).measure()
        finally:
            admin.close()
        return {
            job: c.registry.get_sample_value(
                "memoryd_maintenance_skipped_memories", {"cluster_job": job}
            )
            for job in ("maintenance-dedupe", "maintenance-lifecycle", "maintenance-retention")
        }

    assert deployment.with_core(check) == {
        "maintenance-dedupe": 1.0,  # its last run's, not the one before
        "maintenance-lifecycle": 0.0,
        "maintenance-retention": None,  # never ran
    }
