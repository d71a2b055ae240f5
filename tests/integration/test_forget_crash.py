"""`memoryd forget` SIGKILLed midway, run again: it completes with the receipt of the erasure it
started (one tombstone, the counts of what was there), and asked again, the same receipt.

The kill lands at a chosen step, not by luck: the test holds the memory's log lock (which the
erase transaction needs), so the forget waits inside Postgres with its tombstone recorded;
for the later step the test also freezes Chroma, lets Postgres finish, and kills the forget
while it waits for Chroma.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from memoryd import wiring
from memoryd.settings import ChromaSettings, Settings
from store.write.locks import log_lock_key
from tests.support.builders import key_of, make_event
from tests.support.chroma import DisposableChroma
from tests.support.deployment import Deployment, topic_size, wait_until
from tests.support.erasure import find_in_tables, memory_row_counts, rows, waiting_on_a_lock

pytestmark = pytest.mark.integration

KEY = key_of("mira", "org-a")


def forget_env(settings: Settings) -> dict[str, str]:
    k = settings.kafka
    return {
        **os.environ,
        "MEMORYD_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "MEMORYD_KAFKA__TOPIC": k.topic,
        "MEMORYD_KAFKA__DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "MEMORYD_POSTGRES__DSN": settings.postgres.dsn,
        "MEMORYD_CHROMA__MODE": "http",
        "MEMORYD_CHROMA__URL": settings.chroma.url,
        "MEMORYD_METRICS__ENABLED": "false",
    }


def forget(settings: Settings, *extra: str, user: str = "mira") -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "memoryd.cli", "forget", "--org", "org-a", user, *extra]
    return subprocess.Popen(
        argv, env=forget_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def receipt_of(child: subprocess.Popen[str]) -> Any:
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return json.loads(out)


def audit_status(dsn: str) -> list[str]:
    return [r[0] for r in rows(dsn, "SELECT status FROM erasure_audit ORDER BY id")]


@pytest.mark.parametrize("kill_at", ["tombstoned", "postgres_erased"])
def test_forget_killed_midway_completes_with_the_same_receipt(
    deployment: Deployment, own_chroma: DisposableChroma, kill_at: str
) -> None:
    settings = deployment.settings.model_copy(
        update={"chroma": ChromaSettings(mode="http", url=own_chroma.url)}
    )
    deployment.settings = settings
    texts = [f"I visited the quokka island #{i}" for i in range(12)]
    # A twin with the same observations, forgotten without a crash, for comparison.
    events = [
        make_event(user, t, minutes=i) for user in ("mira", "twin") for i, t in enumerate(texts)
    ]
    deployment.publish([*events, make_event("noor", texts[0])])
    deployment.run_both()
    deployment.with_core(lambda c: wiring.indexer(c).drain_pending())
    expected = memory_row_counts(deployment.dsn, KEY)
    vectors = deployment.with_core(lambda c: c.index.count(KEY))
    assert expected["memory_facts"] > 0
    assert vectors == expected["memory_facts"]
    records_before = topic_size(settings.kafka.bootstrap_servers, settings.kafka.topic)

    with psycopg.connect(deployment.dsn, autocommit=True) as blocker:
        blocker.execute("SELECT pg_advisory_lock(%s)", (log_lock_key(KEY),))
        child = forget(settings, "--reason", "GDPR art. 17")
        try:
            wait_until(lambda: waiting_on_a_lock(deployment.dsn), 60, "forget to wait in Postgres")
            assert audit_status(deployment.dsn) == ["tombstoned"]
            if kill_at == "postgres_erased":
                own_chroma.freeze()
                blocker.execute("SELECT pg_advisory_unlock(%s)", (log_lock_key(KEY),))
                wait_until(
                    lambda: audit_status(deployment.dsn) == ["postgres_erased"],
                    60,
                    "Postgres to be erased",
                )
        finally:
            child.send_signal(signal.SIGKILL)
            child.communicate(timeout=30)  # reaps it and closes its pipes
            own_chroma.thaw()
    assert child.returncode == -signal.SIGKILL
    assert audit_status(deployment.dsn) == [kill_at]
    erased_before_kill = memory_row_counts(deployment.dsn, KEY)["memory_facts"] == 0
    assert erased_before_kill == (kill_at == "postgres_erased")

    receipt = receipt_of(forget(settings))  # no request id: it resumes the open erasure
    assert audit_status(deployment.dsn) == ["completed"]
    assert receipt["scope"] == "memory"
    assert receipt["removed"]["postgres"] == {
        t: n for t, n in expected.items() if t not in ("credit_ledger", "erasure_pending")
    }
    assert receipt["removed"]["anonymised"] == {"credit_ledger": expected["credit_ledger"]}
    assert receipt["removed"]["chroma"] == {"vectors": vectors}
    # One tombstone: the resumed run did not publish another.
    records = topic_size(settings.kafka.bootstrap_servers, settings.kafka.topic)
    assert records == records_before + 1
    assert deployment.with_core(lambda c: c.index.count(KEY)) == 0
    # The stored receipt is the one printed; nothing is left open to resume.
    erasures = subprocess.run(
        [sys.executable, "-m", "memoryd.cli", "erasures", "--org", "org-a", "mira"],
        env=forget_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (stored,) = json.loads(erasures.stdout)
    assert stored["digest"] == stored["stored_digest"] == receipt["digest"]
    assert receipt_of(forget(settings, "--resume")) == []
    # What an erasure that was never interrupted reports for the same observations.
    twin = receipt_of(forget(settings, user="twin"))
    assert twin["removed"] == receipt["removed"]
    assert find_in_tables(deployment.dsn, ["quokka island #5"]) == {}  # noor's is #0
