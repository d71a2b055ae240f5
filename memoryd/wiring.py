"""The composition root: every component is built here from `Settings`, nowhere else."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from chromadb.api import ClientAPI
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from psycopg_pool import ConnectionPool

from consumers.dead_letter import KafkaDeadLetterSink
from consumers.flush import UserFlusher
from consumers.forgetting import ForgottenEvents
from consumers.index_check import IndexChecker
from consumers.indexer import FactIndexer, IndexQueue
from consumers.kafka_client import ConsumerSettings, end_offsets, make_consumer
from consumers.log_writer import LogWriter
from consumers.metrics import PipelineMetrics
from consumers.processor import MemoryProcessor
from domain.ids import MemoryKey, SubjectHasher
from domain.model import LedgerEntry
from domain.ports import Clock
from memoryd.api.cache_sweep import cache_sweeper
from memoryd.erasure import Eraser
from memoryd.ops.health import HealthMonitor
from memoryd.ops.metrics import PriceMetrics, runtime_registry
from memoryd.settings import Settings
from processors.consolidate import Consolidator
from processors.cost import PriceTable, read_entries
from processors.gate import WriteGate
from processors.offline import OfflineBackend
from processors.retraction import RetractingConsolidator, RetractionAwareBackend
from processors.schema import ConsolidationBackend
from producers.publisher import KafkaEventPublisher, ProducerSettings
from store.chroma import ReconnectingIndex, embedded_client, http_client
from store.embedding_cache import CachingEmbedder
from store.embeddings import MiniLmEmbedder
from store.postgres import make_pool
from store.read.background import BatchWriter
from store.read.candidate_search import HybridFactSearch
from store.read.context_service import ContextService
from store.read.dense import DenseSearch
from store.read.dense_reads import DenseReads
from store.read.fact_queries import PostgresReadModel
from store.read.injection import InjectionCache
from store.read.memory_changes import StampWatch, watching
from store.read.memory_entry import DenseCache
from store.read.query_rewrite import TimeBoundRewriter
from store.read.read_ledger import ReadCharge, ReadLedger
from store.read.read_metrics import ReadPathMetrics
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.indexed_facts import PostgresIndexedFacts
from store.write.memory_store import PostgresMemoryStore


def utc_clock() -> datetime:
    return datetime.now(UTC)


@dataclass
class Core:
    """What every process needs: the pool, the stores, the embedder and the index."""

    settings: Settings
    pool: ConnectionPool
    memory: PostgresMemoryStore
    events: PostgresEventLog
    erasures: PostgresErasureLog
    subjects: SubjectHasher
    embedder: CachingEmbedder
    index: ReconnectingIndex
    prices: PriceTable
    registry: CollectorRegistry
    metrics: PipelineMetrics
    clock: Clock
    # One per process, shared by every read path in it: a memory's vectors are fetched once.
    dense_cache: DenseCache


@contextmanager
def core(settings: Settings, clock: Clock = utc_clock) -> Iterator[Core]:
    # Each flush holds a connection for its memory lock and needs another meanwhile, and the
    # read path and the indexer want theirs: size the pool so concurrency is never capped by it.
    pool_size = max(settings.postgres.pool_max_size, 2 * settings.processor.concurrency + 4)
    pool = make_pool(settings.postgres.dsn, max_size=pool_size)
    try:
        model, threads = settings.embedding_model, settings.embedding_threads
        embedder = CachingEmbedder(MiniLmEmbedder(model_name=model, threads=threads))
        chroma = settings.chroma

        def connect() -> ClientAPI:
            if chroma.mode == "http":
                return http_client(chroma.url)
            return embedded_client(chroma.path)

        index = ReconnectingIndex(connect, embedder, chroma.collection)
        registry = runtime_registry()
        prices = price_table(settings, registry, embedder.model_name)
        subjects = SubjectHasher(settings.erasure.subject_key.get_secret_value().encode())
        try:
            yield Core(
                settings=settings,
                pool=pool,
                memory=PostgresMemoryStore(pool),
                events=PostgresEventLog(pool, subjects),
                erasures=PostgresErasureLog(pool),
                subjects=subjects,
                embedder=embedder,
                index=index,
                prices=prices,
                registry=registry,
                metrics=PipelineMetrics(registry),
                clock=clock,
                dense_cache=DenseCache(settings.read_path.dense_cache_mb * 2**20),
            )
        finally:
            index.close()
    finally:
        pool.close()


def models_in_use(settings: Settings, embedding_model: str) -> list[str]:
    models = [embedding_model]
    models.append(settings.llm.model if settings.llm.backend == "gemini" else OfflineBackend.model)
    if settings.read_path.rewrite != "off":
        models.append(settings.read_path.rewrite_model)
    return models


def price_table(
    settings: Settings, registry: CollectorRegistry, embedding_model: str
) -> PriceTable:
    """Refuses to start with a model in use that has no price (unless a default is set)."""
    unpriced = PriceMetrics(registry).unpriced
    table = PriceTable(
        settings.prices, settings.default_price, lambda model: unpriced.labels(model).inc()
    )
    for model in table.require(models_in_use(settings, embedding_model)):
        # At 0 from the start: an alert on the increase misses a series born at 1.
        unpriced.labels(model)
    return table


def publisher(settings: Settings) -> KafkaEventPublisher:
    k = settings.kafka
    producer = ProducerSettings(k.bootstrap_servers, k.topic, k.delivery_timeout_ms)
    return KafkaEventPublisher(replace(producer, max_record_bytes=k.max_record_bytes))


def _consumer(settings: Settings, group: str, client_id: str, max_poll_records: int = 500) -> Any:
    k = settings.kafka
    return make_consumer(
        ConsumerSettings(
            bootstrap_servers=k.bootstrap_servers,
            topic=k.topic,
            group_id=group,
            client_id=client_id,
            max_poll_records=max_poll_records,
            session_timeout_ms=k.session_timeout_ms,
            max_poll_interval_ms=k.max_poll_interval_ms,
            # Kafka's rule of thumb: three heartbeats per session timeout, however short.
            heartbeat_interval_ms=min(3_000, k.session_timeout_ms // 3),
        )
    )


def log_writer(c: Core) -> LogWriter:
    s, k = c.settings, c.settings.kafka
    return LogWriter(
        _consumer(s, k.log_writer_group, "memoryd-log-writer", k.log_writer_max_poll_records),
        k.topic,
        c.events,
        KafkaDeadLetterSink(k.bootstrap_servers, k.dead_letter_topic, "log-writer"),
        c.metrics,
    )


def backend(c: Core) -> ConsolidationBackend:
    llm = c.settings.llm
    if llm.backend == "offline":
        return OfflineBackend(c.embedder)
    from processors.llm.gemini import GeminiBackend, make_gemini_client  # noqa: PLC0415 - optional SDK

    if llm.api_key is None:
        raise ValueError("llm.backend=gemini needs MEMORYD_LLM__API_KEY")
    client = make_gemini_client(llm.api_key.get_secret_value(), llm.base_url, llm.timeout_ms)
    return GeminiBackend(client, llm.model, llm.max_output_tokens, llm.thinking_budget)


def indexer(c: Core) -> FactIndexer:
    return FactIndexer(c.memory, c.index, c.prices, c.embedder.model_name, c.metrics, c.clock)


def indexed_facts(c: Core) -> PostgresIndexedFacts:
    return PostgresIndexedFacts(c.pool)


def index_checker(c: Core) -> IndexChecker:
    return IndexChecker(indexed_facts(c), c.index)


def forgotten_events(c: Core) -> ForgottenEvents:
    return ForgottenEvents(c.memory, c.subjects)


def consolidation(
    c: Core, consolidation_backend: ConsolidationBackend | None = None
) -> tuple[ConsolidationBackend, Consolidator]:
    """The backend and the planner, as live processing and shadow replay must both use them."""
    return (
        # Retractions (a user deleting or correcting a fact) bypass the backend.
        RetractionAwareBackend(consolidation_backend or backend(c)),
        RetractingConsolidator(WriteGate(c.embedder), c.prices),
    )


def candidate_search(c: Core) -> HybridFactSearch:
    """What a flush searches for the facts its batch is about: the read path's retrievers, and
    its memory entries (in this process's `dense_cache`) for memories of many facts."""
    memories = DenseSearch(DenseReads(c.pool), c.index, c.embedder, c.dense_cache)
    return HybridFactSearch(
        c.pool, read_model(c), c.index, c.embedder, vectors=c.embedder, memories=memories
    )


def sweep_candidate_entries(c: Core) -> int:
    """Drop the memory entries of memories erased (or gone) since they were built; an entry a
    run made older stays, for the memory's next flush to bring up to date."""
    return c.dense_cache.sweep(read_model(c).memory_stamps, keep_older_versions=True)


def flusher(
    c: Core, consolidation_backend: ConsolidationBackend, consolidator: Consolidator
) -> UserFlusher:
    """One memory's flush, indexing what it committed in the background."""
    p = c.settings.processor
    return UserFlusher(
        c.memory,
        consolidation_backend,
        consolidator,
        IndexQueue(indexer(c), c.metrics, yield_s=p.index_yield_ms / 1000),
        c.metrics,
        c.clock,
        candidate_search(c),
        forgotten_events(c),
        p.budget_policy,
        candidate_policy=p.candidates,
        max_split_calls=p.max_split_calls,
    )


def processor(
    c: Core, consolidation_backend: ConsolidationBackend | None = None
) -> MemoryProcessor:
    s = c.settings
    # Every flush embeds (the write gate, the candidates): load the model before consuming.
    c.embedder.warm()
    return MemoryProcessor(
        _consumer(s, s.kafka.processor_group, "memoryd-processor"),
        s.kafka.topic,
        flusher(c, *consolidation(c, consolidation_backend)),
        KafkaDeadLetterSink(s.kafka.bootstrap_servers, s.kafka.dead_letter_topic, "processor"),
        c.metrics,
        s.processor,
    )


def read_model(c: Core) -> PostgresReadModel:
    return PostgresReadModel(c.pool, c.subjects)


def query_rewriter(c: Core) -> TimeBoundRewriter | None:
    r = c.settings.read_path
    if r.rewrite == "off":
        return None
    from processors.llm.query_rewrite import gemini_rewriter  # noqa: PLC0415 - optional SDK

    llm = c.settings.llm
    if llm.api_key is None:
        raise ValueError("read_path.rewrite=gemini needs MEMORYD_LLM__API_KEY")
    # The call outlasts the turn's wait, so that one answered late is booked all the same.
    rewrite = gemini_rewriter(
        llm.api_key.get_secret_value(), llm.base_url, r.rewrite_model, r.rewrite_call_timeout_ms
    )
    return TimeBoundRewriter(rewrite, r.rewrite_timeout_ms / 1000)


def context_service(
    c: Core, metrics: ReadPathMetrics | None = None, watch: StampWatch | None = None
) -> ContextService:
    """The read path, with its background writers (audit rows and recalls, costs), which start on
    first use and stop when idle: `close()` the service (or use `read_path`) to write what they
    still hold before the pool goes away."""
    r = c.settings.read_path
    reads = read_model(c)

    def hooks(writer: str) -> dict[str, Any]:
        return metrics.writer_hooks(writer) if metrics else {}

    return ContextService(
        reads,
        c.index,
        c.clock,
        cache=InjectionCache(reads, r.cache_max_users, watch),
        rewriter=query_rewriter(c),
        audit=BatchWriter(
            "context-log", reads.write_context_logs, r.writer, **hooks("context-log")
        ),
        observer=metrics,
        charges=read_charges(c),
        ledger=BatchWriter(
            "read-costs", ReadLedger(c.pool, c.subjects).write, r.writer, **hooks("read-costs")
        ),
        dense=DenseSearch(DenseReads(c.pool), c.index, c.embedder, c.dense_cache),
    )


def read_charges(c: Core) -> Callable[[ReadCharge], list[LedgerEntry]]:
    """Prices a read: its query embedding, and its query rewrite when one answered."""
    rewrite_model = (
        None if c.settings.read_path.rewrite == "off" else c.settings.read_path.rewrite_model
    )

    def charges(charge: ReadCharge) -> list[LedgerEntry]:
        return read_entries(
            c.prices,
            log_id=charge.log_id,
            user_id=charge.user_id,
            organization_id=charge.organization_id,
            at=charge.at,
            embedding_model=c.embedder.model_name if charge.embedded_query else None,
            rewrite_model=rewrite_model,
            rewrite_usage=charge.rewrite_usage,
            rewrite_call=charge.rewrite_call,
        )

    return charges


@contextmanager
def read_path(c: Core, metrics: ReadPathMetrics | None = None) -> Iterator[ContextService]:
    """The read path with its stamp watch listening for memory changes (unless turned off)."""
    r = c.settings.read_path
    with (
        watching(c.settings.postgres.dsn, r.stamp_ttl_s, r.cache_max_users) as watch,
        closing(context_service(c, metrics, watch)) as service,
    ):
        yield service


def eraser(
    c: Core,
    pub: KafkaEventPublisher,
    on_erased: Callable[[MemoryKey], None] = lambda _key: None,
) -> Eraser:
    """Forgetting a memory or a fact; `on_erased` drops what this process caches of it."""
    k = c.settings.kafka
    return Eraser(
        c.erasures,
        c.memory,
        c.index,
        pub.publish_tombstone,
        lambda: end_offsets(k.bootstrap_servers, k.topic),
        c.subjects,
        c.clock,
        on_erased,
    )


@contextmanager
def api_app(c: Core, health: HealthMonitor | None = None) -> Iterator[FastAPI]:
    """The HTTP API over this core, its read path and a Kafka publisher, closed in the server's
    graceful stop (after it, SIGTERM ends the process: nothing after the server runs) and on
    leaving, for a failed start (after SIGINT, that second close does nothing)."""
    from memoryd.api.app import create_app  # noqa: PLC0415 - api process only
    from memoryd.api.auth import TokenTable  # noqa: PLC0415
    from memoryd.api.dependencies import ApiDependencies  # noqa: PLC0415
    from memoryd.api.query_batches import QueryBatches  # noqa: PLC0415

    tokens = TokenTable(c.settings.api.tokens)
    api = c.settings.api
    with (
        closing(publisher(c.settings)) as pub,
        read_path(c, ReadPathMetrics(c.registry)) as service,
    ):
        erase = replace(eraser(c, pub, service.forget), lock_wait_s=api.erasure_lock_wait_s)
        batches = QueryBatches(c.embedder) if c.settings.read_path.rewrite == "off" else None
        deps = ApiDependencies(service, read_model(c), pub, tokens, erase, batches)
        sweeper = cache_sweeper(service, c.settings.read_path.cache_sweep_s)
        try:
            limits = (api.turn_threads, api.max_body_bytes, api.erasure_threads)
            yield create_app(deps, c.registry, (service.close, pub.close), health, *limits)
        finally:
            sweeper.shutdown(wait=False)
