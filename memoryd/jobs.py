"""Cluster-wide jobs (index drain), scheduled in every processor but run by one at a time.

APScheduler fires the job in each process; a Postgres advisory lock taken with try-lock lets
exactly one of them do the work, so adding processor instances never multiplies the job.
"""

from __future__ import annotations

import logging

from apscheduler.schedulers.background import BackgroundScheduler

from consumers.flush import BudgetPolicy
from memoryd import wiring
from store.errors import StoreError
from store.postgres import translated

log = logging.getLogger(__name__)
INDEX_DRAIN_LOCK = 0x6D656D6F72796432
INDEX_DRAIN_EVERY_S = 30


def drain_index_once(c: wiring.Core) -> int | None:
    """Index pending facts if no other process is doing it; None when the lock was taken."""
    with translated("index drain lock"), c.pool.connection() as conn:
        conn.autocommit = True
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", (INDEX_DRAIN_LOCK,)).fetchone()
        if not got or not got[0]:
            return None
        try:
            skip = c.settings.processor.budget_policy is BudgetPolicy.SKIP_EMBEDDINGS
            return wiring.indexer(c).drain_pending(skip_out_of_credit=skip)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (INDEX_DRAIN_LOCK,))
            conn.autocommit = False


def _drain_job(c: wiring.Core) -> None:
    try:
        n = drain_index_once(c)
    except StoreError as e:
        # The facts stay pending; the next tick tries again. The pending gauge shows the backlog.
        log.warning("index drain failed, retrying next tick: %s", e)
        return
    if n:
        log.info("indexed %d pending fact(s)", n)


def start_scheduler(c: wiring.Core) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(
        _drain_job,
        "interval",
        seconds=INDEX_DRAIN_EVERY_S,
        args=[c],
        id="index-drain",
        max_instances=1,
        coalesce=True,
    )
    scheduler.start()
    return scheduler
