"""A cluster job's lock is held on a connection of its own: the job, however long it runs,
takes nothing from the pool the process's flushes and reads share, and still excludes every
other process for as long as it runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from store.migrate import migrate
from store.postgres import make_pool
from store.write.cluster_jobs import ClusterJobs, JobOutcome

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
EVERY = timedelta(hours=6)


def test_a_running_job_holds_its_lock_but_no_pooled_connection(fresh_database: str) -> None:
    pool = make_pool(fresh_database, max_size=1)  # the job's work needs the only one
    other = make_pool(fresh_database, max_size=1)  # another process's
    try:
        migrate(pool)
        here, there = ClusterJobs(pool, lambda: NOW), ClusterJobs(other, lambda: NOW)
        seen: list[JobOutcome[int]] = []

        def work() -> int:
            seen.append(there.run_if_due("maintenance-index", EVERY, lambda: 0, force=True))
            with pool.connection(timeout=3) as conn:
                row = conn.execute("SELECT 1").fetchone()
            return row[0] if row else 0

        outcome = here.run_if_due("maintenance-index", EVERY, work)
        assert (outcome.ran, outcome.result) == (True, 1)
        assert [(o.ran, o.skipped) for o in seen] == [(False, "locked")]
        # Released with the run: the next one (forced, as `memoryd maintenance run`) gets it.
        assert there.run_if_due("maintenance-index", EVERY, lambda: 2, force=True).result == 2
    finally:
        other.close()
        pool.close()
