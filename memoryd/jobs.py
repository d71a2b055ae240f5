"""Cluster-wide jobs (index drain, unfinished erasures), scheduled in every processor but run
by one at a time.

APScheduler fires the job in each process; a Postgres advisory lock taken with try-lock lets
exactly one of them do the work, so adding processor instances never multiplies the job.

Unlike the maintenance jobs (`store.write.cluster_jobs`), neither is fenced by a run epoch:
the lock only saves doing the work twice, and a run that lost it (its connection dropped)
while another took over does nothing the other can be hurt by. Each is built to run beside
writers it never excludes. The drain beside every processor's `IndexQueue`, which indexes the
same facts unlocked: a mark is made only at the version that was written, an overtaken
version is written again, and the ledger entry's id comes from the versions marked
(`consumers.indexer`). An erasure's resumption beside the API's and the CLI's erasures: every
step runs under the memory's lock, reads the audited status again under it, and the status
only moves forward (`memoryd.erasure`). A fence would refuse the stale run's transactions and
none of its Chroma or Kafka calls, which those rules already make harmless.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import closing
from datetime import timedelta
from typing import TypeVar

from apscheduler.schedulers.background import BackgroundScheduler

from consumers.flush import BudgetPolicy
from memoryd import wiring
from producers.errors import ProducerError
from store.errors import StoreError
from store.postgres import held_lock

log = logging.getLogger(__name__)
INDEX_DRAIN_LOCK = 0x6D656D6F72796432
INDEX_DRAIN_EVERY_S = 30
ERASURE_RESUME_LOCK = 0x6D656D6F72796433
ERASURE_RESUME_EVERY_S = 60
# An erasure younger than this is most likely still running in the process that started it,
# which holds its memory's lock: it is resumed only if that lock is free, never waited for. One
# the API accepted while a flush held its memory runs nowhere, and holds back the memory's
# flushes until it is finished: this way the first tick after the flush finishes it.
ERASURE_RESUME_AFTER_S = 120

T = TypeVar("T")


def _once(c: wiring.Core, lock: int, job: Callable[[], T]) -> T | None:
    """Run `job` if no other process holds `lock`; None when it was taken."""
    with held_lock(c.pool, lock, f"advisory lock {lock:#x}") as got:
        return job() if got else None


def _holds_out_of_credit(c: wiring.Core) -> bool:
    """Whether the budget policy leaves the facts of users out of credit unindexed."""
    return c.settings.processor.budget_policy is BudgetPolicy.SKIP_EMBEDDINGS


def drain_index_once(c: wiring.Core) -> int | None:
    """Index pending facts if no other process is doing it; None when the lock was taken."""
    skip = _holds_out_of_credit(c)
    return _once(
        c, INDEX_DRAIN_LOCK, lambda: wiring.indexer(c).drain_pending(skip_out_of_credit=skip)
    )


def resume_erasures_once(c: wiring.Core, older_than_s: float = ERASURE_RESUME_AFTER_S) -> int:
    """Finish the open erasures (a crash's, or accepted while their memory was busy), those
    younger than `older_than_s` only if their memory's lock is free; returns how many.

    Until it is finished, an open erasure holds back the flushes of its memory.
    """
    if not c.erasures.pending():
        return 0
    young_since = c.clock() - timedelta(seconds=older_than_s)

    def resume() -> int:
        with closing(wiring.publisher(c.settings)) as pub:
            return len(wiring.eraser(c, pub).resume_pending(young_since, keep_going=True))

    return _once(c, ERASURE_RESUME_LOCK, resume) or 0


def _drain_job(c: wiring.Core) -> None:
    try:
        n = drain_index_once(c)
        if n is None:
            # Another processor drains. Every one still sets the gauge, so that a processor
            # that stopped draining does not go on exporting the backlog it last saw.
            wiring.indexer(c).publish_pending(skip_out_of_credit=_holds_out_of_credit(c))
    except StoreError as e:
        # The facts stay pending; the next tick tries again. The pending gauge shows the backlog.
        log.warning("index drain failed, retrying next tick: %s", e)
        return
    if n:
        log.info("indexed %d pending fact(s)", n)


def _erasure_job(c: wiring.Core) -> None:
    try:
        n = resume_erasures_once(c)
    except (StoreError, ProducerError) as e:
        # The erasure stays open (audited, its memory's flushes held); the next tick retries.
        log.warning("resuming erasures failed, retrying next tick: %s", e)
        return
    if n:
        log.info("finished %d open erasure(s)", n)


def start_scheduler(c: wiring.Core) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(timezone="UTC")
    for job, job_id, every_s in (
        (_erasure_job, "erasure-resume", ERASURE_RESUME_EVERY_S),
        (_drain_job, "index-drain", INDEX_DRAIN_EVERY_S),
    ):
        scheduler.add_job(
            job, "interval", seconds=every_s, args=[c], id=job_id, max_instances=1, coalesce=True
        )
    scheduler.start()
    return scheduler
