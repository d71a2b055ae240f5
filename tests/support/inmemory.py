"""memoryd's consumers and read path assembled over the in-memory adapters, for unit tests:
the same classes the composition root builds, with no Kafka, Postgres or Chroma behind them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from consumers.flush import BudgetPolicy, UserFlusher
from consumers.foreground import ForegroundWork
from consumers.forgetting import ForgottenEvents
from consumers.indexer import FactIndexer, IndexQueue
from consumers.metrics import PipelineMetrics
from consumers.processor import MemoryProcessor
from consumers.settings import ProcessorSettings
from domain.ids import SubjectHasher
from domain.model import Fact
from domain.ports import Embedder, VectorIndex
from processors.consolidate import Consolidator
from processors.cost import PriceTable
from processors.gate import WriteGate
from processors.schema import ConsolidationBackend
from store.inmemory import (
    InMemoryDatabase,
    InMemoryFactSearch,
    InMemoryMemoryStore,
    InMemoryReadModel,
    InMemoryRunLog,
    InMemoryVectorIndex,
)
from store.read.background import BatchWriter, WriterSettings
from store.read.context_service import ContextService, ReadPathObserver
from tests.support.builders import BASE_TIME, seed
from tests.support.fakes import BagOfWordsEmbedder, FakeConsumer, ListDeadLetters, RecordingObserver

TOPIC = "context-events"
# Small waits, so the retry and batching paths run in milliseconds of real time.
FAST = ProcessorSettings(
    max_batch=5, max_wait_s=0.01, backoff_base_s=0.01, backoff_max_s=0.05, revoke_wait_s=5.0
)
QUICK_WRITER = WriterSettings(max_delay_s=0.01, idle_exit_s=0.5)
SUBJECTS = SubjectHasher(b"test-subject-key")


@dataclass
class InMemoryMemoryd:
    now: datetime = BASE_TIME
    db: InMemoryDatabase = field(init=False)
    memory: InMemoryMemoryStore = field(init=False)
    reads: InMemoryReadModel = field(init=False)
    runs: InMemoryRunLog = field(init=False)
    embedder: Embedder = field(default_factory=BagOfWordsEmbedder)
    index: InMemoryVectorIndex = field(init=False)
    observer: RecordingObserver = field(default_factory=RecordingObserver)

    def __post_init__(self) -> None:
        self.db = InMemoryDatabase(clock=self.clock)
        self.memory = InMemoryMemoryStore(self.db)
        self.reads = InMemoryReadModel(self.db)
        self.runs = InMemoryRunLog(self.db)
        self.index = InMemoryVectorIndex(self.embedder)

    def clock(self) -> datetime:
        return self.now

    # -- the write side -------------------------------------------------------------------

    def indexer(self, index: VectorIndex | None = None) -> FactIndexer:
        return FactIndexer(
            self.memory,
            index or self.index,
            PriceTable({}),
            self.embedder.model_name,
            self.observer,
            self.clock,
        )

    def flusher(
        self,
        backend: ConsolidationBackend,
        budget_policy: BudgetPolicy = BudgetPolicy.DEFER,
        index: VectorIndex | None = None,
        gate: WriteGate | None = None,
        index_yield_s: float = 0.0,
        foreground: ForegroundWork | None = None,
        prices: PriceTable | None = None,
    ) -> UserFlusher:
        """`index_yield_s`: 0 unless a test is about it, so that closing does not wait.
        `prices`: none (every call free) unless a test is about what calls cost."""
        return UserFlusher(
            self.memory,
            backend,
            Consolidator(gate or WriteGate(None), prices or PriceTable({})),
            IndexQueue(
                self.indexer(index),
                self.observer,
                foreground=foreground,
                yield_s=index_yield_s,
            ),
            self.observer,
            self.clock,
            InMemoryFactSearch.of(self.db),
            ForgottenEvents(self.memory, SUBJECTS),
            budget_policy,
        )

    def processor(
        self,
        consumer: FakeConsumer,
        backend: ConsolidationBackend,
        dead_letters: ListDeadLetters,
        settings: ProcessorSettings = FAST,
    ) -> MemoryProcessor:
        return MemoryProcessor(
            consumer,
            TOPIC,
            self.flusher(backend, settings.budget_policy),
            dead_letters,
            PipelineMetrics(CollectorRegistry()),
            settings,
        )

    # -- the read side --------------------------------------------------------------------

    def seed(self, user_id: str, facts: list[Fact], *, index: bool = True, **kw: Any) -> None:
        update = seed(self.memory, user_id, facts, **kw)
        if index:
            self.indexer().index_changes(update)

    def context_service(
        self, index: VectorIndex | None = None, observer: ReadPathObserver | None = None
    ) -> ContextService:
        return ContextService(
            self.reads,
            index or self.index,
            self.clock,
            audit=BatchWriter("context-log", self.reads.write_context_logs, QUICK_WRITER),
            observer=observer,
        )


def step_until(
    processor: MemoryProcessor, done: Callable[[], bool], timeout_s: float = 20.0
) -> None:
    """Run the processor's loop (already started) until `done()`, or fail the test."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s:.0f}s")
        processor.step()
        time.sleep(0.002)
