"""A memoryd deployment per test: fresh database, fresh topics, its own Chroma directory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from psycopg_pool import ConnectionPool

from memoryd.dev import LocalKafka
from store.migrate import migrate
from store.postgres import make_pool
from tests.support.chroma import DisposableChroma
from tests.support.deployment import Deployment, deployment_settings
from tests.support.services import local_kafka, start, started


@pytest.fixture
def deployment(
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    fresh_database: str,
    tmp_path: Path,
) -> Iterator[Deployment]:
    topic = kafka_topic_factory(partitions=3, prefix="events")
    dlq = kafka_topic_factory(partitions=3, prefix="dlq")
    pool = make_pool(fresh_database, max_size=2)
    try:
        migrate(pool)
    finally:
        pool.close()
    settings = deployment_settings(kafka_bootstrap, fresh_database, topic, dlq, tmp_path / "chroma")
    return Deployment(settings, fresh_database)


@pytest.fixture
def migrated_pool(fresh_database: str) -> Iterator[ConnectionPool]:
    """A small pool on a fresh database with every migration applied."""
    pool = make_pool(fresh_database, max_size=2)
    try:
        migrate(pool)
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def _shared_disposable_chroma(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DisposableChroma]:
    # Started here, where a port taken before the server binds it is retried with another;
    # a test that stops it has `stoppable_chroma` start it again, on the same port.
    home = tmp_path_factory.mktemp("disposable-chroma")
    server = start(lambda: DisposableChroma(home), 60.0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stoppable_chroma(_shared_disposable_chroma: DisposableChroma) -> DisposableChroma:
    """A running Chroma server the test may stop and start again, shared by the tests that
    ask for it (a start takes seconds): give each deployment a collection of its own."""
    if not _shared_disposable_chroma.running:
        _shared_disposable_chroma.start()
    return _shared_disposable_chroma


@pytest.fixture
def own_chroma(tmp_path: Path) -> Iterator[DisposableChroma]:
    with started(lambda: DisposableChroma(tmp_path), 60.0) as server:
        yield server


@pytest.fixture
def own_kafka(tmp_path: Path) -> Iterator[LocalKafka]:
    """A broker of the test's own, which it may stop and start again (on the same ports)."""
    with started(lambda: local_kafka(tmp_path / "kafka"), 180.0) as broker:
        yield broker
