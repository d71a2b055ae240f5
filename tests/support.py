"""Test helpers: events, a memoryd deployment on real services, dead-letter reading."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from kafka import KafkaConsumer

from consumers.processor import MemoryProcessor
from consumers.settings import ProcessorSettings
from memoryd import wiring
from memoryd.settings import (
    ChromaSettings,
    KafkaSettings,
    MetricsSettings,
    PostgresSettings,
    Settings,
)
from processors.schema import ConsolidationBackend
from producers.contract import ContextEvent, EventType, Source, SourceMetadata

BASE_TIME = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def make_event(
    user_id: str,
    content: str,
    event_type: EventType = EventType.FACT,
    *,
    minutes: int = 0,
    org: str = "org-a",
    source: Source = Source.INTERACTIVE,
    connection_id: str | None = None,
    **extra: Any,
) -> ContextEvent:
    meta = {
        k: extra.pop(k)
        for k in ("tool_id", "attachment_id", "filename", "message_id")
        if k in extra
    }
    return ContextEvent(
        event_id=uuid.uuid4(),
        user_id=user_id,
        organization_id=org,
        event_type=event_type,
        content=content,
        source_metadata=SourceMetadata(source=source, connection_id=connection_id, **meta),
        occurred_at=BASE_TIME + timedelta(minutes=minutes),
        **extra,
    )


@dataclass
class Deployment:
    settings: Settings
    dsn: str

    def publish(self, events: Sequence[ContextEvent]) -> None:
        pub = wiring.publisher(self.settings)
        try:
            pub.publish(events)
        finally:
            pub.close()

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
    import time  # noqa: PLC0415

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
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
