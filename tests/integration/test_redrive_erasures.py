"""`memoryd redrive` never brings an erased memory's events back.

A redriven event lands after its memory's tombstone, where nothing tells it from a new one:
the letter's source offset is what says it was recorded before the erasure. The redrive read
a memory's cut-offs once per run and republished later, so an erasure that finished in
between let the events back in. Nor does it republish an event a fact erasure has redacted
in the log since: the flush drops it on arrival, and the letter still says what was erased.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any, cast

import psycopg
import pytest
from kafka import KafkaConsumer

from consumers.dead_letter import (
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    DeadLetter,
    KafkaDeadLetterSink,
)
from domain.erasure import REDACTION
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.erasure import ErasureRequest
from memoryd.redrive import ForgottenLetters, RedriveSummary, redrive
from producers.contract import ContextEvent
from store.errors import MemoryLockLost
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import make_event, make_fact
from tests.support.deployment import Deployment, end_memory_lock_session, seed_core, topic_size

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
    moved: list[RedriveSummary] = []

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
    assert moved == [RedriveSummary(redriven=1, settled_by_erasure=2)]
    assert topic_size(k.bootstrap_servers, k.topic) == 1  # cy's event only
    assert f"the letter of {k.topic}/0/3 no longer validates" in caplog.text


def _dead_letter(deployment: Deployment, events: Sequence[ContextEvent]) -> None:
    """The events as the processor parks them: letters of stage consolidate."""
    k = deployment.settings.kafka
    sink = KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "processor")
    try:
        letters = [
            DeadLetter(e.kafka_key, e.to_bytes(), "consolidate", "test", k.topic, 0, i, "refused")
            for i, e in enumerate(events)
        ]
        sink.send(letters, {}, None)
    finally:
        sink.close()


def _event_ids_on(bootstrap: str, topic: str) -> list[uuid.UUID]:
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        return [ContextEvent.from_bytes(r.value).event_id for r in consumer]
    finally:
        consumer.close()


def test_a_letter_of_an_event_a_fact_erasure_redacted_is_settled_not_redriven(
    deployment: Deployment,
) -> None:
    k = deployment.settings.kafka
    mira = MemoryKey("org-a", "mira")
    said = make_event("mira", "I keep a pet quokka named Bramble")
    other = make_event("mira", "I play the cello on Sundays", minutes=1)
    deployment.publish([said, other])
    deployment.run_log_writer()
    _dead_letter(deployment, [said, other])
    fact = make_fact("mira", said.content, source_event_ids=[said.event_id])

    def erase(c: wiring.Core) -> None:
        seed_core(c, "mira", [fact])
        with closing(wiring.publisher(c.settings)) as pub:
            wiring.eraser(c, pub).erase_fact(mira, fact.fact_id, ErasureRequest("t", "asked"))

    deployment.with_core(erase)
    assert deployment.query(
        "SELECT event_id FROM context_events WHERE content = %s", (REDACTION,)
    ) == [(said.event_id,)]
    summary = redrive(deployment.settings, idle_s=1.0)
    assert summary == RedriveSummary(redriven=1, settled_by_erasure=1)
    # The erased text's letter is not back on the event topic: the cello's is, once more.
    on_topic = _event_ids_on(k.bootstrap_servers, k.topic)
    assert Counter(on_topic) == {said.event_id: 1, other.event_id: 2}
    # Settled, it is committed past like the redriven one: a second redrive finds nothing.
    assert redrive(deployment.settings, idle_s=1.0) == RedriveSummary()


class LockLostAfterCutoffs:
    """The memory store, whose lock session ends once the redrive read the cut-offs."""

    def __init__(self, memory: PostgresMemoryStore, end_session: Callable[[], None]) -> None:
        self._memory, self._end_session = memory, end_session

    def forgotten_before(self, subject: str) -> dict[tuple[str, int], int]:
        cutoffs = self._memory.forgotten_before(subject)
        self._end_session()
        return cutoffs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._memory, name)


def test_a_redrive_that_lost_its_memory_lock_publishes_nothing(
    deployment: Deployment, postgres_dsn: str
) -> None:
    """Read under the lock, the cut-offs hold only while it is held: once its session dropped,
    an erasure may take the lock and tombstone, and events published after would survive it."""
    event = make_event("ada", "I live in Lisbon")
    ada = MemoryKey(event.organization_id, event.user_id)
    headers = {HEADER_TOPIC: b"memoryd.events", HEADER_PARTITION: b"0", HEADER_OFFSET: b"0"}
    published: list[ContextEvent] = []

    def end_session() -> None:
        end_memory_lock_session(postgres_dsn, deployment.dsn, ada)

    def run(c: wiring.Core) -> None:
        memory = cast("PostgresMemoryStore", LockLostAfterCutoffs(c.memory, end_session))
        with pytest.raises(MemoryLockLost):
            ForgottenLetters(memory, c.subjects).republish([(event, headers)], published.extend)

    deployment.with_core(run)
    assert published == []
