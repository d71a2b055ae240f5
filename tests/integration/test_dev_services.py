"""The service fixtures hand out real, working Kafka, Postgres and Chroma servers.

These tests pin down the properties the rest of the suite relies on: records round-trip through
Kafka, topics are never auto-created, each test can get an isolated database, Chroma's HTTP API
stores and queries vectors we embed ourselves, and the local launchers are idempotent.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import chromadb
import httpx
import psycopg
import pytest
from chromadb.config import Settings
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from memoryd.dev import LocalChroma, LocalKafka, LocalPostgres, free_port
from memoryd.dev._process import port_open
from memoryd.dev.chroma import heartbeat
from memoryd.dev.kafka import kafka_ready
from memoryd.dev.postgres import find_bin_dir
from tests.support.chroma import DisposableChroma
from tests.support.services import local_kafka, running, started

pytestmark = pytest.mark.integration


def test_kafka_round_trips_a_record(
    kafka_bootstrap: str, kafka_topic_factory: Callable[..., str]
) -> None:
    topic = kafka_topic_factory(partitions=3)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    try:
        sent = producer.send(topic, key=b"agent-1", value=b"hello").get(timeout=30)
    finally:
        producer.close()

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, sent.partition)])
        consumer.seek_to_beginning()
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=1000).values():
                records.extend(batch)
    finally:
        consumer.close()

    assert [(r.key, r.value, r.offset) for r in records] == [(b"agent-1", b"hello", sent.offset)]


def test_kafka_topic_factory_creates_requested_partitions(
    kafka_admin: KafkaAdminClient, kafka_topic_factory: Callable[..., str]
) -> None:
    topic = kafka_topic_factory(partitions=4)
    (described,) = kafka_admin.describe_topics([topic])
    assert len(described["partitions"]) == 4


def test_kafka_does_not_auto_create_topics(
    kafka_bootstrap: str, kafka_admin: KafkaAdminClient
) -> None:
    unknown = "never-created-topic"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_block_ms=2000)
    try:
        with pytest.raises(KafkaTimeoutError):
            producer.send(unknown, b"lost").get(timeout=10)
    finally:
        producer.close()
    assert unknown not in kafka_admin.list_topics()


def test_postgres_answers(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_fresh_database_is_isolated(postgres_dsn: str, fresh_database: str) -> None:
    with psycopg.connect(fresh_database) as conn:
        fresh_name = conn.execute("SELECT current_database()").fetchone()
        conn.execute("CREATE TABLE only_here (id int)")
        conn.execute("INSERT INTO only_here VALUES (1)")
        conn.commit()
        assert conn.execute("SELECT count(*) FROM only_here").fetchone() == (1,)
    with psycopg.connect(postgres_dsn) as conn:
        assert conn.execute("SELECT current_database()").fetchone() != fresh_name
        assert conn.execute("SELECT to_regclass('only_here')").fetchone() == (None,)


def test_chroma_heartbeat_and_vectors(chroma_url: str) -> None:
    heartbeat = httpx.get(f"{chroma_url}/api/v2/heartbeat", timeout=5, trust_env=False)
    assert heartbeat.status_code == 200
    assert "nanosecond heartbeat" in heartbeat.json()

    url = urlsplit(chroma_url)
    assert url.hostname is not None
    assert url.port is not None
    client = chromadb.HttpClient(
        host=url.hostname, port=url.port, settings=Settings(anonymized_telemetry=False)
    )
    # embedding_function=None: we always pass vectors; the default one would fetch a model.
    collection = client.create_collection(
        f"test-{uuid.uuid4().hex[:12]}", embedding_function=None, metadata={"hnsw:space": "cosine"}
    )
    vectors: list[Sequence[float]] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    query: list[Sequence[float]] = [[0.9, 0.1, 0.0]]
    collection.add(
        ids=["a", "b"],
        embeddings=vectors,
        documents=["about a", "about b"],
    )
    found = collection.query(query_embeddings=query, n_results=1)
    assert found["ids"] == [["a"]]
    assert collection.count() == 2


def test_local_postgres_start_is_idempotent(postgres_home: Path) -> None:
    try:
        find_bin_dir()
    except RuntimeError as exc:
        pytest.skip(f"no local PostgreSQL binaries: {exc}")
    with started(
        lambda: LocalPostgres(postgres_home, free_port(), for_tests=True, stop_on_exit=True), 60.0
    ) as postgres:
        again = postgres.start()
        assert again == postgres.dsn
        assert postgres.is_running()
        with psycopg.connect(again) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("memoryd",)
    assert not postgres.is_running()
    postgres.stop()  # stopping a stopped server is a no-op


def test_local_chroma_start_is_idempotent(tmp_path: Path) -> None:
    home = tmp_path / "chroma"
    with started(lambda: LocalChroma(home, free_port(), stop_on_exit=True), 60.0) as chroma:
        assert chroma.start() == chroma.url
        assert chroma.is_running()
    assert not chroma.is_running()
    chroma.stop()


def test_local_chroma_started_again_on_another_port_moves_there(tmp_path: Path) -> None:
    def chroma() -> LocalChroma:
        return LocalChroma(tmp_path / "chroma", free_port(), stop_on_exit=True)

    with started(chroma, 60.0) as before, started(chroma, 30.0) as after:
        assert after.port != before.port  # free_port() never hands a port out twice
        assert heartbeat(after.url)
        assert not heartbeat(before.url)


def test_local_kafka_started_again_on_other_ports_moves_there(tmp_path: Path) -> None:
    def kafka() -> LocalKafka:
        return local_kafka(tmp_path / "kafka")

    with started(kafka, 180.0) as before, started(kafka, 60.0) as after:
        assert kafka_ready(after.bootstrap)
        assert not port_open("127.0.0.1", before.port)


@contextmanager
def _taken_port() -> Iterator[int]:
    """A port bound but not listening: free to the look before a start, taken for the server's
    own bind, as is a port another run takes in between."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_chroma_whose_port_is_taken_is_started_on_another(tmp_path: Path) -> None:
    with _taken_port() as taken:
        ports = iter([taken, free_port()])
        with running(
            lambda: LocalChroma(tmp_path / "chroma", next(ports), stop_on_exit=True), 60.0
        ) as url:
            assert urlsplit(url).port != taken
            assert heartbeat(url)
    assert not heartbeat(url)


