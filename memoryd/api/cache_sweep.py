"""The API process's sweep of its injection cache."""

from __future__ import annotations

from apscheduler.schedulers.background import BackgroundScheduler

from store.read.context_service import ContextService


def cache_sweeper(service: ContextService, every_s: float) -> BackgroundScheduler:
    """Drop cached injections of memories erased or changed by another process, every
    `every_s`: the bound on how long erased content stays in this process's memory."""
    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(
        service.sweep_cache,
        "interval",
        seconds=every_s,
        id="injection-cache-sweep",
        max_instances=1,
        coalesce=True,
    )
    scheduler.start()
    return scheduler
