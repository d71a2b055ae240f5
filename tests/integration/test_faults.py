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
from pydantic import SecretStr

from memoryd.redrive import redrive
from memoryd.settings import ChromaSettings, LlmSettings
from tests.support.chroma import DisposableChroma
from tests.support.deployment import Deployment
from tests.support.fake_gemini import FakeGemini, FakeReply
from tests.support.faults import (
    Pipeline,
    Producer,
    consolidated_count,
    expected_of,
    fault_settings,
    make_stream,
    pipeline,
    settled,
    wait_until,
)

# Minutes each on a loaded machine: above the suite's per-test timeout.
pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]

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
        # Each garbage record dead-lettered once by each consumer, across the kill.
        letters = 2 * len(GARBAGE)
        report = settled(settings, expected_of(events), pipeline=p, dead_letters=letters)
        assert done_at_kill < len(events), "the kill must land mid-stream"
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        assert report.dead_lettered == letters
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


def test_chroma_killed_and_restarted(
    deployment: Deployment, own_chroma: DisposableChroma, tmp_path: Path
) -> None:
    chroma = ChromaSettings(mode="http", url=own_chroma.url)
    settings = fault_settings(deployment).model_copy(update={"chroma": chroma})
    events = make_stream(users=6, per_user=10)
    with pipeline(settings, tmp_path) as p:
        wait_until(lambda: dependency_up(p, "chroma") == 1, 60, "chroma up")
        producer = Producer(deployment, events).start()
        wait_until(lambda: consolidated_count(deployment) >= 3, 60, "the first runs")
        own_chroma.kill()
        wait_until(lambda: dependency_up(p, "chroma") == 0, 60, "chroma reported down")
        producer.join()
        # Consolidation goes on without the index: facts wait in Postgres.
        wait_until(lambda: consolidated_count(deployment) == len(events), 120, "all consolidated")
        own_chroma.start(timeout=180)
        report = settled(settings, expected_of(events), pipeline=p)
        assert report.violations() == {}, report.summary()
        assert (report.expected, report.logged, report.consolidated) == (60, 60, 60)
        wait_until(lambda: dependency_up(p, "chroma") == 1, 60, "chroma reported up")
        # The index drain catches up: every fact version is in Chroma in the end.
        wait_until(lambda: pending_index(deployment) == 0, 90, "pending facts indexed")
        p.assert_healthy()


def test_llm_failing_then_redrive(deployment: Deployment, tmp_path: Path) -> None:
    # A refusal the provider gives every request alike and that waiting does not cure (a
    # region it does not serve): dead-lettered, then redriven once fixed. An overloaded
    # provider (503 for every memory) is waited out instead (test_consolidation_gemini).
    refusal = FakeReply.status(400, "User location is not supported for the API use.")
    with FakeGemini(default=refusal) as fake:
        llm = LlmSettings(
            backend="gemini", base_url=fake.url, api_key=SecretStr("k"), timeout_ms=5000
        )
        settings = fault_settings(deployment, max_attempts=2, backoff_base_s=0.05).model_copy(
            update={"llm": llm}
        )
        events = make_stream(users=3, per_user=4)
        with pipeline(settings, tmp_path) as p:
            deployment.publish(events)
            expected = expected_of(events)
            failing = settled(settings, expected, pipeline=p)
            # Every event gave up on and dead-lettered with its failed run, none consolidated.
            assert failing.violations() == {}, failing.summary()
            assert (failing.consolidated, failing.dead_lettered) == (0, len(events))
            failed_runs = deployment.query("SELECT count(*) FROM consolidation_runs")[0][0]
            assert failed_runs > 0
            fake.default = FakeReply.json(GOOD)
            assert redrive(settings, idle_s=2.0).redriven == len(events)
            wait_until(
                lambda: consolidated_count(deployment) == len(events), 120, "all consolidated"
            )
            report = settled(settings, expected, pipeline=p)
            assert report.violations() == {}, report.summary()
            assert (report.logged, report.consolidated) == (len(events), len(events))
            # Nothing redriven twice.
            assert redrive(settings, idle_s=1.0).redriven == 0
            p.assert_healthy()


GOOD = {
    "updated_working_memory": "Works on several projects this week.",
    "updated_scaffold": {"Role": "Engineer"},
    "facts": [
        {
            "op": "add",
            "content": "The user works on the billing API.",
            "type": "episodic",
            "confidence": 0.8,
            "salience": 0.5,
            "surface": "speak",
            "target_fact_id": None,
            "evidence": ["E1"],
        }
    ],
}


def dependency_up(p: Pipeline, dependency: str) -> float | None:
    return p["processor"].metric("memoryd_dependency_up", dependency=dependency)


def pending_index(deployment: Deployment) -> int:
    return int(deployment.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL")[0][0])
