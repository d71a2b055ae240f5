"""Prometheus metrics of the operations side: cluster telemetry, health, maintenance, prices.

Cluster telemetry (freshness, consumer lag, the age of each cluster job) is measured by one
process per interval, whichever wins the job's lock. Each process exports only what it
measured itself recently: a value older than `expire_s` disappears instead of lingering, so
`max by (job)` over the processes reads the latest measurement and an alert sees a gap when
no process measures any more.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

Labels = tuple[str, ...]


class ExpiringGauge(Collector):
    """A gauge family whose samples are replaced as a whole and expire."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        expire_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._doc = documentation
        self._labels = list(labels)
        self._expire_s = expire_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._samples: Mapping[Labels, float] = {}
        self._at: float | None = None

    def publish(self, samples: Mapping[Labels, float]) -> None:
        with self._lock:
            self._samples = dict(samples)
            self._at = self._monotonic()

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self._doc, labels=self._labels)
        with self._lock:
            fresh = self._at is not None and self._monotonic() - self._at <= self._expire_s
            samples = dict(self._samples) if fresh else {}
        for labels, value in sorted(samples.items()):
            family.add_metric(list(labels), value)
        yield family


class TelemetryMetrics:
    def __init__(self, registry: CollectorRegistry, expire_s: float) -> None:
        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> ExpiringGauge:
            g = ExpiringGauge(name, doc, labels, expire_s)
            registry.register(g)
            return g

        self.freshness = gauge(
            "memoryd_freshness_seconds",
            "Age of the oldest logged event not yet consolidated (0 when none waits)",
        )
        self.pending = gauge("memoryd_events_pending", "Logged events waiting to be consolidated")
        self.parked = gauge(
            "memoryd_events_parked",
            "Logged events a failed or deferred run left on the dead-letter topic",
        )
        self.lag = gauge(
            "memoryd_consumer_lag_records",
            "Partition end offset minus the consumer group's committed offset",
            ("consumer", "partition"),
        )
        self.job_age = gauge(
            "memoryd_cluster_job_age_seconds",
            "Seconds since a cluster job last succeeded (since its first start if it never has)",
            ("cluster_job",),
        )
        self.job_failed = gauge(
            "memoryd_cluster_job_failed",
            "1 when the last run of a cluster job failed (or was left running by a crash)",
            ("cluster_job",),
        )
        self.maintenance_skipped = gauge(
            "memoryd_maintenance_skipped_memories",
            "Memories the last run of a maintenance job left for the next one (the store"
            " refused to change them, or an erasure of them was open)",
            ("cluster_job",),
        )
        self.erasures_open = gauge(
            "memoryd_erasures_open",
            "Erasures started and not completed (a crash or an outage left them midway)",
        )
        self.erasure_oldest_open = gauge(
            "memoryd_erasure_oldest_open_seconds",
            "Age of the oldest erasure started and not completed (0 when none is open)",
        )
        self.measurements = Counter(
            "memoryd_telemetry_measurements_total",
            "Cluster telemetry measurements by outcome (ok, or the part that failed)",
            ["outcome"],
            registry=registry,
        )


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        gauge = partial(Gauge, registry=registry)
        self.dependency_up = gauge(
            "memoryd_dependency_up",
            "1 when the dependency answered the last health check",
            ["dependency"],
        )
        self.ready = gauge("memoryd_ready", "1 when the process is ready (what /readyz answers)")


class MaintenanceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        counter = partial(Counter, registry=registry)
        self.changes = counter(
            "memoryd_maintenance_changes_total",
            "Facts changed by maintenance (vectors found lost or orphaned, for the index job),"
            " by job and rule",
            ["cluster_job", "rule"],
        )
        self.runs = counter(
            "memoryd_maintenance_runs_total",
            "Maintenance job runs by outcome",
            ["cluster_job", "outcome"],
        )
        self.context_logs_deleted = counter(
            "memoryd_context_logs_deleted_total", "Read audit rows deleted by retention"
        )


class PriceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        counter = partial(Counter, registry=registry)
        self.unpriced = counter(
            "memoryd_unpriced_model_uses_total",
            "Costs computed with the configured default price: the model has no price of its own",
            ["model"],
        )


def runtime_registry() -> CollectorRegistry:
    """A process's registry, with prometheus_client's standard families of the process
    (`process_*`: resident memory, CPU seconds, open files), the interpreter's collector
    (`python_gc_*`) and `python_info`, which a registry of one's own leaves out."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
        registry.register(collector)
    return registry
