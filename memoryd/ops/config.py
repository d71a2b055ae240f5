"""Settings of the operations side: health checks, cluster telemetry, maintenance jobs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class OpsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # How often each process checks its dependencies (Postgres, Kafka, Chroma) for /readyz
    # and the memoryd_dependency_up gauges.
    health_interval_s: float = Field(default=5.0, gt=0)
    # A dependency check that takes longer than this counts as down.
    health_timeout_s: float = Field(default=3.0, gt=0)
    # Chroma down is a degraded mode (facts stay pending, reads lose the dense search).
    # true: /readyz fails then, as the readiness contract says; false: it only reports it,
    # for deployments where taking every API replica out of the load balancer is worse.
    unready_when_degraded: bool = True
    # /healthz fails when the consumer loop has not polled for this long (a wedged process).
    loop_stale_s: float = Field(default=300.0, gt=0)
    # Cluster telemetry (freshness, consumer lag, job ages): one process measures per interval.
    telemetry_every_s: float = Field(default=15.0, gt=0)


class MaintenanceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # How often each maintenance job runs in the cluster (one process at a time runs it).
    every_s: float = Field(default=6 * 3600.0, gt=0)
    stale_after_days: float = Field(default=180.0, gt=0)
    archive_after_days: float = Field(default=90.0, gt=0)
    ephemeral_stale_after_days: float = Field(default=14.0, gt=0)
    open_loop_silent_days: float = Field(default=60.0, gt=0)
    open_loop_grace_days: float = Field(default=1.0, ge=0)
    duplicate_threshold: float = Field(default=0.93, gt=0, le=1)
    duplicate_max_facts: int = Field(default=2_000, ge=2)
    context_log_retention_days: float = Field(default=90.0, gt=0)
