"""The long-running processes with their operations port: log writer, processor, API.

Each serves /metrics, /healthz and /readyz (the API also on its own port), checks its
dependencies in the background, and the processor runs the cluster jobs. The CLI runs them
with a signal-driven stop event; tests run them in threads with their own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from kafka.admin import KafkaAdminClient

from consumers.lag import ConsumerLagProbe, KafkaAdmin
from consumers.liveness import ConsumerLiveness
from memoryd import wiring
from memoryd.jobs import start_scheduler
from memoryd.ops import heap
from memoryd.ops.health import Check, HealthMonitor, Role
from memoryd.ops.http import OpsServer
from memoryd.ops.maintenance import MaintenanceRunner
from memoryd.ops.metrics import HealthMetrics, MaintenanceMetrics, TelemetryMetrics
from memoryd.ops.scheduler import add_cluster_jobs
from memoryd.ops.telemetry import ClusterTelemetry
from memoryd.settings import Settings
from processors.schema import ConsolidationBackend
from producers.kafka_clients import open_client
from store.errors import EmbeddingModelMismatch, VectorIndexUnavailable
from store.read.read_metrics import given_up
from store.write.cluster_jobs import ClusterJobs
from store.write.freshness import FreshnessProbe
from store.write.maintenance_queries import MaintenanceQueries

if TYPE_CHECKING:
    from memoryd.api.balanced_accept import SharedListener


log = logging.getLogger(__name__)


def refuse_another_models_index(c: wiring.Core) -> None:
    """Stops a processor or an API at start-up on a collection of another embedding model, so
    a roll-out with the wrong `MEMORYD_EMBEDDING_MODEL` fails before it serves. A Chroma that
    does not answer is left to the health checks: a process may start during an outage."""
    try:
        c.index.check_model()
    except EmbeddingModelMismatch:
        raise
    except VectorIndexUnavailable as e:
        log.warning(
            "chroma did not answer at start-up; the embedding model is checked later: %s", e
        )


def kafka_admin(settings: Settings) -> KafkaAdmin:
    timeout_ms = int(settings.ops.health_timeout_s * 1000)

    def make() -> KafkaAdminClient:
        return open_client(
            KafkaAdminClient,
            bootstrap_servers=settings.kafka.bootstrap_servers,
            client_id="memoryd-ops",
            request_timeout_ms=max(timeout_ms, 1000),
            bootstrap_timeout_ms=max(timeout_ms, 1000),
            reconnect_backoff_max_ms=2000,
        )

    return KafkaAdmin(make)


def postgres_check(c: wiring.Core) -> Check:
    timeout = c.settings.ops.health_timeout_s

    def probe() -> None:
        with c.pool.connection(timeout=timeout) as conn:
            conn.execute("SELECT 1")

    return Check("postgres", probe)


def dependency_checks(c: wiring.Core, admin: KafkaAdmin, *, chroma: bool) -> list[Check]:
    checks = [postgres_check(c), Check("kafka", admin.ping)]
    if chroma:
        checks.append(Check("chroma", c.index.count, Role.DEGRADES))
    return checks


@contextmanager
def ops_port(
    c: wiring.Core,
    port: int,
    checks: Sequence[Check],
    consumer: ConsumerLiveness | None = None,
) -> Iterator[HealthMonitor]:
    """The health monitor, and the metrics/health port when metrics are enabled."""
    monitor = HealthMonitor(checks, c.settings.ops, HealthMetrics(c.registry), consumer).start()
    server = None
    if c.settings.metrics.enabled and port:
        server = OpsServer(c.settings.metrics.host, port, c.registry, monitor).start()
    try:
        yield monitor
    finally:
        if server is not None:
            _last_scrape(c)
            server.stop()
        monitor.stop()


def _last_scrape(c: wiring.Core) -> None:
    """Rows given up are counted as the process stops: without one more scrape the count,
    and the alert on it, would go with the process."""
    wait_s = c.settings.metrics.final_scrape_s
    dropped = given_up(c.registry)
    if dropped and wait_s:
        log.warning(
            "%d read-path row(s) given up: metrics stay up %.0f s for a last scrape",
            dropped,
            wait_s,
        )
        time.sleep(wait_s)


def run_log_writer(c: wiring.Core, stop: threading.Event) -> None:
    admin = kafka_admin(c.settings)
    writer = wiring.log_writer(c)
    checks = dependency_checks(c, admin, chroma=False)
    try:
        with ops_port(c, c.settings.metrics.log_writer_port, checks, writer.liveness):
            heap.settle()
            writer.run(stop)
    finally:
        admin.close()


def cluster_telemetry(c: wiring.Core, admin: KafkaAdmin, jobs: ClusterJobs) -> ClusterTelemetry:
    k = c.settings.kafka
    lag = ConsumerLagProbe(
        admin, k.topic, {"log-writer": k.log_writer_group, "processor": k.processor_group}
    )
    metrics = TelemetryMetrics(c.registry, expire_s=3 * c.settings.ops.telemetry_every_s)
    return ClusterTelemetry(
        FreshnessProbe(c.pool),
        lag,
        jobs,
        c.erasures,
        metrics,
        c.clock,
        MaintenanceQueries(c.pool),
    )


def run_processor(
    c: wiring.Core, stop: threading.Event, backend: ConsolidationBackend | None = None
) -> None:
    s = c.settings
    refuse_another_models_index(c)
    admin = kafka_admin(s)
    processor = wiring.processor(c, backend)
    jobs = ClusterJobs(c.pool, c.clock)
    maintenance = None
    if s.maintenance.enabled:
        maintenance = MaintenanceRunner(c, s.maintenance, MaintenanceMetrics(c.registry))
    checks = dependency_checks(c, admin, chroma=True)
    try:
        with ops_port(c, s.metrics.processor_port, checks, processor.liveness):
            scheduler = start_scheduler(c)
            # The candidate search's memory entries hold users' texts and vectors: erased ones
            # leave within a sweep, as from the API's caches.
            scheduler.add_job(
                wiring.sweep_candidate_entries,
                "interval",
                seconds=s.read_path.cache_sweep_s,
                args=[c],
                id="candidate-entries-sweep",
                max_instances=1,
                coalesce=True,
            )
            add_cluster_jobs(
                scheduler,
                jobs,
                cluster_telemetry(c, admin, jobs),
                s.ops.telemetry_every_s,
                maintenance,
                s.maintenance.every_s,
                c.clock(),
            )
            try:
                processor.run(stop)
            finally:
                scheduler.shutdown(wait=False)
    finally:
        admin.close()


def run_api(c: wiring.Core, *, listener: SharedListener | None = None) -> None:
    """uvicorn until SIGTERM; /healthz and /readyz on the API port and the metrics port.

    A worker of several (`memoryd.api.serve`) takes its share of the connections on the shared
    `listener` and serves its metrics on `metrics.api_port + listener.index`."""
    import uvicorn  # noqa: PLC0415 - api process only

    from memoryd.api.balanced_accept import BalancedServer  # noqa: PLC0415

    s = c.settings
    refuse_another_models_index(c)
    admin = kafka_admin(s)
    checks = dependency_checks(c, admin, chroma=True)
    index = 0 if listener is None else listener.index
    port = s.metrics.api_port + index if s.metrics.api_port else 0
    try:
        with ops_port(c, port, checks) as monitor, wiring.api_app(c, monitor) as app:
            config = uvicorn.Config(app, host=s.api.host, port=s.api.port, log_config=None)
            heap.settle(s.api.gc_thresholds)
            server = (
                uvicorn.Server(config) if listener is None else BalancedServer(config, listener)
            )
            server.run()
    finally:
        admin.close()
