"""memoryd on the real Kafka, Postgres and Chroma the fixtures start: a deployment per test,
processors in threads, the Gemini SDK against a fake server, topic and dead-letter reading."""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.partitioner.default import murmur2
from prometheus_client import CollectorRegistry
from psycopg.conninfo import conninfo_to_dict

from consumers.processor import MemoryProcessor
from consumers.settings import ProcessorSettings
from domain.ids import MemoryKey
from domain.model import Fact, MemoryUpdate
from memoryd import wiring
from memoryd.analyst.dead_letters import read_dead_letters
from memoryd.settings import (
    ChromaSettings,
    KafkaSettings,
    MetricsSettings,
    PostgresSettings,
    Settings,
)
from processors.schema import ConsolidationBackend
from producers.contract import ContextEvent, memory_kafka_key
from store.write.locks import memory_lock_key, pg_locks_tag
from tests.support.builders import seed

with warnings.catch_warnings():
    # google-genai 3.3.0 has an invalid escape in a docstring; see tests/unit/test_gemini_backend.
    warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
    warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
    from processors.llm.gemini import GeminiBackend, make_gemini_client


@dataclass
class Deployment:
    settings: Settings
    dsn: str

    def publish(self, events: Sequence[ContextEvent]) -> None:
        with closing(wiring.publisher(self.settings)) as pub:
            pub.publish(events)

    def produce_raw(self, values: Sequence[bytes], key: bytes = b"raw") -> None:
        from kafka import KafkaProducer  # noqa: PLC0415

        producer = KafkaProducer(
            bootstrap_servers=self.settings.kafka.bootstrap_servers, acks="all"
        )
        try:
            for value in values:
                producer.send(self.settings.kafka.topic, key=key, value=value)
            producer.flush(timeout=30)
        finally:
            producer.close()

    def run_log_writer(self, idle_s: float = 2.0) -> int:
        with wiring.core(self.settings) as c:
            return wiring.log_writer(c).drain(idle_s=idle_s)

    def run_processor(
        self, backend: ConsolidationBackend | None = None, idle_s: float = 2.0
    ) -> None:
        with wiring.core(self.settings) as c:
            wiring.processor(c, backend).run_until_idle(idle_s=idle_s)

    def run_both(self, backend: ConsolidationBackend | None = None) -> None:
        writer = threading.Thread(target=self.run_log_writer, daemon=True)
        writer.start()
        self.run_processor(backend)
        writer.join(timeout=120)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(sql, params).fetchall()

    def with_core(self, fn: Callable[[wiring.Core], Any]) -> Any:
        with wiring.core(self.settings) as c:
            return fn(c)

    def processor(
        self, c: wiring.Core, backend: ConsolidationBackend | None = None
    ) -> MemoryProcessor:
        return wiring.processor(c, backend)


def deployment_settings(
    bootstrap: str, dsn: str, topic: str, dlq: str, chroma_path: Path, **tuning: Any
) -> Settings:
    run = uuid.uuid4().hex[:8]
    return Settings(
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic=topic,
            dead_letter_topic=dlq,
            partitions=3,
            log_writer_group=f"log-{run}",
            processor_group=f"proc-{run}",
            session_timeout_ms=10_000,
        ),
        postgres=PostgresSettings(dsn=dsn),
        chroma=ChromaSettings(mode="embedded", path=chroma_path),
        processor=ProcessorSettings(
            **{"max_batch": 10, "max_wait_s": 0.5, "concurrency": 4, **tuning}
        ),
        metrics=MetricsSettings(enabled=False),
    )


