"""The index drain and the resumption of open erasures, taken over by another process while
the first still runs (its lock connection dropped): both runs go on, and what they leave is
what one run would have left. Neither job is fenced by a run epoch (`memoryd.jobs` says why);
these show that it needs none."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, cast

import psycopg
import pytest

from domain.erasure import ErasureStatus
from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from memoryd import wiring
from memoryd.jobs import (
    ERASURE_RESUME_LOCK,
    INDEX_DRAIN_LOCK,
    drain_index_once,
    resume_erasures_once,
)
from store.chroma.reconnecting_index import ReconnectingIndex
from store.write.locks import memory_lock_key
from tests.support.builders import make_fact
from tests.support.deployment import (
    Deployment,
    end_lock_session_in,
    seed_core,
    topic_size,
    wait_until,
)
from tests.support.erasure import memory_row_counts, open_memory_erasure, rows

pytestmark = pytest.mark.integration

WAIT_S = 60.0
ADA = MemoryKey("org-a", "ada")


def terminate_lock_session(superuser_dsn: str, dsn: str, lock: int) -> None:
    """End the session that holds advisory lock `lock` (a bigint key)."""
    end_lock_session_in(superuser_dsn, dsn, lock)


def lock_waits(dsn: str) -> int:
    """How many sessions of dsn's database wait for an advisory lock."""
    [(n,)] = rows(
        dsn,
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    return int(n)


class StalledIndex:
    """The index, but its first upsert waits for `resume` after saying it was reached: a
    drain that read its pending facts, then stalled (a long GC pause, a slow embedder)."""

    def __init__(self, index: ReconnectingIndex) -> None:
        self._index = index
        self.reached, self.resume = threading.Event(), threading.Event()

    def upsert(self, facts: Sequence[Fact]) -> int:
        if not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(WAIT_S)
        return self._index.upsert(facts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)


def test_a_drain_overtaken_by_another_after_losing_its_lock_writes_nothing_stale(
    deployment: Deployment, postgres_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    fact = make_fact("ada", "Ada lives in Porto")

    def race(c: wiring.Core) -> tuple[int | None, int | None, dict[str, Any]]:
        seed_core(c, "ada", [fact], index=False)
        stalled = StalledIndex(c.index)
        first = replace(c, index=cast("ReconnectingIndex", stalled))
        with ThreadPoolExecutor(1) as pool:
            stale = pool.submit(drain_index_once, first)
            try:
                assert stalled.reached.wait(WAIT_S)  # it read version 1 and holds the lock
                terminate_lock_session(postgres_dsn, deployment.dsn, INDEX_DRAIN_LOCK)
                # A run makes version 2, and another process's drain takes the lock and
                # indexes it.
                seed_core(c, "ada", [replace(fact, status=FactStatus.STALE)], index=False)
                second = drain_index_once(c)
            finally:
                stalled.resume.set()
            # The first drain writes version 1 over version 2, finds its mark refused, and
            # writes the current version again.
            overtaken = stale.result(WAIT_S)
        stored = c.index.stored([fact.fact_id])[fact.fact_id]
        return overtaken, second, dict(stored.metadata)

    with caplog.at_level(logging.INFO, logger="consumers.indexer"):
        overtaken, second, metadata = deployment.with_core(race)
    assert (overtaken, second) == (0, 1)
    assert metadata["status"] == FactStatus.STALE.value
    # The stale drain did write after the takeover, and put back what it wrote over.
    assert "wrote 1 overtaken fact version(s) again" in caplog.messages
    assert deployment.query("SELECT version, indexed_at IS NOT NULL FROM memory_facts") == [
        (2, True)
    ]
    # Booked once, by the drain whose mark flipped the version.
    assert deployment.query(
        "SELECT count(*), sum(units) FROM credit_ledger WHERE operation = 'embedding'"
    ) == [(1, 1)]


def test_an_erasure_resumption_taken_over_after_losing_its_lock_is_finished_once(
    deployment: Deployment, postgres_dsn: str
) -> None:
    dsn = deployment.dsn

    def race(c: wiring.Core) -> tuple[int, int, ErasureStatus]:
        seed_core(c, "ada", [make_fact("ada", "Ada lives in Porto")])
        erasure_id = open_memory_erasure(c.erasures, ADA, c.subjects(ADA))  # a crash left it
        with (
            psycopg.connect(dsn, autocommit=True) as flush,
            ThreadPoolExecutor(2) as pool,
        ):
            # A flush of the memory holds its lock: each resumption waits for it in turn.
            flush.execute("SELECT pg_advisory_lock(%s)", (memory_lock_key(ADA),))
            try:
                first = pool.submit(resume_erasures_once, c, 0)
                wait_until(lambda: lock_waits(dsn) == 1, WAIT_S, "the first resumption to wait")
                terminate_lock_session(postgres_dsn, dsn, ERASURE_RESUME_LOCK)
                second = pool.submit(resume_erasures_once, c, 0)
                wait_until(lambda: lock_waits(dsn) == 2, WAIT_S, "the second resumption to wait")
            finally:
                flush.execute("SELECT pg_advisory_unlock(%s)", (memory_lock_key(ADA),))
            done = (first.result(WAIT_S), second.result(WAIT_S))
        record = c.erasures.get(erasure_id)
        assert record is not None
        return (*done, record.status)

    kafka = deployment.settings.kafka
    before = topic_size(kafka.bootstrap_servers, kafka.topic)
    # Each finished it as far as it found it: the one that came second found it completed.
    assert deployment.with_core(race) == (1, 1, ErasureStatus.COMPLETED)
    # One tombstone, not one per resumption.
    assert topic_size(kafka.bootstrap_servers, kafka.topic) - before == 1
    assert not any(memory_row_counts(dsn, ADA).values())
    assert deployment.query("SELECT count(*) FROM erasure_pending") == [(0,)]
