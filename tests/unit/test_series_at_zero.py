"""Counters that alerts take the increase of exist at 0 from the start.

Prometheus' `increase()` sees no increase in a series whose first sample is already 1: a
labelled counter created at its first `inc()` hides the first dead letter, the first unpriced
call, the first dropped audit row. Each label set an alert cares about is created up front.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from consumers.dead_letter import CAUSES, PROCESSOR_STAGES, READ_STAGES
from consumers.log_writer import CONSUMER_NAME as LOG_WRITER
from consumers.log_writer import LogWriter
from consumers.metrics import PipelineMetrics
from consumers.processor import CONSUMER_NAME as PROCESSOR
from consumers.processor import MemoryProcessor
from memoryd import wiring
from memoryd.settings import Settings
from processors.cost import ModelPrice
from store.inmemory.database import InMemoryDatabase
from store.inmemory.logs import InMemoryEventLog
from store.read.background import DROP_REASONS, BatchWriter
from store.read.read_metrics import ReadPathMetrics
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import TOPIC, InMemoryMemoryd


def zeros(
    registry: CollectorRegistry, name: str, label: str, values: Sequence[str], **fixed: str
) -> dict[str, float | None]:
    """The series of `name` with `label` at each of `values` (and `fixed`): None where absent."""
    return {v: registry.get_sample_value(name, {**fixed, label: v}) for v in values}


def test_the_consumers_alerting_series_start_at_zero() -> None:
    registry = CollectorRegistry()
    metrics = PipelineMetrics(registry)
    m = InMemoryMemoryd()
    settings = Settings().processor
    MemoryProcessor(
        FakeConsumer(TOPIC),
        TOPIC,
        m.flusher(FlakyBackend(), settings.budget_policy),
        ListDeadLetters(),
        metrics,
        settings,
    )
    events = InMemoryEventLog(InMemoryDatabase(), str)
    LogWriter(FakeConsumer(TOPIC), TOPIC, events, ListDeadLetters(), metrics)
    letters = "memoryd_dead_letters_total"
    for consumer, stages in [(PROCESSOR, PROCESSOR_STAGES), (LOG_WRITER, READ_STAGES)]:
        for stage in stages:
            causes = CAUSES[stage]
            by_cause = zeros(registry, letters, "cause", causes, consumer=consumer, stage=stage)
            assert by_cause == dict.fromkeys(causes, 0.0)
    policy = settings.budget_policy.value
    assert zeros(registry, "memoryd_budget_actions_total", "policy", [policy]) == {policy: 0.0}
    consumers = [PROCESSOR, LOG_WRITER]
    commits = zeros(registry, "memoryd_commit_failures_total", "consumer", consumers)
    assert commits == dict.fromkeys(consumers, 0.0)
    # Both sides of MemorydFlushFailureRatioHigh.
    outcomes = ["dead_lettered_consolidate", "consolidated", "nothing_new", "forgotten"]
    assert zeros(registry, "memoryd_flushes_total", "outcome", outcomes) == dict.fromkeys(
        outcomes, 0.0
    )


def test_a_background_writers_drop_reasons_start_at_zero() -> None:
    registry = CollectorRegistry()
    hooks = ReadPathMetrics(registry).writer_hooks("context-log")
    BatchWriter("context-log", lambda rows: None, **hooks)
    dropped = "memoryd_background_dropped_total"
    by_reason = zeros(registry, dropped, "reason", DROP_REASONS, writer="context-log")
    assert by_reason == dict.fromkeys(DROP_REASONS, 0.0)


def test_a_model_the_default_price_covers_starts_at_zero() -> None:
    registry = CollectorRegistry()
    settings = Settings(default_price=ModelPrice(input_usd_per_mtok=1.0), prices={})
    wiring.price_table(settings, registry, "all-MiniLM-L6-v2")
    unpriced = "memoryd_unpriced_model_uses_total"
    assert zeros(registry, unpriced, "model", ["all-MiniLM-L6-v2"]) == {"all-MiniLM-L6-v2": 0.0}