def dead_letters(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[Any]:
    """Read `expected` records from the dead-letter topic (from the beginning)."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",  # letters are written in transactions
        group_id=f"dlq-reader-{uuid.uuid4().hex[:8]}",
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


@contextmanager
def gemini_backend(url: str, timeout_ms: int = 10_000) -> Iterator[GeminiBackend]:
    """The real google-genai SDK pointed at a (fake) server; its HTTP client closed after."""
    with make_gemini_client("test-key", url, timeout_ms) as client:
        yield GeminiBackend(client)


def topic_size(bootstrap: str, topic: str) -> int:
    """How many records a topic holds (sum of its partitions' end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


def letter_count(bootstrap: str, topic: str) -> int:
    """How many committed letters a dead-letter topic holds (its end offsets would count the
    markers of the transactions that wrote them too)."""
    return len(read_dead_letters(bootstrap, topic))


def end_advisory_lock_session(superuser_dsn: str, dbname: str, classid: int, objid: int) -> None:
    """End the session holding the advisory lock (`classid`, `objid`) in `dbname`, as a
    pooler restart would: the process that took it goes on through its other connections."""
    with psycopg.connect(superuser_dsn, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT pg_terminate_backend(l.pid, 10000) FROM pg_locks l"
            " JOIN pg_database d ON d.oid = l.database WHERE l.locktype = 'advisory'"
            " AND l.granted AND d.datname = %s AND l.classid::bigint = %s"
            " AND l.objid::bigint = %s",
            (dbname, classid, objid),
        ).fetchall()
    assert ended == [(True,)]


def end_lock_session_in(superuser_dsn: str, dsn: str, lock: int) -> None:
    """End the session that holds the bigint advisory lock `lock` in `dsn`'s database, as a
    dropped connection would."""
    dbname = conninfo_to_dict(dsn)["dbname"]
    end_advisory_lock_session(superuser_dsn, dbname, *pg_locks_tag(lock))


def end_memory_lock_session(superuser_dsn: str, dsn: str, key: MemoryKey) -> None:
    """End the session that holds `key`'s memory lock in `dsn`'s database."""
    end_lock_session_in(superuser_dsn, dsn, memory_lock_key(key))


def limit_message_bytes(admin: Any, topic: str, limit: int) -> None:
    """Give a topic this max.message.bytes, and wait until its broker applies it."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})
    assert admin.alter_configs([resource]) == {"topic": {topic: "OK"}}
    # The controller took it; the broker applies it from the metadata log a moment later.
    wait_until(lambda: max_message_bytes(admin, topic) == str(limit), 10, "the limit applied")


def max_message_bytes(admin: Any, topic: str) -> str:
    """The topic's max.message.bytes as its broker describes it. A topic created a moment ago
    is described without its configs until the broker has applied it from the metadata log:
    waited for."""
    found: list[str] = []

    def described() -> bool:
        answer = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
        )
        config = answer.get("topic", {}).get(topic, {}).get("max.message.bytes")
        if config is not None:
            found.append(str(config["value"]))
        return config is not None

    wait_until(described, 10, f"the broker to describe {topic}'s configs")
    return found[-1]


def committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    """The group's committed offset of a partition (None: none committed)."""
    consumer: Any = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    try:
        offset = consumer.committed(tp)
        return None if offset is None else int(offset)
    finally:
        consumer.close()


def headers_of(record: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def tuned(deployment: Deployment, **tuning: Any) -> Deployment:
    """The same deployment (database, topics) with other processor tuning."""
    processor = deployment.settings.processor.model_copy(update=tuning)
    settings = deployment.settings.model_copy(update={"processor": processor})
    return Deployment(settings, deployment.dsn)


def on_chroma_server(deployment: Deployment, url: str) -> Deployment:
    """The same deployment (database, topics) with its vectors on the Chroma server at url
    (one the test may stop) instead of an embedded one, in a collection of its own."""
    chroma = ChromaSettings(mode="http", url=url, collection=f"facts-{uuid.uuid4().hex[:12]}")
    return Deployment(deployment.settings.model_copy(update={"chroma": chroma}), deployment.dsn)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


class ProcessorThread:
    """A processor with its own core (like a separate process) running in a thread."""

    def __init__(self, settings: Settings, backend: ConsolidationBackend) -> None:
        self._settings = settings
        self._backend = backend
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.processor: MemoryProcessor | None = None
        self.registry: CollectorRegistry | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ProcessorThread:
        self._thread.start()
        if not self._ready.wait(timeout=60) or self.processor is None:
            raise AssertionError(f"processor did not start: {self.error!r}")
        return self

    def assignment(self) -> set[int]:
        """Partitions this processor owns now."""
        assert self.processor is not None
        return {tp.partition for tp in self.processor.assignment()}

    def buffered(self) -> int:
        """Events buffered, not yet in a flush (the processor's gauge)."""
        assert self.registry is not None
        value = self.registry.get_sample_value("memoryd_buffered_events")
        return int(value or 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
        assert not self._thread.is_alive(), "processor did not stop"
        if self.error is not None:
            raise AssertionError(f"processor failed: {self.error!r}") from self.error

    def _run(self) -> None:
        try:
            with wiring.core(self._settings) as c:
                self.processor = wiring.processor(c, self._backend)
                self.registry = c.registry
                self._ready.set()
                self.processor.run(self._stop)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self._ready.set()


def partition_of(user_id: str, partitions: int, org: str = "org-a") -> int:
    """The partition kafka-python's default partitioner sends a memory's events to (the key
    is the organization and the user)."""
    return (murmur2(memory_kafka_key(org, user_id)) & 0x7FFFFFFF) % partitions


def users_per_partition(prefix: str, partitions: int, per_partition: int) -> list[str]:
    """User ids (of org-a) chosen so every partition holds `per_partition` of them."""
    chosen: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(v) < per_partition for v in chosen.values()):
        user = f"{prefix}{n}"
        bucket = chosen[partition_of(user, partitions)]
        if len(bucket) < per_partition:
            bucket.append(user)
        n += 1
    return [u for p in range(partitions) for u in chosen[p]]


def seed_core(
    c: wiring.Core, user_id: str, facts: Sequence[Fact], *, index: bool = True, **kw: Any
) -> MemoryUpdate:
    """Memory seeded through the real store (`builders.seed`), indexed like the processor
    indexes a finished run."""
    update = seed(c.memory, user_id, facts, **kw)
    if index:
        wiring.indexer(c).index_changes(update)
    return update
