"""The cluster jobs every processor schedules: telemetry and maintenance.

APScheduler fires them in every processor; `ClusterJobs.run_if_due` lets one process at a
time run each, once per interval for the whole cluster.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from functools import partial

from apscheduler.schedulers.background import BackgroundScheduler

from consumers.lag import KafkaUnavailable
from memoryd.ops.maintenance import JOBS, MaintenanceRunner
from memoryd.ops.telemetry import TELEMETRY_JOB, ClusterTelemetry
from store.errors import StoreError
from store.write.cluster_jobs import ClusterJobs

log = logging.getLogger(__name__)
# A maintenance tick checks whether the job is due at most this often.
MAINTENANCE_TICK_S = 60.0
# Ticks fire, and runs start, a little early or late. A job found due only a full interval
# after its last start would often be found "not due" a moment too early and wait a whole
# tick more: when the tick period is the interval, half the runs are lost. So it is due this
# share of a tick period before (telemetry's 0.8 of its interval is the same margin).
DUE_MARGIN = 0.2


def _telemetry_tick(jobs: ClusterJobs, telemetry: ClusterTelemetry, every_s: float) -> None:
    try:
        # 0.8: a process ticking every `every_s` finds the job due each time despite jitter.
        jobs.run_if_due(TELEMETRY_JOB, timedelta(seconds=every_s * 0.8), telemetry.measure)
    except (StoreError, KafkaUnavailable) as e:
        # The gauges expire, and the gap is what the MemorydFreshnessUnknown alert sees.
        log.warning("cluster telemetry failed, retrying next tick: %s", e)


def _maintenance_tick(jobs: ClusterJobs, runner: MaintenanceRunner, job: str, due_s: float) -> None:
    try:
        jobs.run_if_due(f"maintenance-{job}", timedelta(seconds=due_s), partial(runner.run, job))
    except StoreError as e:
        # Recorded as failed (scheduled_jobs, maintenance_runs); the next due tick retries.
        log.error("maintenance %s failed: %s", job, e, extra={"cluster_job": job})


def add_cluster_jobs(
    scheduler: BackgroundScheduler,
    jobs: ClusterJobs,
    telemetry: ClusterTelemetry,
    telemetry_every_s: float,
    maintenance: MaintenanceRunner | None,
    maintenance_every_s: float,
) -> None:
    scheduler.add_job(
        _telemetry_tick,
        "interval",
        seconds=telemetry_every_s,
        args=[jobs, telemetry, telemetry_every_s],
        id="cluster-telemetry",
        max_instances=1,
        coalesce=True,
    )
    if maintenance is None:
        return
    tick_s = min(MAINTENANCE_TICK_S, maintenance_every_s)
    due_s = maintenance_every_s - DUE_MARGIN * tick_s
    for job in JOBS:
        scheduler.add_job(
            _maintenance_tick,
            "interval",
            seconds=tick_s,
            args=[jobs, maintenance, job, due_s],
            id=f"maintenance-{job}",
            max_instances=1,
            coalesce=True,
        )
