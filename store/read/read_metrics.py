"""Prometheus metrics of the read path, registered on the registry they are given; the
Prometheus `ReadPathObserver` of the context service and the background writers' hooks.

Labels stay low-cardinality: budget, stage, outcome, writer — never a user id or a query.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from store.read.background import DROP_REASONS
from store.read.bundle import ContextBundle
from store.read.query_rewrite import RewriteOutcome

# 0.3: MemorydReadPathSlow's threshold, which histogram_quantile can only tell at a bound.
READ_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.3, 0.5, 1.0, 2.5)


class ReadPathMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        counter = partial(Counter, registry=registry)
        histogram = partial(Histogram, registry=registry)
        self.assemble_seconds = histogram(
            "memoryd_context_assemble_seconds",
            "Time to assemble one turn's context",
            ["budget", "degraded"],
            buckets=READ_BUCKETS,
        )
        self.stage_seconds = histogram(
            "memoryd_context_stage_seconds",
            "Time spent in each stage of the read path",
            ["stage"],
            buckets=READ_BUCKETS,
        )
        self.injection_cache = counter(
            "memoryd_injection_cache_total",
            "Injection reads served from the in-process cache (hit) or Postgres (miss)",
            ["outcome"],
        )
        self.rewrites = counter(
            "memoryd_query_rewrites_total",
            "Query rewrites by outcome (rewritten, timeout, failed)",
            ["outcome"],
        )
        self.writer_written = counter(
            "memoryd_background_written_total",
            "Items written by the read path's background writers",
            ["writer"],
        )
        self.writer_dropped = counter(
            "memoryd_background_dropped_total",
            "Items the read path's background writers gave up (writer closed, shutdown)",
            ["writer", "reason"],
        )
        self.writer_pending = partial(Gauge, registry=registry)(
            "memoryd_background_pending",
            "Items submitted to the read path's background writers, not yet written",
            ["writer"],
        )

    def writer_hooks(self, writer: str) -> dict[str, Any]:
        """The callbacks of the background writer named `writer` (`BatchWriter`'s keyword
        arguments). Its drop counts start at 0: an alert on their increase misses a series
        born at n."""
        for reason in DROP_REASONS:
            self.writer_dropped.labels(writer, reason)
        return {"on_dropped": self.dropped, "on_written": self.written, "on_pending": self.pending}

    def pending(self, writer: str, n: int) -> None:
        self.writer_pending.labels(writer).set(n)

    def dropped(self, writer: str, reason: str, n: int) -> None:
        self.writer_dropped.labels(writer, reason).inc(n)

    def written(self, writer: str, n: int) -> None:
        self.writer_written.labels(writer).inc(n)

    def assembled(
        self, bundle: ContextBundle, cache_hit: bool, rewrite: RewriteOutcome | None
    ) -> None:
        self.assemble_seconds.labels(bundle.budget.value, str(bundle.degraded).lower()).observe(
            bundle.latency_ms / 1000
        )
        for stage, ms in bundle.timings_ms.items():
            self.stage_seconds.labels(stage).observe(ms / 1000)
        self.injection_cache.labels("hit" if cache_hit else "miss").inc()
        if rewrite is not None:
            self.rewrites.labels(rewrite.value).inc()


def given_up(registry: CollectorRegistry) -> float:
    """How many items the read path's background writers gave up in this process."""
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "memoryd_background_dropped"
        for sample in family.samples
        if sample.name.endswith("_total")
    )
