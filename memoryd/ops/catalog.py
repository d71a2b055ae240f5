"""Which metric families each process exports: what the runtime registers, in one place.

The dashboard and alert test (tests/unit/test_dashboard_metrics.py) builds every component's
registry from here, and checks that no metric defined anywhere in the code is missing here.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from consumers.metrics import PipelineMetrics
from memoryd.api.metrics import HttpMetrics
from memoryd.ops.metrics import (
    HealthMetrics,
    MaintenanceMetrics,
    PriceMetrics,
    TelemetryMetrics,
    runtime_registry,
)
from store.read.read_metrics import ReadPathMetrics

Register = Callable[[CollectorRegistry], object]

# wiring.core: PipelineMetrics, PriceMetrics; ops.runtime.ops_port: HealthMetrics; the processor
# runs the cluster jobs; the API's read path and HTTP middleware.
COMPONENTS: dict[str, tuple[Register, ...]] = {
    "log_writer": (PipelineMetrics, PriceMetrics, HealthMetrics),
    "processor": (
        PipelineMetrics,
        PriceMetrics,
        HealthMetrics,
        lambda r: TelemetryMetrics(r, expire_s=60.0),
        MaintenanceMetrics,
    ),
    "api": (PipelineMetrics, PriceMetrics, HealthMetrics, ReadPathMetrics, HttpMetrics),
}


def component_registry(component: str) -> CollectorRegistry:
    registry = runtime_registry()
    for register in COMPONENTS[component]:
        register(registry)
    return registry
