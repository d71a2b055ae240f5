"""Cluster telemetry: freshness, consumer lag, cluster-job ages, the memories maintenance
left for its next run, and erasures left open, measured by one process.

Measured once per `telemetry_every_s` in the whole cluster (see store.write.cluster_jobs):
these are properties of the cluster, not of a process, and N processors asking the brokers
and Postgres the same question every few seconds would only add load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from consumers.lag import ConsumerLagProbe, KafkaUnavailable
from memoryd.ops.maintenance import JOBS
from memoryd.ops.metrics import TelemetryMetrics
from store.errors import StoreError
from store.write.cluster_jobs import ClusterJobs
from store.write.erasure_log import PostgresErasureLog
from store.write.freshness import FreshnessProbe
from store.write.maintenance_queries import MaintenanceQueries

log = logging.getLogger(__name__)
TELEMETRY_JOB = "telemetry"


@dataclass(frozen=True)
class ClusterTelemetry:
    freshness: FreshnessProbe
    lag: ConsumerLagProbe
    jobs: ClusterJobs
    erasures: PostgresErasureLog
    metrics: TelemetryMetrics
    clock: Callable[[], datetime]
    maintenance: MaintenanceQueries

    def measure(self) -> None:
        """Publish what can be measured; a part that fails is counted and left to expire."""
        m = self.metrics
        ok = True
        try:
            fresh = self.freshness.measure()
            m.freshness.publish({(): fresh.oldest_pending_age_s})
            m.pending.publish({(): float(fresh.pending)})
            m.parked.publish({(): float(fresh.parked)})
            self._publish_jobs()
            erasures = self.erasures.open_erasures()
            m.erasures_open.publish({(): float(erasures.count)})
            m.erasure_oldest_open.publish({(): erasures.oldest_age_s})
        except StoreError as e:
            ok = False
            m.measurements.labels("postgres_failed").inc()
            log.warning("freshness, job ages and open erasures not measured: %s", e)
        try:
            lags = self.lag.measure()
            m.lag.publish({(x.consumer, str(x.partition)): float(x.lag) for x in lags})
        except KafkaUnavailable as e:
            ok = False
            m.measurements.labels("kafka_failed").inc()
            log.warning("consumer lag not measured: %s", e)
        if ok:
            m.measurements.labels("ok").inc()

    def _publish_jobs(self) -> None:
        now = self.clock()
        ages: dict[tuple[str, ...], float] = {}
        failed: dict[tuple[str, ...], float] = {}
        for state in self.jobs.states():
            if state.job == TELEMETRY_JOB:
                continue
            failed[(state.job,)] = 1.0 if state.failed(now) else 0.0
            # Whatever the last run did (failed, still running, left running by a crash).
            ages[(state.job,)] = state.age_s(now)
        self.metrics.job_age.publish(ages)
        self.metrics.job_failed.publish(failed)
        # A memory that fails every run is left by every run (and holds back how far dedupe
        # looks back); the log names it, this says it is there.
        skipped = self.maintenance.last_skipped(JOBS)
        self.metrics.maintenance_skipped.publish(
            {(f"maintenance-{job}",): float(n) for job, n in skipped.items()}
        )