def test_postgres_whose_port_is_taken_is_started_on_another(postgres_home: Path) -> None:
    with _taken_port() as taken:
        ports = iter([taken, free_port()])
        with running(
            lambda: LocalPostgres(postgres_home, next(ports), for_tests=True, stop_on_exit=True),
            60.0,
        ) as dsn:
            assert urlsplit(dsn).port != taken
            with psycopg.connect(dsn) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not port_open("127.0.0.1", urlsplit(dsn).port or 0)


@contextmanager
def _listening_port() -> Iterator[int]:
    """A port another process listens on: taken already when a start looks."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_kafka_whose_port_is_taken_is_started_on_another(tmp_path: Path) -> None:
    with _listening_port() as taken:
        ports = iter([(taken, free_port()), (free_port(), free_port())])

        def kafka() -> LocalKafka:
            return local_kafka(tmp_path / "kafka", next(ports))

        with started(kafka, 180.0) as broker:
            assert broker.port != taken
            assert kafka_ready(broker.bootstrap)
    assert not port_open("127.0.0.1", broker.port)


def test_own_chroma_whose_port_is_taken_is_started_on_another(tmp_path: Path) -> None:
    with _taken_port() as taken:
        ports = iter([taken, free_port()])
        with started(lambda: DisposableChroma(tmp_path, next(ports)), 60.0) as chroma:
            assert chroma.port != taken
            chroma.kill()
            assert not heartbeat(chroma.url)
            chroma.start()  # back on the port it had
            assert heartbeat(chroma.url)
    assert not heartbeat(chroma.url)
