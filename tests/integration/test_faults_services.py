"""Faults that stop a service or take its privileges away: the Kafka broker stopped for longer
than the session timeout, Postgres stopped and restarted (both on instances of the test's own,
so no other test sees them go), and the application's database role losing its INSERT
privilege for a while (the cheap stand-in for a disk full or a permission error).

After each: the invariants counted, both processes still running, healthy again, and having
said they were degraded while it lasted (see test_faults.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from memoryd.dev import LocalKafka, LocalPostgres, free_port
from store.migrate import migrate
from store.postgres import make_pool
from tests.support.deployment import Deployment, deployment_settings
from tests.support.faults import (
    SESSION_TIMEOUT_MS,
    consolidated_count,
    expected_of,
    fault_settings,
    make_stream,
    pipeline,
    settled,
    wait_until,
)
from tests.support.services import started

# Minutes each on a loaded machine: above the suite's per-test timeout.
pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]
# What the application role may no longer do while its privileges are revoked.
WRITES = ("context_events", "consolidation_runs", "consolidated_events", "memory_facts")


@pytest.fixture
def own_postgres(postgres_home: Path) -> Iterator[LocalPostgres]:
    with started(
        lambda: LocalPostgres(postgres_home, free_port(), for_tests=True, stop_on_exit=True), 120.0
    ) as postgres:
        yield postgres


def migrated(dsn: str) -> str:
    pool = make_pool(dsn, max_size=2)
    try:
        migrate(pool)
    finally:
        pool.close()
    return dsn


def dependency_up(p: object, role: str, dependency: str) -> float | None:
    return p[role].metric("memoryd_dependency_up", dependency=dependency)  # type: ignore[index]


def test_broker_stopped_longer_than_the_session_timeout(
    own_kafka: LocalKafka, fresh_database: str, tmp_path: Path
) -> None:
    topic, dlq = f"events-{uuid.uuid4().hex[:8]}", f"dlq-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=own_kafka.bootstrap)
    try:
        admin.create_topics([NewTopic(t, 3, 1) for t in (topic, dlq)])
    finally:
        admin.close()
    deployment = Deployment(
        deployment_settings(
            own_kafka.bootstrap, migrated(fresh_database), topic, dlq, tmp_path / "chroma"
        ),
        fresh_database,
    )
    settings = fault_settings(deployment)
    first, second = make_stream(users=6, per_user=5, prefix="a"), make_stream(6, 5, "b")
    with pipeline(settings, tmp_path) as p:
        deployment.publish(first)
        wait_until(lambda: consolidated_count(deployment) >= 3, 60, "the first runs")
        own_kafka.stop()
        for role in ("log-writer", "processor"):
            wait_until(lambda r=role: dependency_up(p, r, "kafka") == 0, 60, f"{role}: kafka down")
        time.sleep(2 * SESSION_TIMEOUT_MS / 1000)  # every member's session has expired
        assert p.all_alive(), p.logs()
        own_kafka.start(timeout=180)
        deployment.publish(second)
        report = settled(settings, expected_of([*first, *second]), pipeline=p)
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        p.assert_healthy(timeout_s=90)


def test_postgres_stopped_and_restarted(
    deployment: Deployment, own_postgres: LocalPostgres, tmp_path: Path
) -> None:
    dsn = migrated(own_postgres.dsn)
    db = Deployment(
        deployment.settings.model_copy(
            update={"postgres": deployment.settings.postgres.model_copy(update={"dsn": dsn})}
        ),
        dsn,
    )
    settings = fault_settings(db)
    first, second = make_stream(users=6, per_user=5, prefix="a"), make_stream(6, 5, "b")
    with pipeline(settings, tmp_path) as p:
        db.publish(first)
        wait_until(lambda: consolidated_count(db) >= 3, 60, "the first runs")
        own_postgres.stop()
        db.publish(second)  # the stream goes on into Kafka meanwhile
        for role in ("log-writer", "processor"):
            wait_until(lambda r=role: p.degraded(r) == 1, 120, f"{role} degraded", p[role])
        wait_until(lambda: dependency_up(p, "processor", "postgres") == 0, 30, "postgres down")
        assert p.all_alive(), p.logs()
        own_postgres.start(timeout=120)
        report = settled(settings, expected_of([*first, *second]), pipeline=p)
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        assert report.dead_lettered == 0
        p.assert_healthy()


def test_privileges_revoked_then_granted_again(deployment: Deployment, tmp_path: Path) -> None:
    role = f"app_{uuid.uuid4().hex[:8]}"
    admin = deployment.dsn
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for what in ("ALL TABLES", "ALL SEQUENCES", "ALL FUNCTIONS"):
            privilege = "EXECUTE" if what == "ALL FUNCTIONS" else "ALL"
            conn.execute(
                sql.SQL(f"GRANT {privilege} ON {what} IN SCHEMA public TO {{}}").format(
                    sql.Identifier(role)
                )
            )
    params = conninfo_to_dict(deployment.dsn)
    params["user"] = role
    app = deployment.settings.postgres.model_copy(update={"dsn": make_conninfo("", **params)})
    settings = fault_settings(deployment).model_copy(update={"postgres": app})
    first, second = make_stream(users=6, per_user=5, prefix="a"), make_stream(6, 5, "b")

    def grant(verb: str) -> None:
        tables = sql.SQL(", ").join(sql.Identifier(t) for t in WRITES)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL(f"{verb} INSERT ON {{}} {'TO' if verb == 'GRANT' else 'FROM'} {{}}").format(
                    tables, sql.Identifier(role)
                )
            )

    try:
        with pipeline(settings, tmp_path) as p:
            deployment.publish(first)
            wait_until(lambda: consolidated_count(deployment) >= 3, 60, "the first runs")
            grant("REVOKE")
            deployment.publish(second)
            for r in ("log-writer", "processor"):
                wait_until(lambda r=r: p.degraded(r) == 1, 120, f"{r} degraded", p[r])
            assert p.all_alive(), p.logs()
            grant("GRANT")
            report = settled(settings, expected_of([*first, *second]), pipeline=p)
            assert report.violations() == {}, report.summary()
            assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
            # Refused writes were waited out, not dead-lettered.
            assert report.dead_lettered == 0
            p.assert_healthy()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
