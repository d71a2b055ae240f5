"""Faults injected into a running pipeline (real Kafka, Postgres, Chroma; the log writer and
the processor as processes), each followed by the invariants counted: every produced event in
the log once, every logged event consolidated once or dead-lettered with a reason, nothing
doubled, memory the fold of its runs; and both processes still running, healthy again, having
said they were degraded while the fault lasted.

The faults here use the session's services; those that stop a broker or a database use
instances of their own (`test_faults_services.py`).
"""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from tests.support.deployment import Deployment
from tests.support.faults import (
    Producer,
    consolidated_count,
    expected_of,
    fault_settings,
    make_stream,
    pipeline,
    settled,
    wait_until,
)

pytestmark = pytest.mark.integration

GARBAGE = [b"not json", b'{"event_id": 1}']


def test_sigkill_of_the_log_writer_and_the_processor_mid_stream(
    deployment: Deployment, tmp_path: Path
) -> None:
    settings = fault_settings(deployment)
    events = make_stream(users=6, per_user=10)
    with pipeline(settings, tmp_path) as p:
        producer = Producer(deployment, events).start()
        deployment.produce_raw(GARBAGE)
        wait_until(lambda: consolidated_count(deployment) >= 6, 60, "the first runs")
        p["log-writer"].kill()
        p["processor"].kill()
        done_at_kill = consolidated_count(deployment)
        # Restarted as a supervisor would; what they held in memory is gone.
        p["log-writer"].start()
        p["processor"].start()
        producer.join()
        report = settled(settings, expected_of(events), pipeline=p)
        assert done_at_kill < len(events), "the kill must land mid-stream"
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        # Each garbage record dead-lettered once by each consumer, across the kill.
        assert report.dead_lettered == 2 * len(GARBAGE)
        p.assert_healthy()


def test_connections_killed_with_pg_terminate_backend(
    deployment: Deployment, tmp_path: Path
) -> None:
    settings = fault_settings(deployment)
    events = make_stream(users=6, per_user=10)
    dbname = psycopg.conninfo.conninfo_to_dict(deployment.dsn)["dbname"]
    killed = 0
    with pipeline(settings, tmp_path) as p:
        producer = Producer(deployment, events).start()
        wait_until(lambda: consolidated_count(deployment) >= 3, 60, "the first runs")
        # Every connection of both processes, again and again while they work.
        for _ in range(15):
            with psycopg.connect(deployment.dsn, autocommit=True) as conn:
                killed += len(
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()",
                        (dbname,),
                    ).fetchall()
                )
            time.sleep(0.3)
        producer.join()
        report = settled(settings, expected_of(events), pipeline=p)
        assert killed > 0
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        assert report.dead_lettered == 0
        p.assert_healthy()
