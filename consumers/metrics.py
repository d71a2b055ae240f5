"""Prometheus metrics of the consumer runtimes, registered on the registry they are given.

Labels stay low-cardinality: consumer, stage, outcome, backend — never a user or
organization id. `PipelineMetrics` is also the Prometheus implementation of the flush and
index observers (`consumers.observers`), so the flush and index logic never touch a metric
themselves.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from domain.model import RunRecord

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.records = Counter(
            "memoryd_records_total", "Kafka records read", ["consumer"], registry=registry
        )
        self.dead_letters = Counter(
            "memoryd_dead_letters_total",
            "Records sent to the dead-letter topic",
            ["consumer", "stage"],
            registry=registry,
        )
        self.events_logged = Counter(
            "memoryd_events_logged_total",
            "Events inserted into the Postgres log (new ones only)",
            registry=registry,
        )
        self.events_duplicate = Counter(
            "memoryd_events_duplicate_total",
            "Events already present, skipped",
            ["consumer"],
            registry=registry,
        )
        self.events_forgotten = Counter(
            "memoryd_events_forgotten_total",
            "Events of an erased memory recorded before its tombstone, dropped (not dead-lettered)",
            ["consumer"],
            registry=registry,
        )
        self.flushes = Counter(
            "memoryd_flushes_total",
            "Per-user consolidation flushes by outcome",
            ["outcome"],
            registry=registry,
        )
        self.flush_seconds = Histogram(
            "memoryd_flush_seconds",
            "Duration of one user's flush",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.events_consolidated = Counter(
            "memoryd_events_consolidated_total",
            "Events consolidated into memory",
            registry=registry,
        )
        self.backend_retries = Counter(
            "memoryd_backend_retries_total",
            "Transient backend failures that were retried",
            ["backend"],
            registry=registry,
        )
        self.split_probes = Counter(
            "memoryd_split_probes_total",
            "Backend calls bisecting a batch the model could not answer, by their answer",
            ["outcome"],
            registry=registry,
        )
        self.gate_verdicts = Counter(
            "memoryd_gate_verdicts_total", "Write-gate verdicts", ["verdict"], registry=registry
        )
        self.tokens = Counter(
            "memoryd_llm_tokens_total", "LLM tokens used", ["backend", "kind"], registry=registry
        )
        self.cost = Counter(
            "memoryd_cost_micro_usd_total",
            "Cost booked to the ledger",
            ["operation"],
            registry=registry,
        )
        self.index_failures = Counter(
            "memoryd_index_failures_total",
            "Vector index writes that failed (facts stay pending)",
            registry=registry,
        )
        self.facts_indexed = Counter(
            "memoryd_facts_indexed_total",
            "Fact versions written to the vector index",
            registry=registry,
        )
        self.buffered = Gauge(
            "memoryd_buffered_events",
            "Events buffered in memory, not yet consolidated",
            registry=registry,
        )
        self.in_flight = Gauge(
            "memoryd_flushes_in_flight", "User flushes running now", registry=registry
        )
        self.pending_index = Gauge(
            "memoryd_facts_pending_index", "Facts not yet in the vector index", registry=registry
        )
        self.commit_failures = Counter(
            "memoryd_commit_failures_total",
            "Offset commits that failed (the records are read again, harmlessly)",
            ["consumer"],
            registry=registry,
        )
        self.degraded = Gauge(
            "memoryd_consumer_degraded",
            "1 while the consumer retries an outage (database, broker, dead-letter topic)",
            ["consumer"],
            registry=registry,
        )
        self.outage_retries = Counter(
            "memoryd_outage_retries_total",
            "Retries of work that failed because a dependency was away, by cause",
            ["consumer", "cause"],
            registry=registry,
        )
        self.budget_actions = Counter(
            "memoryd_budget_actions_total",
            "Flushes of users out of credit, by the budget policy applied",
            ["policy"],
            registry=registry,
        )
        self.commit_lag = Gauge(
            "memoryd_uncommitted_records",
            "Records read but not yet committed",
            ["consumer"],
            registry=registry,
        )

    # -- consumers.observers.FlushObserver ------------------------------------------------

    def flushed(self, backend: str, seconds: float) -> None:
        self.flush_seconds.labels(backend).observe(seconds)

    def consolidated(self, run: RunRecord) -> None:
        self.events_consolidated.inc(len(run.input_event_ids))
        self.charged(run)
        for verdict, count in (
            ("allow", run.gate.allowed),
            ("hold", run.gate.held),
            ("discard", run.gate.discarded),
            ("reinforce", run.gate.reinforced),
        ):
            self.gate_verdicts.labels(verdict).inc(count)

    def budget_applied(self, policy: str) -> None:
        self.budget_actions.labels(policy).inc()

    def charged(self, run: RunRecord) -> None:
        self.tokens.labels(run.backend, "prompt").inc(run.usage.prompt_tokens)
        self.tokens.labels(run.backend, "completion").inc(run.usage.completion_tokens)
        self.cost.labels("llm").inc(run.cost_micro_usd)

    def probed(self, *, usable: bool) -> None:
        self.split_probes.labels("usable" if usable else "unusable").inc()

    # -- consumers.observers.IndexObserver ------------------------------------------------

    def indexed(self, embedded: int, cost_micro_usd: int) -> None:
        self.facts_indexed.inc(embedded)
        self.cost.labels("embedding").inc(cost_micro_usd)

    def index_failed(self, facts: int) -> None:
        self.index_failures.inc()

    def pending(self, facts: int) -> None:
        self.pending_index.set(facts)
