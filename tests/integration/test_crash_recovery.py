"""SIGKILL the processor in the middle of a run, restart it: every event consolidated once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from memoryd import wiring
from memoryd.sample_stream import generate_sample_events
from memoryd.settings import Settings
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration


def settings_env(settings: Settings) -> dict[str, str]:
    k, p = settings.kafka, settings.processor
    return {
        **os.environ,
        "MEMORYD_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "MEMORYD_KAFKA__TOPIC": k.topic,
        "MEMORYD_KAFKA__DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "MEMORYD_KAFKA__PROCESSOR_GROUP": k.processor_group,
        "MEMORYD_KAFKA__SESSION_TIMEOUT_MS": str(k.session_timeout_ms),
        "MEMORYD_POSTGRES__DSN": settings.postgres.dsn,
        "MEMORYD_CHROMA__MODE": "embedded",
        "MEMORYD_CHROMA__PATH": str(settings.chroma.path),
        "MEMORYD_PROCESSOR__MAX_BATCH": str(p.max_batch),
        "MEMORYD_PROCESSOR__MAX_WAIT_S": str(p.max_wait_s),
        "MEMORYD_PROCESSOR__CONCURRENCY": str(p.concurrency),
        "MEMORYD_METRICS__ENABLED": "false",
    }


def wait_for_runs(deployment: Deployment, at_least: int, timeout_s: float = 90.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [(runs,)] = deployment.query("SELECT count(*) FROM consolidation_runs")
        if runs >= at_least:
            return int(runs)
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} runs after {timeout_s}s")


def test_sigkill_mid_run_then_restart_consolidates_every_event_exactly_once(
    deployment: Deployment,
) -> None:
    settings = deployment.settings.model_copy(
        update={
            "processor": deployment.settings.processor.model_copy(
                update={"max_batch": 4, "max_wait_s": 0.2, "concurrency": 2}
            )
        }
    )
    deployment.settings = settings
    events = generate_sample_events()
    deployment.publish(events)
    assert deployment.run_log_writer() == len(events)

    child = subprocess.Popen(
        [sys.executable, "-m", "memoryd.cli", "processor"],
        env=settings_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_runs(deployment, at_least=3)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    [(done_at_kill,)] = deployment.query("SELECT count(*) FROM consolidated_events")
    assert 0 < done_at_kill < len(events), "the kill must land in the middle of the work"

    deployment.run_processor()

    logged = [r[0] for r in deployment.query("SELECT event_id FROM context_events")]
    consumed = [r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")]
    assert sorted(consumed) == sorted(logged) == sorted(e.event_id for e in events)

    # No run applied twice: every succeeded run advanced its user's version by exactly one,
    # and the events the runs say they consumed are each consumed once.
    per_user_runs = dict(
        deployment.query(
            "SELECT user_id, count(*) FROM consolidation_runs WHERE status = 'succeeded'"
            " GROUP BY user_id"
        )
    )
    versions = dict(deployment.query("SELECT user_id, version FROM user_memory"))
    assert versions == per_user_runs
    run_inputs = Counter(
        event_id
        for (ids,) in deployment.query(
            "SELECT input_event_ids FROM consolidation_runs WHERE status = 'succeeded'"
        )
        for event_id in ids
    )
    assert set(run_inputs) == set(logged)
    assert max(run_inputs.values()) == 1

    # No fact twice: one row per (user, scope, content), and one Chroma entry per fact.
    duplicates = deployment.query(
        "SELECT user_id, coalesce(connection_id, ''), lower(content), count(*)"
        " FROM memory_facts GROUP BY 1, 2, 3 HAVING count(*) > 1"
    )
    assert duplicates == []
    [(ledger_dupes,)] = deployment.query(
        "SELECT count(*) FROM (SELECT run_id FROM credit_ledger WHERE operation = 'llm'"
        " GROUP BY run_id HAVING count(*) > 1) d"
    )
    assert ledger_dupes == 0

    # The facts the killed process wrote but never indexed are indexed once drained; the
    # index then holds each fact under its own id, and nothing else.
    def indexed(c: wiring.Core) -> tuple[int, set[str]]:
        wiring.indexer(c).drain_pending()
        ids = [r[0] for r in deployment.query("SELECT fact_id FROM memory_facts")]
        return c.index.count(), {str(i) for i in c.index.stored(ids)}

    facts = {str(r[0]) for r in deployment.query("SELECT fact_id FROM memory_facts")}
    assert facts
    assert deployment.with_core(indexed) == (len(facts), facts)
    assert deployment.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL") == [(0,)]
