"""The cluster jobs every processor schedules: telemetry and maintenance.

APScheduler fires them in every processor; `ClusterJobs.run_if_due` lets one process at a
time run each, once per interval for the whole cluster.

The maintenance jobs tick at the same period but not on the same tick: the k-th of `JOBS`
first ticks k/len(JOBS) of a tick period after the first (`first_tick_offsets_s`: a quarter
of a minute apart by default). On a fresh cluster, or one back after a pause longer than the
interval, every job is due at once; started on one tick they would take their locks,
connections and Postgres at the same moment. Each job keeps its phase, and its next run is
due an interval after its own start, so they stay apart.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
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


def first_tick_offsets_s(tick_s: float) -> dict[str, float]:
    """How long after the first maintenance tick each job first ticks: `JOBS` spread evenly
    over one tick period, in their order."""
    return {job: k * tick_s / len(JOBS) for k, job in enumerate(JOBS)}


def add_cluster_jobs(
    scheduler: BackgroundScheduler,
    jobs: ClusterJobs,
    telemetry: ClusterTelemetry,
    telemetry_every_s: float,
    maintenance: MaintenanceRunner | None,
    maintenance_every_s: float,
    now: datetime,
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
    for job, offset_s in first_tick_offsets_s(tick_s).items():
        scheduler.add_job(
            _maintenance_tick,
            "interval",
            seconds=tick_s,
            next_run_time=now + timedelta(seconds=tick_s + offset_s),
            args=[jobs, maintenance, job, due_s],
            id=f"maintenance-{job}",
            max_instances=1,
            coalesce=True,
        )
