"""Jobs that run once per cluster: a Postgres advisory lock and the time of the last run.

Every processor schedules every cluster job. A tick takes the job's advisory lock with
try-lock (a process that does not get it skips the tick), then runs the job only if no
process in the cluster started it less than its interval ago (`scheduled_jobs`). So N
processors run a job once per interval, never twice at once, and a crashed owner is replaced
on the next tick of any other. A run that failed is due again `RETRY_AFTER_FAILURE` after it
ended (or after its interval, if shorter), not a whole interval after it started. So is a run
a crash left "running", `RETRY_AFTER_FAILURE` after its last heartbeat: the process running a
job writes one every `HEARTBEAT_EVERY`. Its lock cannot tell: a lock connection dropped while
the run goes on frees the lock too.

Nor can the lock keep a second run from starting once it is freed so (a process cut off from
Postgres for minutes, a forced run): every run takes the next `run_epoch` as it starts, and
each transaction of the run (`store.postgres.fenced`) first holds the job's row FOR SHARE
where the epoch is still its own. A later run's increment waits for the first run's open
transactions, and every transaction of the first run after it is refused (`JobFenced`): the
first run stops at its next transaction, having written nothing the second run did not see.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from store.errors import JobFenced, StoreError
from store.postgres import fenced, held_lock, transaction

log = logging.getLogger(__name__)

JOB_LOCK_NAMESPACE = 0x4A4F42  # "JOB": apart from the user locks ("MEM") and the index drain
# Soon enough that an outage of a few minutes does not cost a 6-hour job its turn, rare
# enough that a job failing every time does not hammer what it fails on.
RETRY_AFTER_FAILURE = timedelta(minutes=5)
# Well inside RETRY_AFTER_FAILURE: a run that misses a few beats (Postgres away) is not taken
# for a dead one.
HEARTBEAT_EVERY = timedelta(seconds=30)
_T = TypeVar("_T")


def job_lock_key(job: str) -> int:
    return (JOB_LOCK_NAMESPACE << 32) | zlib.crc32(job.encode())


@dataclass(frozen=True)
class JobOutcome(Generic[_T]):
    ran: bool
    result: _T | None = None
    skipped: str = ""  # why not: "locked" (another process runs it) or "not due"


@dataclass(frozen=True)
class JobState:
    job: str
    last_started_at: datetime
    last_finished_at: datetime | None
    last_outcome: str | None
    last_succeeded_at: datetime | None
    first_started_at: datetime
    last_error: str | None = None
    last_heartbeat_at: datetime | None = None

    def failed(self, now: datetime) -> bool:
        """Its last run raised, or was left running by a process that is gone (its heartbeat
        stopped as long ago as a failed run waits to be tried again)."""
        if self.last_outcome == "failed":
            return True
        silent = _silent_for(now, self.last_started_at, self.last_heartbeat_at)
        return self.last_outcome == "running" and silent >= RETRY_AFTER_FAILURE

    def age_s(self, now: datetime) -> float:
        """Seconds since the job last succeeded (since it first started, if it never has)."""
        return max(0.0, (now - (self.last_succeeded_at or self.first_started_at)).total_seconds())


def _silent_for(now: datetime, started_at: datetime, heartbeat_at: datetime | None) -> timedelta:
    """How long a running run has given no sign of life (a run of before the heartbeats: since
    it started)."""
    return now - (heartbeat_at or started_at)


def _due(
    now: datetime,
    every: timedelta,
    started_at: datetime,
    outcome: str | None,
    finished_at: datetime | None,
    heartbeat_at: datetime | None,
) -> bool:
    if outcome == "failed" and finished_at is not None:
        return now - finished_at >= min(every, RETRY_AFTER_FAILURE)
    if outcome == "running":  # its process died when its heartbeat stopped
        return _silent_for(now, started_at, heartbeat_at) >= min(every, RETRY_AFTER_FAILURE)
    return now - started_at >= every


def _check_epoch(job: str, epoch: int, conn: psycopg.Connection[Any]) -> None:
    """Refuse the transaction unless run `epoch` is still the job's latest. FOR SHARE: a run
    starting meanwhile waits to increment the epoch until this transaction ends, so nothing
    the transaction writes lands after another run started."""
    row = conn.execute(
        "SELECT 1 FROM scheduled_jobs WHERE job = %s AND run_epoch = %s FOR SHARE", (job, epoch)
    ).fetchone()
    if row is None:
        raise JobFenced(f"cluster job {job}: run {epoch} was superseded by a later run")


class ClusterJobs:
    def __init__(self, pool: ConnectionPool, clock: Callable[[], datetime]) -> None:
        self._pool = pool
        self._clock = clock

    def run_if_due(
        self, job: str, every: timedelta, fn: Callable[[], _T], *, force: bool = False
    ) -> JobOutcome[_T]:
        """Run `fn` if this process gets the lock and the job is due (or `force`)."""
        with held_lock(self._pool, job_lock_key(job), f"cluster job {job}") as got:
            if not got:
                return JobOutcome(ran=False, skipped="locked")
            return self._run_locked(job, every, fn, force=force)

    def _run_locked(
        self, job: str, every: timedelta, fn: Callable[[], _T], *, force: bool
    ) -> JobOutcome[_T]:
        now = self._clock()
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT last_started_at, last_outcome, last_finished_at, last_heartbeat_at"
                " FROM scheduled_jobs WHERE job = %s",
                (job,),
            ).fetchone()
            if row is not None and not force and not _due(now, every, *row):
                return JobOutcome(ran=False, skipped="not due")
            started = conn.execute(
                "INSERT INTO scheduled_jobs (job, last_started_at, first_started_at,"
                " last_outcome, last_heartbeat_at, run_epoch) VALUES (%s, %s, %s, 'running', %s, 1)"
                " ON CONFLICT (job) DO UPDATE SET last_started_at = EXCLUDED.last_started_at,"
                " last_finished_at = NULL, last_outcome = 'running', last_error = NULL,"
                " last_heartbeat_at = EXCLUDED.last_heartbeat_at,"
                " run_epoch = scheduled_jobs.run_epoch + 1 RETURNING run_epoch",
                (job, now, now, now),
            ).fetchone()
        epoch: int = started[0] if started else 0
        try:
            with self._beating(job, epoch), fenced(partial(_check_epoch, job, epoch)):
                result = fn()
        except BaseException as e:
            self._finish(job, epoch, "failed", f"{type(e).__name__}: {e}")
            raise
        self._finish(job, epoch, "succeeded", None)
        return JobOutcome(ran=True, result=result)

    @contextmanager
    def _beating(self, job: str, epoch: int) -> Iterator[None]:
        """The run's heartbeat, written every HEARTBEAT_EVERY while the block runs."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_EVERY.total_seconds()):
                try:
                    with transaction(self._pool) as conn:
                        conn.execute(
                            "UPDATE scheduled_jobs SET last_heartbeat_at = %s WHERE job = %s"
                            " AND run_epoch = %s AND last_outcome = 'running'",
                            (self._clock(), job, epoch),
                        )
                except StoreError as e:  # the next beat may get through; the run goes on
                    log.warning("cluster job %s: heartbeat not written: %s", job, e)

        beater = threading.Thread(target=beat, name=f"heartbeat-{job}", daemon=True)
        beater.start()
        try:
            yield
        finally:
            stop.set()
            beater.join()

    def _finish(self, job: str, epoch: int, outcome: str, error: str | None) -> None:
        # Only its own run's: a superseded run's end says nothing of the run now going on.
        with transaction(self._pool) as conn:
            conn.execute(
                "UPDATE scheduled_jobs SET last_finished_at = %(at)s, last_outcome = %(outcome)s,"
                " last_error = %(error)s, last_succeeded_at = CASE WHEN %(outcome)s = 'succeeded'"
                " THEN %(at)s ELSE last_succeeded_at END WHERE job = %(job)s"
                " AND run_epoch = %(epoch)s",
                {
                    "at": self._clock(),
                    "outcome": outcome,
                    "error": error,
                    "job": job,
                    "epoch": epoch,
                },
            )

    def states(self) -> list[JobState]:
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT job, last_started_at, last_finished_at, last_outcome, last_succeeded_at,"
                " first_started_at, last_error, last_heartbeat_at FROM scheduled_jobs ORDER BY job"
            ).fetchall()
        return [JobState(*r) for r in rows]
