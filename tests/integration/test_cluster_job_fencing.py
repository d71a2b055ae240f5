"""A cluster job whose lock connection dropped while it ran is fenced: once another process has
taken the lock and started the job, every later transaction of the first run is refused, and
its end does not overwrite the state the second run left.

The lock alone cannot do it: Postgres frees a session lock with its session (a pooler
restarted, an idle timeout, `pg_terminate_backend`), and the process, whose work goes through
other connections, goes on running the job."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from store.errors import JobFenced
from store.migrate import migrate
from store.postgres import make_pool, transaction
from store.write.cluster_jobs import JOB_LOCK_NAMESPACE, RETRY_AFTER_FAILURE, ClusterJobs
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import make_fact, seed
from tests.support.deployment import end_advisory_lock_session

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
EVERY = timedelta(hours=6)
JOB = "maintenance-retention"
WAIT_S = 30.0


@pytest.fixture
def pools(fresh_database: str) -> Iterator[tuple[ConnectionPool, ConnectionPool]]:
    """Two processes' pools on one database, and a table for what a run of the job writes."""
    first, second = make_pool(fresh_database, max_size=2), make_pool(fresh_database, max_size=2)
    try:
        migrate(first)
        with transaction(first) as conn:
            conn.execute("CREATE TABLE job_steps (runner text, step int)")
        yield first, second
    finally:
        second.close()
        first.close()


def step_in_a_transaction(pool: ConnectionPool, runner: str, step: int) -> None:
    # As most store adapters write: one `transaction` of the pool.
    with transaction(pool) as conn:
        conn.execute("INSERT INTO job_steps VALUES (%s, %s)", (runner, step))


def step_as_a_memory_run(pool: ConnectionPool, runner: str, step: int) -> None:
    # As maintenance changes a memory: a run applied in one pipelined transaction.
    user = f"{runner}-{step}"
    seed(PostgresMemoryStore(pool), user, [make_fact(user, f"{user} was here")])
    step_in_a_transaction(pool, runner, step)  # the run's user id is a step too


Step = Callable[[ConnectionPool, str, int], None]


def terminate_lock_session(superuser_dsn: str, dbname: str) -> None:
    """End the session that holds the job's advisory lock, as a pooler restart would."""
    end_advisory_lock_session(superuser_dsn, dbname, JOB_LOCK_NAMESPACE, zlib.crc32(JOB.encode()))


@pytest.mark.parametrize("write_step", [step_in_a_transaction, step_as_a_memory_run])
def test_a_run_that_lost_its_lock_is_refused_once_another_run_started(
    pools: tuple[ConnectionPool, ConnectionPool],
    postgres_dsn: str,
    fresh_database: str,
    write_step: Step,
) -> None:
    first, second = pools
    started, resume = threading.Event(), threading.Event()
    outcome: list[object] = []

    def stale_work() -> str:
        write_step(first, "first", 1)
        started.set()
        assert resume.wait(WAIT_S)
        write_step(first, "first", 2)  # after the second run started: must be refused
        return "done"

    def run_first() -> None:
        try:
            outcome.append(ClusterJobs(first, lambda: NOW).run_if_due(JOB, EVERY, stale_work))
        except JobFenced as e:
            outcome.append(e)

    runner = threading.Thread(target=run_first, name="first-runner")
    runner.start()
    try:
        assert started.wait(WAIT_S)
        terminate_lock_session(
            postgres_dsn, psycopg.conninfo.conninfo_to_dict(fresh_database)["dbname"]
        )

        # Its heartbeat silent long enough (a partition), the run is due again elsewhere.
        later = NOW + RETRY_AFTER_FAILURE
        taken = ClusterJobs(second, lambda: later).run_if_due(
            JOB, EVERY, lambda: [write_step(second, "second", s) for s in (1, 2)]
        )
        assert taken.ran
    finally:
        resume.set()
        runner.join(WAIT_S)
    assert not runner.is_alive()

    with transaction(first) as conn:
        steps = conn.execute("SELECT runner, step FROM job_steps ORDER BY 1, 2").fetchall()
        users = conn.execute("SELECT user_id FROM user_memory ORDER BY 1").fetchall()
        state = conn.execute(
            "SELECT last_outcome, last_started_at, last_finished_at FROM scheduled_jobs"
            " WHERE job = %s",
            (JOB,),
        ).fetchone()
    # The first run's step before the takeover stands; the one after never landed.
    assert steps == [("first", 1), ("second", 1), ("second", 2)]
    # The first run's failure is not written over the second run's success.
    assert state == ("succeeded", later, later)
    if write_step is step_as_a_memory_run:
        assert [u for (u,) in users] == ["first-1", "second-1", "second-2"]
    # The first run stopped at its first transaction after the takeover.
    assert len(outcome) == 1
    assert isinstance(outcome[0], JobFenced)
