"""The freshness probe on real Postgres, for events a run that changed nothing listed.

A failed or deferred run parks its events on the dead-letter topic: they wait for an
operator and are counted apart. A discarded run's events (a bisection's probe, a run planned
on a version another run changed first) still wait for the pipeline.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import SubjectHasher
from domain.model import RunStatus
from store.write.event_log import PostgresEventLog
from store.write.freshness import SETTLE_S, FreshnessProbe
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import make_event, make_run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("status", "pending", "parked"),
    [(RunStatus.DISCARDED, 1, 0), (RunStatus.FAILED, 0, 1), (RunStatus.DEFERRED, 0, 1)],
)
def test_only_a_failed_or_deferred_run_parks_its_events(
    migrated_pool: ConnectionPool, status: RunStatus, pending: int, parked: int
) -> None:
    run = make_run("ada", seq=1, version=1, status=status).run
    (event_id,) = run.input_event_ids
    event = make_event("ada", "I moved to Porto", minutes=0).model_copy(
        update={"event_id": event_id}
    )
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(event, None)])
    with migrated_pool.connection() as conn:
        # Logged long enough ago for the watermark to pass it, were it taken as settled. The
        # log is append-only but to the erase path, whose switch the back-dating borrows.
        conn.execute("SELECT set_config('memoryd.erasure', 'on', true)")
        conn.execute(
            "UPDATE context_events SET recorded_at = recorded_at - %s",
            (timedelta(seconds=2 * SETTLE_S),),
        )
    PostgresMemoryStore(migrated_pool).record_run(run)

    probe = FreshnessProbe(migrated_pool)
    for _ in range(2):  # the watermark left by the first measure keeps a waiting event
        freshness = probe.measure()
        assert (freshness.pending, freshness.parked) == (pending, parked)
        assert (freshness.oldest_pending_age_s > SETTLE_S) == bool(pending)
