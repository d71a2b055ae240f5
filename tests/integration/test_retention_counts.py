"""Retention deletes read audit rows a batch per transaction: a run that fails midway has
deleted the batches before the failure, and its record and metric count them."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from psycopg_pool import ConnectionPool

from memoryd.ops.config import MaintenanceSettings
from memoryd.ops.maintenance import MaintenanceRunner
from memoryd.ops.metrics import MaintenanceMetrics
from store.errors import DatabaseUnavailable
from store.write.maintenance_queries import MaintenanceQueries

pytestmark = pytest.mark.integration

BATCH = 10_000  # MaintenanceQueries.delete_context_logs's


def test_retention_failing_midway_counts_the_batches_it_deleted(
    migrated_pool: ConnectionPool,
) -> None:
    with migrated_pool.connection() as conn:
        conn.execute(
            "INSERT INTO context_logs (log_id, organization_id, user_id, query, memory_version,"
            " injected, retrieved, latency_ms, degraded, created_at)"
            " SELECT gen_random_uuid(), 'org-a', 'ada', 'q', 1, '{}', '[]', 1, false,"
            " now() - interval '100 days' FROM generate_series(1, %s)",
            (BATCH + 5,),
        )
        # The disk fills up during the second batch's DELETE.
        conn.execute("CREATE TABLE delete_statements (n int NOT NULL)")
        conn.execute("INSERT INTO delete_statements VALUES (0)")
        conn.execute(
            "CREATE FUNCTION second_delete_fails() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN UPDATE delete_statements SET n = n + 1;"
            " IF (SELECT n FROM delete_statements) > 1 THEN"
            "   RAISE EXCEPTION 'could not extend file' USING ERRCODE = 'disk_full';"
            " END IF; RETURN NULL; END $$"
        )
        conn.execute(
            "CREATE TRIGGER second_delete_fails AFTER DELETE ON context_logs"
            " FOR EACH STATEMENT EXECUTE FUNCTION second_delete_fails()"
        )
    registry = CollectorRegistry()
    core: Any = SimpleNamespace(pool=migrated_pool, clock=lambda: datetime.now(UTC))
    runner = MaintenanceRunner(core, MaintenanceSettings(), MaintenanceMetrics(registry))

    with pytest.raises(DatabaseUnavailable):
        runner.run("retention")

    run = MaintenanceQueries(migrated_pool).last_run("retention")
    assert run is not None
    assert (run.outcome, run.changes) == ("failed", {"context_logs_deleted": BATCH})
    assert registry.get_sample_value("memoryd_context_logs_deleted_total") == BATCH
    with migrated_pool.connection() as conn:
        assert conn.execute("SELECT count(*) FROM context_logs").fetchone() == (5,)
