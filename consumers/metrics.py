"""Prometheus metrics of the consumer runtimes, registered on the registry they are given.

Labels stay low-cardinality: consumer, stage, cause, outcome, backend — never a user or
organization id, never free text. `PipelineMetrics` is also the Prometheus implementation of
the flush and index observers (`consumers.observers`), so the flush and index logic never
touch a metric themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from consumers.dead_letter import CAUSES
from domain.model import RunRecord

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class PipelineMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        counter = partial(Counter, registry=registry)
        gauge = partial(Gauge, registry=registry)
        histogram = partial(Histogram, registry=registry)
        self.records = counter("memoryd_records_total", "Kafka records read", ["consumer"])
        self.dead_letters = counter(
            "memoryd_dead_letters_total",
            "Records sent to the dead-letter topic, by stage and the cause's class",
            ["consumer", "stage", "cause"],
        )
        self.events_logged = counter(
            "memoryd_events_logged_total", "Events inserted into the Postgres log (new ones only)"
        )
        self.events_duplicate = counter(
            "memoryd_events_duplicate_total", "Events already present, skipped", ["consumer"]
        )
        self.events_forgotten = counter(
            "memoryd_events_forgotten_total",
            "Events an erasure forgot, dropped (not dead-lettered): of an erased memory before"
            " its tombstone, or redacted in the log by a fact erasure",
            ["consumer"],
        )
        self.flushes = counter(
            "memoryd_flushes_total", "Per-user consolidation flushes by outcome", ["outcome"]
        )
        self.flush_seconds = histogram(
            "memoryd_flush_seconds",
            "Duration of one user's flush",
            ["backend"],
            buckets=LATENCY_BUCKETS,
        )
        self.events_consolidated = counter(
            "memoryd_events_consolidated_total", "Events consolidated into memory"
        )
        self.backend_retries = counter(
            "memoryd_backend_retries_total",
            "Transient backend failures that were retried",
            ["backend"],
        )
        self.split_probes = counter(
            "memoryd_split_probes_total",
            "Backend calls bisecting a batch the model could not answer, by their answer",
            ["outcome"],
        )
        self.gate_verdicts = counter(
            "memoryd_gate_verdicts_total", "Write-gate verdicts", ["verdict"]
        )
        self.tokens = counter("memoryd_llm_tokens_total", "LLM tokens used", ["backend", "kind"])
        self.cost = counter(
            "memoryd_cost_micro_usd_total", "Cost booked to the ledger", ["operation"]
        )
        self.index_failures = counter(
            "memoryd_index_failures_total", "Vector index writes that failed (facts stay pending)"
        )
        self.index_write_holds = counter(
            "memoryd_index_write_holds_total",
            "Index writes held back while flushes were at work, by what let them start",
            ["released_by"],
        )
        self.facts_indexed = counter(
            "memoryd_facts_indexed_total", "Fact versions written to the vector index"
        )
        self.buffered = gauge(
            "memoryd_buffered_events",
            "Events held in memory (buffered, in flight, waiting for a retry), not consolidated",
        )
        self.in_flight = gauge("memoryd_flushes_in_flight", "User flushes running now")
        self.pending_index = gauge(
            "memoryd_facts_pending_index",
            "Facts not yet in the vector index (not those held back for users out of credit)",
        )
        self.pending_index_oldest = gauge(
            "memoryd_facts_pending_index_oldest_seconds",
            "Age of the oldest change not yet in the vector index (not of facts held back"
            " for users out of credit); 0 when none waits",
        )
        self.commit_failures = counter(
            "memoryd_commit_failures_total",
            "Offset commits that failed (the records are read again, harmlessly)",
            ["consumer"],
        )
        self.degraded = gauge(
            "memoryd_consumer_degraded",
            "1 while the consumer retries an outage (database, broker, dead-letter topic)",
            ["consumer"],
        )
        self.outage_retries = counter(
            "memoryd_outage_retries_total",
            "Retries of work that failed because a dependency was away, by cause",
            ["consumer", "cause"],
        )
        self.budget_actions = counter(
            "memoryd_budget_actions_total",
            "Flushes of users out of credit, by the budget policy applied",
            ["policy"],
        )
        self.commit_lag = gauge(
            "memoryd_uncommitted_records", "Records read but not yet committed", ["consumer"]
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

    def expect(
        self,
        consumer: str,
        stages: Iterable[str],
        budget_policy: str | None = None,
        flush_outcomes: Iterable[str] = (),
    ) -> None:
        """Start the series alerts watch at 0 (the consumer's dead letters and commit
        failures, its budget policy's actions, its flush outcomes): an alert on their
        increase misses a series born at 1, the first bad record or failed flush."""
        for stage in stages:
            for cause in CAUSES[stage]:
                self.dead_letters.labels(consumer, stage, cause)
        self.commit_failures.labels(consumer)
        if budget_policy is not None:
            self.budget_actions.labels(budget_policy)
        for outcome in flush_outcomes:
            self.flushes.labels(outcome)

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

    def index_write_held(self, released_by: str) -> None:
        self.index_write_holds.labels(released_by).inc()

    def pending(self, facts: int, oldest_s: float) -> None:
        self.pending_index.set(facts)
        self.pending_index_oldest.set(oldest_s)
