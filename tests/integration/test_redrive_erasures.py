"""`memoryd redrive` never brings an erased memory's events back.

A redriven event lands after its memory's tombstone, where nothing tells it from a new one:
the letter's source offset is what says it was recorded before the erasure. The redrive read
a memory's cut-offs once per run and republished later, so an erasure that finished in
between let the events back in.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from consumers.dead_letter import DeadLetter, KafkaDeadLetterSink
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.redrive import redrive
from producers.contract import ContextEvent
from tests.support.builders import make_event
from tests.support.deployment import Deployment, topic_size

pytestmark = pytest.mark.integration


def _cut_off(deployment: Deployment, subject: str) -> None:
    """What an erasure records for the memory: everything before offset 100 is forgotten."""
    with psycopg.connect(deployment.dsn) as conn:
        conn.execute(
            "INSERT INTO memory_cutoffs (subject, topic, partition, cutoff, erasure_id)"
            " VALUES (%s, %s, 0, 100, gen_random_uuid())",
            (subject, deployment.settings.kafka.topic),
        )


def _waiting_for_a_lock(deployment: Deployment, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = deployment.query(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
        if waiting[0][0] > 0:
            return
        time.sleep(0.1)
    raise AssertionError("the redrive never waited for the memory's lock")


def test_letters_of_a_memory_erased_before_or_during_the_redrive_stay_put(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    k = deployment.settings.kafka
    erased = make_event("ada", "I live in Lisbon")  # erased before the redrive
    erasing = make_event("bob", "I live in Porto")  # erased while the redrive runs
    kept = make_event("cy", "I live in Faro")
    events: list[ContextEvent] = [erased, erasing, kept]
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        sink.send(
            [
                DeadLetter(
                    e.kafka_key, e.to_bytes(), "consolidate", "test", k.topic, 0, i, "refused"
                )
                for i, e in enumerate(events)
            ]
            # A letter that no longer validates (a stricter contract since) is left where it
            # is and logged; it stopped every redrive at itself.
            + [
                DeadLetter(
                    b"k", b'{"event_id": "x"}', "consolidate", "test", k.topic, 0, 3, "refused"
                )
            ],
            {},
            None,
        )
    finally:
        sink.close()
    bob = MemoryKey("org-a", "bob")
    subjects = deployment.with_core(
        lambda c: {e.user_id: c.subjects(MemoryKey(e.organization_id, e.user_id)) for e in events}
    )
    _cut_off(deployment, subjects["ada"])
    moved: list[int] = []

    def erase_bob_meanwhile(c: wiring.Core) -> None:
        # An erasure holds the memory's lock from its tombstone to its cut-offs.
        with c.memory.memory_lock(bob):
            worker = threading.Thread(
                target=lambda: moved.append(redrive(deployment.settings, idle_s=1.0))
            )
            worker.start()
            _waiting_for_a_lock(deployment)
            _cut_off(deployment, subjects["bob"])
        worker.join(timeout=120)

    deployment.with_core(erase_bob_meanwhile)
    assert moved == [1]
    assert topic_size(k.bootstrap_servers, k.topic) == 1  # cy's event only
    assert f"the letter of {k.topic}/0/3 no longer validates" in caplog.text
