"""Several users at once, never one user twice at once: in a processor, across processors.

The backend records when each call ran; the assertions are on overlap of those intervals,
never on wall-clock thresholds, so a loaded machine slows the test down but cannot fail it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from kafka import KafkaConsumer

from consumers.flush_result import FlushKind
from memoryd import wiring
from processors.consolidate import Consolidator
from processors.gate import WriteGate
from tests.support.builders import buffered, key_of, make_event
from tests.support.deployment import (
    Deployment,
    ProcessorThread,
    tuned,
    users_per_partition,
    wait_until,
)
from tests.support.fakes import RecordingBackend

pytestmark = pytest.mark.integration

LATENCY_S = 0.3


def consolidated_count(deployment: Deployment) -> int:
    return int(deployment.query("SELECT count(*) FROM consolidated_events")[0][0])


def events_per_succeeded_run(deployment: Deployment) -> dict[object, int]:
    rows = deployment.query(
        "SELECT e, count(*) FROM consolidation_runs, unnest(input_event_ids) e"
        " WHERE status = 'succeeded' GROUP BY e"
    )
    return {r[0]: r[1] for r in rows}


def test_users_are_consolidated_concurrently_and_one_user_never_twice_at_once(
    deployment: Deployment,
) -> None:
    users = [f"user{i}" for i in range(8)]
    # Four events per user and batches of two: each user has a second batch ready while its
    # first is in flight, which the processor must hold back.
    events = [make_event(u, f"{u} note number {n} about the launch", minutes=n) for u in users
              for n in range(4)]  # fmt: skip
    deployment.publish(events)
    backend = RecordingBackend(latency_s=LATENCY_S, rendezvous=4)
    tuned(deployment, concurrency=4, max_batch=2, max_wait_s=1.0).run_processor(backend)

    assert consolidated_count(deployment) == len(events)
    assert set(events_per_succeeded_run(deployment).values()) == {1}
    assert backend.same_user_overlaps() == []
    # Eight ready users, four workers: four calls ran at once, and never more.
    assert backend.max_overlap() == 4
    assert {c.user_id for c in backend.calls} == set(users)
    assert all(c.events <= 2 for c in backend.calls)


def test_two_processors_in_one_group_share_users_without_overlap(deployment: Deployment) -> None:
    partitions = 3
    users = users_per_partition("member", partitions, per_partition=4)
    settings = tuned(deployment, concurrency=2, max_batch=1, max_wait_s=0.2).settings
    first_backend = RecordingBackend(latency_s=LATENCY_S)
    second_backend = RecordingBackend(latency_s=LATENCY_S)
    wave_one = [make_event(u, f"{u} works on the Falcon project", minutes=0) for u in users]
    wave_two = [make_event(u, f"{u} prefers written status updates", minutes=1) for u in users]

    first = ProcessorThread(settings, first_backend).start()
    try:
        deployment.publish(wave_one)
        wait_until(lambda: first_backend.started >= 2, 60, "the first processor to flush")
        # The second member joins while the first has flushes in flight: a rebalance
        # revokes partitions under running batches.
        second = ProcessorThread(settings, second_backend).start()
        try:
            wait_until(
                lambda: (
                    bool(first.assignment())
                    and bool(second.assignment())
                    and first.assignment() | second.assignment() == set(range(partitions))
                ),
                60,
                "both processors to own partitions",
            )
            deployment.publish(wave_two)
            total = len(wave_one) + len(wave_two)
            wait_until(lambda: consolidated_count(deployment) == total, 60, "consolidation")
        finally:
            second.stop()
    finally:
        first.stop()

    runs = events_per_succeeded_run(deployment)
    assert set(runs) == {e.event_id for e in wave_one + wave_two}
    assert set(runs.values()) == {1}, "an event was consolidated by two runs"
    calls = RecordingBackend(calls=first_backend.calls + second_backend.calls)
    assert calls.same_user_overlaps() == []
    # After the rebalance both members did work.
    second_users = {c.user_id for c in second_backend.calls}
    assert second_users
    assert {c.user_id for c in first_backend.calls} - second_users
    failed = deployment.query("SELECT count(*) FROM consolidation_runs WHERE status <> 'succeeded'")
    assert failed == [(0,)]


def test_the_user_lock_serializes_two_flushers_of_the_same_user(deployment: Deployment) -> None:
    """Two instances that both believe they own a user (a rebalance in progress): the
    Postgres advisory lock makes the second wait, and it then finds nothing left to do."""
    events = [make_event("ada", "I work in engineering at Initech")]
    backend = RecordingBackend(latency_s=LATENCY_S)
    gate = threading.Barrier(2)

    def flush_once() -> FlushKind:
        with wiring.core(deployment.settings) as c:
            flusher = wiring.flusher(c, backend, Consolidator(WriteGate(None), c.prices))
            gate.wait(timeout=60)
            try:
                return flusher.flush(key_of("ada"), buffered(events), attempt=0).kind
            finally:
                flusher.close()

    with ThreadPoolExecutor(2) as pool:
        kinds = sorted(f.result() for f in [pool.submit(flush_once) for _ in range(2)])

    assert kinds == sorted([FlushKind.CONSOLIDATED, FlushKind.NOTHING_NEW])
    assert len(backend.calls) == 1
    assert backend.same_user_overlaps() == []
    assert consolidated_count(deployment) == 1


def test_events_buffered_when_a_rebalance_comes_are_read_again(deployment: Deployment) -> None:
    """A rebalance drops what is buffered. kafka-python keeps its fetch position for the
    partitions it gets straight back, so the processor must seek back to the first event it
    had not finished, or those events are skipped (and later commits pass them)."""
    users = users_per_partition("rebalanced", 3, per_partition=2)
    # Batches of two: the first event of each user waits in the buffer until the second.
    settings = tuned(deployment, max_batch=2, max_wait_s=120.0).settings
    first = [make_event(u, f"{u} joined the Falcon team", minutes=0) for u in users]
    second = [make_event(u, f"{u} prefers written updates", minutes=1) for u in users]
    backend = RecordingBackend()
    processor = ProcessorThread(settings, backend).start()
    try:
        wait_until(lambda: processor.assignment() == {0, 1, 2}, 60, "the processor's partitions")
        deployment.publish(first)
        wait_until(lambda: processor.buffered() == len(first), 60, "the first events buffered")
        # Another member joins (everything is revoked and reassigned) and leaves again.
        k = settings.kafka
        visitor = KafkaConsumer(
            k.topic, bootstrap_servers=k.bootstrap_servers, group_id=k.processor_group,
            enable_auto_commit=False,
        )  # fmt: skip

        def visitor_joined() -> bool:
            visitor.poll(timeout_ms=100)
            return bool(visitor.assignment())

        try:
            wait_until(visitor_joined, 60, "the visitor to join")
        finally:
            visitor.close()
        wait_until(lambda: processor.assignment() == {0, 1, 2}, 60, "the partitions back")
        deployment.publish(second)
        total = len(first) + len(second)
        wait_until(lambda: consolidated_count(deployment) == total, 60, "every event consolidated")
    finally:
        processor.stop()
    assert set(events_per_succeeded_run(deployment).values()) == {1}
    assert backend.same_user_overlaps() == []


def test_more_flushes_than_the_pool_can_lock_wait_instead_of_deadlocking(
    deployment: Deployment,
) -> None:
    """Each flush holds a connection for its memory lock and needs a second one meanwhile: with
    every pool connection held by a lock, nobody could go on. The composition root sizes the
    pool from the concurrency (a configured pool of 4 is raised), so all 8 flushes run at once
    and none deadlocks; the store's own cap (max_size - 2 lock holders) is the second guard."""
    users = [f"crowded{i}" for i in range(8)]
    deployment.publish([make_event(u, f"{u} works on the Falcon project") for u in users])
    postgres = deployment.settings.postgres.model_copy(update={"pool_max_size": 4})
    crowded = tuned(deployment, concurrency=8, max_wait_s=1.0)
    crowded = Deployment(crowded.settings.model_copy(update={"postgres": postgres}), crowded.dsn)
    # All 8 calls meet before going on: on a loaded machine threads start late, and 8 flushes
    # that can run at once would otherwise show a smaller overlap than they have.
    backend = RecordingBackend(latency_s=LATENCY_S, rendezvous=len(users))
    crowded.run_processor(backend)

    assert consolidated_count(deployment) == len(users)
    assert backend.max_overlap() == 8
    assert deployment.query("SELECT DISTINCT status FROM consolidation_runs") == [("succeeded",)]
